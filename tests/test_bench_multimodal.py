"""``bench/multimodal.py``'s frontends: both run with the same processed-input cache size (none
by default), since the requests cycle through a few dozen images that a cache would serve."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tokenwire.entrypoints.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PATHS = {"vlm": "/models/tiny-vl", "vllm_mm": "vllm"}


def _bench(monkeypatch: pytest.MonkeyPatch, **env: str):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "path", list(sys.path))  # (the bench filters sys.path on import)
    spec = importlib.util.spec_from_file_location("bench_multimodal", ROOT / "bench/multimodal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("env", "size"), [({}, 0.0), ({"CACHE_GB": "2"}, 2.0)])
def test_both_frontends_get_the_cache_size(monkeypatch, env, size) -> None:
    bench = _bench(monkeypatch, **env)
    tokenwire = bench.frontend_argv("tokenwire", PATHS, 8000, 8001)
    vllm = bench.frontend_argv("vllm", PATHS, 8000, 8001)
    for argv in (tokenwire, vllm):
        at = argv.index("--mm-processor-cache-gb")
        assert float(argv[at + 1]) == size
    args = build_parser().parse_args(tokenwire[3:])
    assert args.mm_processor_cache_gb == size
    assert args.handshake_address == "tcp://127.0.0.1:8001"
