"""Running tokenwire's server, mock engines and real vLLM processes for the vLLM-engine tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tokenwire.entrypoints.options.fleet import _free_port_run

ROOT = Path(__file__).resolve().parent.parent
ENV_SCRIPT = ROOT / "scripts" / "vllm_cpu_env.py"


def free_port() -> int:
    """A free port below the kernel's ephemeral range: a server started later binds it, and a
    process that asks for any port meanwhile (a vLLM engine picking its own) is never given it.
    A port from ``bind(0)`` was closed and handed out again: a test failed with "address
    already in use" while four servers started together. (The way tokenwire picks the ports of
    the engines it spawns.)"""
    return _free_port_run(1)


def wait_until(done, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def spawn_mock(address: str, rank: int = 0, *args: str) -> subprocess.Popen:
    """``tokenwire mock-engine`` in its own process."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokenwire",
            "mock-engine",
            "--handshake-address",
            address,
            "--data-parallel-rank",
            str(rank),
            "--log-level",
            "warning",
            *args,
        ],
        stdin=subprocess.DEVNULL,
    )


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def start_streams(
    url: str, count: int, body: dict, timeout: float = 60
) -> tuple[list[threading.Thread], list[str]]:
    """``count`` streaming ``/v1/completions`` requests of ``body``, each read to its end on a
    thread of its own: the started threads, and the list each whole body joins as it ends."""
    bodies: list[str] = []

    def reader() -> None:
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=timeout) as resp:
                bodies.append("".join(resp.iter_text()))
        except httpx.HTTPError as exc:  # (a test that kills the server mid-stream reads this)
            bodies.append(f"<read failed: {exc}>")

    threads = [threading.Thread(target=reader) for _ in range(count)]
    for t in threads:
        t.start()
    return threads, bodies


def metric(url: str, name: str) -> float:
    """The sum of a metric's samples on ``/metrics``."""
    total = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def vllm_env() -> dict[str, str] | None:
    """The built vLLM CPU environment (``scripts/vllm_cpu_env.py``), or None."""
    out = subprocess.run(
        [sys.executable, str(ENV_SCRIPT), "--check"], capture_output=True, text=True
    )
    if out.returncode != 0:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def peers_env() -> dict[str, str] | None:
    """The built parser peers' environment (``scripts/parser_peers_env.py``: SGLang's parsers
    and the package vLLM's Cohere parsers import), or None."""
    script = ENV_SCRIPT.parent / "parser_peers_env.py"
    out = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def vllm_process_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1", VLLM_HOST_IP="127.0.0.1")
    return env


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux ``/proc``)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class MockThreads:
    """``tokenwire mock-engine`` ranks run in threads of this process (each its own event loop):
    the engines of a test that needs no process of their own start in a fraction of the time.
    ``stop(rank)`` ends one as SIGTERM would (its sockets close)."""

    def __init__(self, address: str, ranks: int, args: list[str]) -> None:
        import argparse
        import asyncio

        from tokenwire.engine.vllm.mock import MockEngine
        from tokenwire.entrypoints import mock_engine
        from tokenwire.entrypoints.options import engine as engine_options
        from tokenwire.entrypoints.options import fleet
        from tokenwire.tokenizer import Tokenizer

        parser = argparse.ArgumentParser()
        mock_engine.add_arguments(parser)
        tok = Tokenizer.default()
        self._loops: list = []
        self._tasks: list = []
        self.threads: list[threading.Thread] = []
        self.engines: list = []
        started = []
        for rank in range(ranks):
            ns = parser.parse_args(
                ["--handshake-address", address, "--data-parallel-rank", str(rank), *args]
            )
            eng = MockEngine(
                tok,
                engine_options.synthetic_config(ns),
                address,
                rank=rank,
                max_model_len=ns.max_model_len,
                cache=fleet.mock_cache_config(ns),
            )
            self.engines.append(eng)
            ready = threading.Event()

            def run(eng=eng, ready=ready) -> None:
                loop = asyncio.new_event_loop()
                task = loop.create_task(eng.run())
                self._loops.append(loop)
                self._tasks.append(task)
                ready.set()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    loop.run_until_complete(task)
                loop.close()

            t = threading.Thread(target=run, daemon=True, name=f"mock-engine-{rank}")
            t.start()
            ready.wait(10)
            started.append(t)
        self.threads = started

    def stop(self, rank: int) -> None:
        loop, task = self._loops[rank], self._tasks[rank]
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        self.threads[rank].join(10)

    def close(self) -> None:
        for rank in range(len(self.threads)):
            self.stop(rank)
