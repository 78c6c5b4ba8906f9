"""Scale-out benchmark: ``tokenwire serve --api-server-count N`` for N = 1, 2, ... over mock
engines (step time 0, one ``tokenwire mock-engine`` per API server), in one run.

    python bench/scale.py                  # N = 1, 2; C = 256, 1024
    SERVERS=1,2,4 CONCURRENCY=256 python bench/scale.py

Every configuration is up at once and idle when not loaded; rounds alternate between them so
that drifts in machine speed hit all alike. Streamed tokens/s (128-token responses that ran to
their length), scaling efficiency per added API server (tokens/s over N times the N = 1 figure,
paired by round) and the cores the machine has: with fewer cores than busy processes (N API
servers, N engines, the load generator), scaling is bounded by the cores, not by tokenwire.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from loadgen import free_port, load, request_bytes, summary, wait_port  # noqa: E402

TOKENS = int(os.environ.get("TOKENS", "128"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
NAME = "bench"


def _start(n: int, port: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tokenwire", "serve", "--api-server-count", str(n)]
    argv += ["--data-parallel-size", str(n), "--step-time-ms", "0", "--port", str(port)]
    argv += ["--synthetic-output", "random", "--max-batch-size", "256"]
    argv += ["--served-model-name", NAME, "--max-concurrent-requests", "100000"]
    argv += ["--log-level", "warning", "--disable-access-log"]
    if n == 1:  # one API server, still over a mock-engine process: the same topology
        argv[argv.index("--api-server-count") + 1] = "1"
        argv += ["--force-supervisor"]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)


def main() -> None:
    servers = [int(x) for x in os.environ.get("SERVERS", "1,2").split(",")]
    levels = [int(c) for c in os.environ.get("CONCURRENCY", "256,1024").split(",")]
    ports = {n: free_port() for n in servers}
    procs = {n: _start(n, p) for n, p in ports.items()}
    rows = []
    try:
        for n, port in ports.items():
            wait_port(port, procs[n], timeout=180, path="/health")
            asyncio.run(load(port, 16, request_bytes(port, NAME, TOKENS), TOKENS))  # warm-up
        for c in levels:
            runs: dict[int, list[dict]] = {n: [] for n in servers}
            for _ in range(ROUNDS):
                for n, port in ports.items():
                    payload = request_bytes(port, NAME, TOKENS)
                    runs[n].append(asyncio.run(load(port, c, payload, TOKENS)))
            base = runs[servers[0]]
            for n in servers:
                eff = sorted(
                    r["tokens_per_s"] / max(n / servers[0] * b["tokens_per_s"], 1e-9)
                    for r, b in zip(runs[n], base)
                )
                rec = {"api_servers": n, "C": c, **summary(runs[n])}
                rec["efficiency"] = round(eff[len(eff) // 2], 2)
                print(json.dumps(rec), flush=True)
                rows.append(rec)
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    print(f"\ncores on this machine: {os.cpu_count()}")
    print(
        "| API servers | C | tokens/s (median) | efficiency vs linear (paired) "
        "| TTFT p50 / p99 ms | ITL p50 / p99 ms | complete |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['api_servers']} | {r['C']} | {r['tokens_per_s']:,} | {r['efficiency']:.2f} "
            f"| {r['ttft_p50_ms']} / {r['ttft_p99_ms']} | {r['itl_p50_ms']} / {r['itl_p99_ms']} "
            f"| {r['complete']}/{r['C']} |"
        )


if __name__ == "__main__":
    main()
