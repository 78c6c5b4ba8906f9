"""The harness's ``tests.utils``: the ``RemoteOpenAIServer`` vLLM's API tests start their server
with, here starting the server under test (``VLLM_API_SERVER``: ``stock`` runs ``vllm serve``,
``tokenwire`` runs ``tokenwire serve --engine vllm``) over the same CPU engine and tiny model,
whatever model the test names (it is served under the test's name)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import requests

MODEL_DIR = os.environ["VLLM_API_MODEL"]
LORA_DIR = os.environ["VLLM_API_LORA"]
VLLM = os.environ["VLLM_API_VLLM"]
SERVER = os.environ.get("VLLM_API_SERVER", "stock")
TOKENWIRE = os.environ.get("VLLM_API_TOKENWIRE", "tokenwire")
LOG_DIR = Path(os.environ.get("VLLM_API_LOGS", "."))
START_TIMEOUT = float(os.environ.get("VLLM_API_START_TIMEOUT", "900"))

#: Engine settings the tiny model or the CPU backend need in place of the test's.
_DTYPES = {"float16": "bfloat16", "half": "bfloat16"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _split(args: list[str]) -> list[list[str]]:
    """Arguments grouped as ``[flag, values...]`` (``--flag=value`` kept whole)."""
    groups: list[list[str]] = []
    for a in args:
        if a.startswith("--") or not groups:
            groups.append([a])
        else:
            groups[-1].append(a)
    return groups


def _engine_args(args: list[str]) -> list[str]:
    out: list[str] = []
    for group in _split([str(a) for a in args]):
        flag = group[0].split("=", 1)[0]
        if flag == "--dtype" and len(group) > 1:
            group = [flag, _DTYPES.get(group[1], group[1])]
        if flag == "--lora-modules":
            group = [flag, *(_lora_module(v) for v in group[1:])]
        out += group
    return out


def _lora_module(value: str) -> str:
    """A LoRA module of the test (``name=path`` or JSON) with the tiny model's adapter."""
    if value.startswith("{"):
        module = json.loads(value)
        module["path"] = LORA_DIR
        return json.dumps(module)
    name, _, _ = value.partition("=")
    return f"{name}={LORA_DIR}"


def _tokenwire_flags() -> set[str]:
    out = subprocess.run([TOKENWIRE, "serve", "--help"], capture_output=True, text=True).stdout
    return {w.rstrip(",") for w in out.split() if w.startswith("--")}


_TW_FLAGS: set[str] | None = None


def _tokenwire_args(args: list[str]) -> list[str]:
    """The test's vLLM flags as ``tokenwire serve --engine vllm`` takes them: its own flags as
    they are, the engine's through ``--vllm-arg``."""
    global _TW_FLAGS
    if _TW_FLAGS is None:
        _TW_FLAGS = _tokenwire_flags()
    out: list[str] = []
    for group in _split(args):
        flag = group[0].split("=", 1)[0]
        if flag in _TW_FLAGS and flag not in ("--dtype",):
            out += group
        else:
            out += [f"--vllm-arg={a}" for a in group]
    return out


class RemoteOpenAIServer:
    """Starts the server under test for one test module; stops it (and its engines) at exit."""

    DUMMY_API_KEY = "token-abc123"

    def __init__(
        self,
        model: str,
        vllm_serve_args: list[str],
        *,
        env_dict: dict[str, str] | None = None,
        seed: int | None = 0,
        auto_port: bool = True,
        max_wait_seconds: float | None = None,
        override_hf_configs: dict | None = None,
    ) -> None:
        self.model = model
        self.host = "127.0.0.1"
        self.port = _free_port()
        self.uds = None
        args = _engine_args(list(vllm_serve_args))
        if seed is not None and "--seed" not in args:
            args += ["--seed", str(seed)]
        self.show_hidden_metrics = any(
            a.startswith("--show-hidden-metrics-for-version") for a in args
        )
        env = dict(os.environ)
        env.update(env_dict or {})
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # (the tests ask for contexts up to 8192; the tiny model says 4096, and RoPE serves more)
        env.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
        name = ["--served-model-name", model]
        where = ["--host", self.host, "--port", str(self.port)]
        if SERVER == "stock":
            argv = [VLLM, "serve", MODEL_DIR, *name, *args, *where]
        elif SERVER == "synthetic":  # (the harness's own check: fast, no engine)
            own = [a for a in _tokenwire_args(args) if not a.startswith("--vllm-arg")]
            argv = [TOKENWIRE, "serve", "--tokenizer", MODEL_DIR, *name, *own, *where]
        else:
            argv = [
                TOKENWIRE, "serve", "--engine", "vllm", "--model", MODEL_DIR,
                "--vllm-command", VLLM, *name, *_tokenwire_args(args), *where,
            ]  # fmt: skip
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        test = os.environ.get("PYTEST_CURRENT_TEST", "server").split("::")[0]
        self.log_path = LOG_DIR / f"{SERVER}-{Path(test).stem}-{self.port}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115
        self._log.write(shlex.join(argv) + "\n")
        self._log.flush()
        self.proc = subprocess.Popen(
            argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._wait_for_server(max_wait_seconds or START_TIMEOUT)

    def _wait_for_server(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}): {self.log_path}")
            try:
                if requests.get(self.url_for("health"), timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        self._stop()
        raise RuntimeError(f"the server did not start in {timeout:.0f} s: {self.log_path}")

    def __enter__(self) -> RemoteOpenAIServer:
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        path = "/".join(part.strip("/") for part in parts if part)
        return f"{self.url_root}/{path}"

    def get_client(self, **kwargs) -> openai.OpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.OpenAI(
            base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs
        )

    def get_async_client(self, **kwargs) -> openai.AsyncOpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.AsyncOpenAI(
            base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs
        )


print(f"vLLM API tests against {SERVER} ({sys.executable})", file=sys.stderr)
