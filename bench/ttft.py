"""Where a streamed request's time to first token goes in ``tokenwire serve --engine vllm``, over
``tokenwire mock-engine``, segment by segment.

    python bench/ttft.py                           # completions and chat, C = 1 and 8
    WORKLOADS=chat CONCURRENCY=8,64 python bench/ttft.py

The server and the engine run as ``bench/frontend.py`` runs them (the server on CPU 0; the engine,
step time 0, and this load generator on CPU 1). The server runs under this script
(``--serve``), which first wraps five of tokenwire's functions to note, for each request, when
it passed (``time.perf_counter``, the clock the mock engine's ``time.monotonic`` timestamps use
on Linux) and the event loop thread's CPU time then (``time.thread_time``):

- ``recv``: the connection's first bytes (``_LimitedProtocol.data_received``);
- ``handler``: the request's ASGI handler starts (``App.__call__``);
- ``submit``: the request goes to the engine client (``VllmEngine.submit``, which hands the ADD
  to ZMQ);
- ``queued``: the engine took the ADD (the mock engine's QUEUED event, on its clock);
- ``step``: the engine made the step with the request's first token (that message's timestamp);
- ``read``: the server decoded that message;
- ``shard``: the step goes to the shard (``VllmEngine._hand_over``);
- ``write``: the response's head and first chunk go to the socket (``HeadWithBody.write``).

For each workload and C the table gives each segment's median and 90th percentile (ms), the
share of the segment's time the loop thread ran (its CPU time over the segment's; between
``submit`` and ``shard`` other threads and the engine do the work), and, for each request, how
many others reached the server within 1 ms of it (at a few streams of equal length, requests end
and are replaced together: each one's TTFT holds the others' intake too). The wrapping costs a
few µs a request; the load generator's TTFT (from its write to the first token it reads) is
given beside the server's ``recv`` to ``write``.

Environment: WORKLOADS=completions,chat, CONCURRENCY=1,8, TOKENS=128, ROUNDS=3 (requests a round:
64 at C = 1, 64 x C above).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: The points a request passes, in order.
POINTS = ("recv", "handler", "submit", "queued", "step", "read", "shard", "write")
#: Points noted on the server's own clock and its loop thread's CPU clock.
_LOOP_POINTS = ("recv", "handler", "submit", "read", "shard", "write")


def _install(out_path: str) -> None:
    """Wrap the server's functions (in the ``--serve`` process, before it starts) so that each
    request's points go to ``out_path`` as a JSON line once its first chunk is written."""
    from tokenwire.engine.vllm import client
    from tokenwire.engine.vllm import protocol as wire
    from tokenwire.server import app, serving

    clock, cpu = time.perf_counter, time.thread_time
    out = open(out_path, "w", buffering=1)  # noqa: SIM115 (open for the server's life)
    arrived: dict[Any, tuple[float, float]] = {}  # peer -> (recv, cpu)
    by_task: dict[Any, dict[str, float]] = {}
    by_peer: dict[Any, dict[str, float]] = {}
    by_rid: dict[str, dict[str, float]] = {}

    def note(rec: dict[str, float], point: str) -> None:
        rec[point] = clock()
        rec["cpu_" + point] = cpu()

    data_received = serving._LimitedProtocol.data_received

    def on_data(self: Any, data: bytes) -> None:
        transport = getattr(self, "transport", None)
        peer = transport.get_extra_info("peername") if transport is not None else None
        if peer is not None and peer not in arrived:
            arrived[peer] = (clock(), cpu())
        data_received(self, data)

    serving._LimitedProtocol.data_received = on_data  # type: ignore[method-assign]
    call = app.App.__call__

    async def handler(self: Any, scope: Any, receive: Any, send: Any) -> None:
        rec: dict[str, float] = {}
        note(rec, "handler")
        peer = tuple(scope["client"]) if scope.get("client") else None
        first = arrived.pop(peer, None)
        if first is not None:
            rec["recv"], rec["cpu_recv"] = first
            by_peer[peer] = rec
        task = asyncio.current_task()
        by_task[task] = rec
        try:
            await call(self, scope, receive, send)
        finally:
            by_task.pop(task, None)
            by_peer.pop(peer, None)

    app.App.__call__ = handler  # type: ignore[method-assign]
    submit = client.VllmEngine.submit

    def on_submit(self: Any, request: Any) -> None:
        rec = by_task.get(asyncio.current_task())
        if rec is not None:
            note(rec, "submit")
            by_rid[request.rid] = rec
        submit(self, request)

    client.VllmEngine.submit = on_submit  # type: ignore[method-assign]
    decode = wire.decode_outputs

    def on_decode(buf: Any) -> Any:
        msg = decode(buf)
        for o in msg.outputs or ():
            rec = by_rid.get(o.request_id)
            if rec is not None and "read" not in rec and o.events:
                queued, _ = wire.event_times(o.events)
                note(rec, "read")
                rec["queued"], rec["step"] = queued, msg.timestamp
        return msg

    client.wire.decode_outputs = on_decode  # type: ignore[attr-defined]
    hand_over = client.VllmEngine._hand_over

    def on_hand_over(self: Any, outputs: Any, engine_index: int, frames: Any) -> Any:
        for o in outputs:
            rec = by_rid.pop(o.request_id, None)
            if rec is not None:
                note(rec, "shard")
        return hand_over(self, outputs, engine_index, frames)

    client.VllmEngine._hand_over = on_hand_over  # type: ignore[method-assign]
    write = serving.HeadWithBody.write

    def on_write(self: Any, data: bytes) -> None:
        if self._head is not None:
            cycle = self._cycle()
            peer = cycle.scope.get("client") if cycle is not None else None
            rec = by_peer.pop(tuple(peer), None) if peer else None
            if rec is not None and "shard" in rec:
                note(rec, "write")
                out.write(json.dumps(rec) + "\n")
        write(self, data)

    serving.HeadWithBody.write = on_write  # type: ignore[method-assign]


def _segments(recs: list[dict[str, float]]) -> list[tuple[str, list[float], list[float]]]:
    """Per segment: its lengths (ms) and the loop thread's busy shares."""
    out = []
    for a, b in [*itertools.pairwise(POINTS), ("recv", "write")]:
        spans = [(r[b] - r[a]) * 1e3 for r in recs]
        busy = []
        if a in _LOOP_POINTS and b in _LOOP_POINTS:
            busy = [(r["cpu_" + b] - r["cpu_" + a]) / (r[b] - r[a]) for r in recs if r[b] > r[a]]
        out.append((f"{a} → {b}", spans, busy))
    return out


def _cohorts(recs: list[dict[str, float]]) -> list[int]:
    """For each request, how many others reached the server within 1 ms of it."""
    import bisect

    times = sorted(r["recv"] for r in recs)
    return [
        bisect.bisect_right(times, t + 1e-3) - bisect.bisect_left(times, t - 1e-3) - 1
        for t in times
    ]


def main() -> None:
    from frontend import (
        LONG_TOKENS,
        MAX_LEN,
        NAME,
        TOKENS,
        _check,
        _mock,
        _spawn,
        _stop,
        payloads,
    )
    from loadgen import free_port, load, pct, raise_open_files, wait_port

    model = _check("vllm_cpu_env.py", "the vLLM environment")["model"]
    workloads = os.environ.get("WORKLOADS", "completions,chat").split(",")
    levels = [int(c) for c in os.environ.get("CONCURRENCY", "1,8").split(",")]
    rounds = int(os.environ.get("ROUNDS", "3"))
    raise_open_files(65536)
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    logdir = Path(tempfile.mkdtemp(prefix="tokenwire-ttft-"))
    trace = logdir / "points.jsonl"
    rpc, port = free_port(), free_port()
    argv = [sys.executable, str(Path(__file__).resolve()), "--serve", str(trace), "serve"]
    argv += ["--engine", "vllm", "--port", str(port), "--served-model-name", NAME]
    argv += ["--log-level", "warning", "--max-concurrent-requests", "100000"]
    argv += ["--max-model-len", str(MAX_LEN), "--reasoning-parser", "qwen3"]
    argv += ["--tokenizer", model, "--handshake-address", f"tcp://127.0.0.1:{rpc}"]
    argv += ["--engine-transport", "ipc"]  # (as bench/frontend.py runs it)
    procs = [_spawn(argv, 0, logdir / "tokenwire.log")]
    procs.append(_mock(f"tcp://127.0.0.1:{rpc}", model, logdir / "engine.log"))
    rows = []
    try:
        wait_port(port, procs[0], 120, "/health")
        for workload in workloads:
            tokens = LONG_TOKENS if workload == "long" else TOKENS
            for c in levels:
                payload = payloads(workload, port, c, False, False)  # (bench/frontend.py's)
                asyncio.run(load(port, c, payload, tokens, requests=max(c, 8) * 4))  # warm
                ttft: list[float] = []
                recs: list[dict[str, float]] = []
                for _ in range(rounds):
                    start = trace.stat().st_size if trace.exists() else 0
                    run = asyncio.run(load(port, c, payload, tokens, requests=64 * max(1, c)))
                    ttft += run["ttft"]
                    time.sleep(0.2)
                    with open(trace, encoding="utf-8") as f:
                        f.seek(start)
                        recs += [json.loads(line) for line in f if line.strip()]
                recs = [r for r in recs if all(p in r for p in POINTS)]
                rows.append((workload, c, recs, pct(ttft, 50) * 1e3))
    finally:
        _stop(procs)
    print("| workload | C | segment | p50 ms | p90 ms | loop thread busy (p50) |")
    print("|---|---:|---|---:|---:|---:|")
    for workload, c, recs, client_ttft in rows:
        for name, spans, busy in _segments(recs):
            share = f"{statistics.median(busy):.2f}" if busy else "-"
            print(
                f"| {workload} | {c} | {name} | {pct(spans, 50):.2f} | {pct(spans, 90):.2f} "
                f"| {share} |"
            )
        near = _cohorts(recs)
        print(
            f"| {workload} | {c} | (client TTFT p50 {client_ttft:.2f} ms; {len(recs)} requests; "
            f"others within 1 ms: p50 {statistics.median(near):.0f}) | | | |"
        )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        # (this folder's ``http.py`` would shadow the standard library's ``http`` there)
        sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != HERE]
        _install(sys.argv[2])
        from tokenwire.entrypoints.cli import main as cli

        sys.argv = ["tokenwire", *sys.argv[3:]]
        with contextlib.suppress(KeyboardInterrupt):
            sys.exit(cli())
    else:
        main()
