"""Build (once) the third frontend ``bench/frontend.py`` runs beside tokenwire and vLLM's own.

It makes, under the user's cache directory (``$TOKENWIRE_BENCH_ENV`` overrides the place), a
virtual environment with SGLang's Rust model gateway from PyPI (``smg``: a Rust binary behind a
Python launcher, about 100 MB, no GPU needed), which fronts vLLM engines over the same EngineCore
ZMQ protocol as tokenwire. The vLLM environment itself is ``scripts/vllm_cpu_env.py``'s.

A completion marker says the environment is built; a partial one is rebuilt. Prints the paths as
JSON on its last line. Nothing here is imported by tokenwire.

    python scripts/bench_env.py            # build if missing, print {"smg": ..., "version": ...}
    python scripts/bench_env.py --check    # exit 1 when it is not built
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SMG_VERSION = "1.13.0"
SMG_SPEC = f"smg=={SMG_VERSION}"
#: Written last into the environment once it is built.
MARKER = ".tokenwire-complete"


def cache_dir() -> Path:
    """``$TOKENWIRE_BENCH_ENV``, or ``<user cache>/tokenwire/smg-<version>``."""
    explicit = os.environ.get("TOKENWIRE_BENCH_ENV")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tokenwire" / f"smg-{SMG_VERSION}"


def paths(root: Path) -> dict[str, str]:
    return {"smg": str(root / "venv" / "bin" / "smg"), "version": SMG_VERSION}


def _log(msg: str) -> None:
    print(f"[bench-env] {msg}", file=sys.stderr, flush=True)


def built(root: Path) -> bool:
    """Whether the environment under ``root`` is complete."""
    return (root / "venv" / MARKER).exists() and Path(paths(root)["smg"]).exists()


def build(root: Path) -> None:
    venv = root / "venv"
    if built(root):
        return
    if venv.exists():
        shutil.rmtree(venv)
    t0 = time.monotonic()
    _log(f"creating {venv} with {SMG_SPEC}")
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", SMG_SPEC], check=True)
    (venv / MARKER).write_text(SMG_SPEC)
    _log(f"built in {time.monotonic() - t0:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether it is built")
    args = parser.parse_args()
    root = cache_dir()
    if args.check:
        ok = built(root)
        print(json.dumps(paths(root) if ok else {}))
        return 0 if ok else 1
    build(root)
    print(json.dumps(paths(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
