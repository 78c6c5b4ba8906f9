"""What keeping responses costs per request: tokenwire serving the synthetic engine at step time 0,
streamed ``/v1/responses`` requests of ``TOKENS`` tokens, with each store side by side: none
(``--responses-store-size 0``), SQLite in memory, the SQLite file (the default), and the
default store with ``store: false`` in the requests; and a ``previous_response_id`` chain
``CHAIN`` long (each request continues the last).

    python bench/responses_store.py

Each server runs in its own process pinned to CPU 0 (``--cpu 0``), this process is the load
generator (``bench/loadgen.py``: one connection per request). Rounds alternate between the
configurations; reported: the median round's server CPU µs per request (every thread: the
store's included) and requests/s.
Environment: CONCURRENCY=16  TOKENS=16  ROUNDS=5  REQUESTS=200  CHAIN=50.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

from loadgen import cpu_ns, free_port, load, wait_port  # noqa: E402

MODEL = "bench-model"
CONCURRENCY = int(os.environ.get("CONCURRENCY", 16))
TOKENS = int(os.environ.get("TOKENS", 16))
ROUNDS = int(os.environ.get("ROUNDS", 5))
REQUESTS = int(os.environ.get("REQUESTS", 200))
CHAIN = int(os.environ.get("CHAIN", 50))


def _body(port: int, store: bool) -> bytes:
    body = {
        "model": MODEL,
        "input": "Benchmark prompt: tell me a story about a fox.",
        "max_output_tokens": TOKENS,
        "ignore_eos": True,
        "stream": True,
        "store": store,
    }
    data = json.dumps(body).encode()
    return (
        f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + data


def _post(port: int, body: dict) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/responses",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def main() -> None:
    folder = tempfile.mkdtemp(prefix="tokenwire-bench-store-")
    configs = {
        "no store (--responses-store-size 0)": (["--responses-store-size", "0"], False),
        "SQLite in memory (sqlite://)": (["--responses-store", "sqlite://"], True),
        "SQLite file (the default)": ([], True),
        "SQLite file, store: false": ([], False),
    }
    servers = {}
    env = dict(os.environ, XDG_DATA_HOME=folder)
    for name, (flags, _) in configs.items():
        port = free_port()
        argv = [sys.executable, "-m", "tokenwire", "serve", "--port", str(port), "--cpu", "0"]
        argv += ["--served-model-name", MODEL, "--step-time-ms", "0", "--disable-access-log"]
        argv += ["--log-level", "warning", *flags]
        if "default" in name or "false" in name:
            argv += ["--responses-store", f"sqlite:///{folder}/{port}.sqlite3"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, env=env)
        servers[name] = (proc, port)
    try:
        for proc, port in servers.values():
            wait_port(port, proc, 120, "/health")
        results: dict[str, list[tuple[float, float]]] = {n: [] for n in configs}
        for _ in range(ROUNDS):
            for name, (_, store) in configs.items():
                proc, port = servers[name]
                ns0 = cpu_ns(proc.pid)
                run = asyncio.run(
                    load(port, CONCURRENCY, _body(port, store), TOKENS, requests=REQUESTS)
                )
                used = (cpu_ns(proc.pid) - ns0) / REQUESTS / 1e3
                results[name].append((used, REQUESTS / run["elapsed"]))
        base = statistics.median(u for u, _ in results[next(iter(configs))])
        print(f"{'store':<40} {'CPU µs/request':>15} {'vs none':>8} {'requests/s':>11}")
        for name, runs in results.items():
            cpu = statistics.median(u for u, _ in runs)
            rps = statistics.median(r for _, r in runs)
            print(f"{name:<40} {cpu:>15.0f} {cpu - base:>+8.0f} {rps:>11.0f}")
        # A previous_response_id chain: each request reads the whole chain from the store.
        _, port = servers["SQLite file (the default)"]
        prev = None
        times = []
        for _ in range(CHAIN):
            t0 = time.perf_counter()
            body = {"model": MODEL, "input": "go on", "max_output_tokens": 4}
            if prev:
                body["previous_response_id"] = prev
            prev = _post(port, body)["id"]
            times.append(time.perf_counter() - t0)
        print(
            f"previous_response_id chain of {CHAIN}: first 5 requests "
            f"{statistics.median(times[:5]) * 1e3:.1f} ms, last 5 "
            f"{statistics.median(times[-5:]) * 1e3:.1f} ms (median)"
        )
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            proc.wait(30)


if __name__ == "__main__":
    main()
