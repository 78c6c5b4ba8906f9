"""``bench/ttft.py``: its segments and cohorts from the points a request passes, and the server
functions it wraps (they must still exist under the names it wraps)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # (the bench puts bench/ on it)
    spec = importlib.util.spec_from_file_location("bench_ttft", ROOT / "bench/ttft.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(bench, start: float, gaps: list[float], busy: float) -> dict[str, float]:
    """A request's points ``gaps`` seconds apart from ``start``; the loop thread's CPU clock
    advancing ``busy`` of each gap."""
    rec: dict[str, float] = {}
    at = cpu = start
    for point, gap in zip(bench.POINTS, [0.0, *gaps]):
        at += gap
        cpu += gap * busy
        rec[point] = at
        rec["cpu_" + point] = cpu
    return rec


def test_segments_and_cohorts_from_the_points(bench) -> None:
    gaps = [0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007]
    recs = [
        _record(bench, 10.0, gaps, 1.0),
        _record(bench, 10.0005, [2 * g for g in gaps], 0.5),
        _record(bench, 20.0, [3 * g for g in gaps], 0.5),
    ]
    segments = {name: (spans, busy) for name, spans, busy in bench._segments(recs)}
    assert list(segments)[:2] == ["recv → handler", "handler → submit"]
    spans, busy = segments["submit → queued"]
    assert spans == pytest.approx([3.0, 6.0, 9.0])
    assert busy == []  # (the engine's clock: no loop thread share)
    spans, busy = segments["recv → handler"]
    assert spans == pytest.approx([1.0, 2.0, 3.0])
    assert busy == pytest.approx([1.0, 0.5, 0.5])
    spans, _ = segments["recv → write"]
    assert spans == pytest.approx([28.0, 56.0, 84.0])
    # The first two arrive 0.5 ms apart: each has the other within 1 ms; the third has none.
    assert sorted(bench._cohorts(recs)) == [0, 1, 1]


def test_the_traced_server_finds_every_function_it_wraps(tmp_path) -> None:
    """``--serve`` wraps the server's functions before the command line runs (a name that no
    longer exists fails here, not in a benchmark run)."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench/ttft.py"),
            "--serve",
            str(tmp_path / "p.jsonl"),
            "--help",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "serve" in out.stdout
    assert (tmp_path / "p.jsonl").exists()
