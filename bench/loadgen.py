"""A cheap streaming load generator for the HTTP benchmarks: C concurrent streaming
``/v1/completions`` requests over raw asyncio connections, timed per chunk.

Used by ``bench/http.py`` and ``bench/frontend.py``; not a benchmark of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import socket
import subprocess
import time


def request_bytes(
    port: int, model: str, tokens: int, *, prompt: str | None = None, **extra: object
) -> bytes:
    """One streaming completion request for ``tokens`` tokens (``ignore_eos``), as raw HTTP;
    ``extra`` adds request fields."""
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt or "Benchmark prompt: tell me a story about a fox.",
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
            **extra,
        }
    ).encode()
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


async def _one(port: int, payload: bytes, out: list) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.perf_counter()
    writer.write(payload)
    await writer.drain()
    arrivals = []
    tail = b""
    done = False
    length = False  # the response ended with finish_reason "length" (an error also ends [DONE])
    while True:
        data = await reader.read(1 << 16)
        if not data:
            break
        now = time.perf_counter()
        window = tail + data
        if b'"text":' in data or b"[DONE]" in window:
            arrivals.append(now)
        if b'"finish_reason":"length"' in window:
            length = True
        if b"data: [DONE]" in window:
            done = length
        tail = window[-64:]
    writer.close()
    out.append((t0, arrivals, done))


async def load(port: int, concurrency: int, payload: bytes, tokens: int) -> dict:
    """Run ``concurrency`` requests at once; tokens/s (responses that ran to their length only),
    TTFT, ITL."""
    results: list = []
    t0 = time.perf_counter()
    await asyncio.gather(*(_one(port, payload, results) for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    ttft = [arr[0] - start for start, arr, _ in results if arr]
    itl = [b - a for _, arr, _ in results for a, b in itertools.pairwise(arr)]
    complete = sum(done for _, _, done in results)
    return {
        "elapsed": elapsed,
        "tokens_per_s": complete * tokens / elapsed,
        "complete": complete,
        "ttft": ttft,
        "itl": itl,
    }


def pct(xs: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank)."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60, path: str = "") -> None:
    """Until something accepts on ``port`` (and, with ``path``, answers it with 200)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                if not path:
                    return
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not start")


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # from the state on: field 3 of proc(5)


def cpu_times(pid: int, *, children: bool = False) -> tuple[float, float]:
    """User and system (kernel) CPU seconds of a process so far; with ``children``, with those of
    the living processes it started (a server's workers, as granian's)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if children else ():
        if entry.isdigit():
            with contextlib.suppress(OSError):  # (gone meanwhile)
                tree.setdefault(int(_stat(int(entry))[1]), []).append(int(entry))
    user = system = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = _stat(p)
        except OSError:
            continue
        user += int(fields[11])
        system += int(fields[12])
        todo += tree.get(p, [])
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


async def load_measured(
    pid: int, port: int, concurrency: int, payload: bytes, tokens: int, *, children: bool = False
) -> dict:
    """``load``, with the server's own CPU time per streamed token: ``user_us_per_token`` and
    ``sys_us_per_token`` (process ``pid``, and with ``children`` those it started, over the
    round)."""
    user0, sys0 = cpu_times(pid, children=children)
    run = await load(port, concurrency, payload, tokens)
    user1, sys1 = cpu_times(pid, children=children)
    streamed = max(run["complete"] * tokens, 1)
    run["user_us_per_token"] = (user1 - user0) / streamed * 1e6
    run["sys_us_per_token"] = (sys1 - sys0) / streamed * 1e6
    return run


def summary(runs: list[dict]) -> dict:
    """The median round by tokens/s, with its latency percentiles (ms)."""
    rs = sorted(runs, key=lambda r: r["tokens_per_s"])
    med = rs[len(rs) // 2]
    return {
        "tokens_per_s": round(med["tokens_per_s"]),
        "complete": med["complete"],
        "ttft_p50_ms": round(pct(med["ttft"], 50) * 1e3, 1),
        "ttft_p99_ms": round(pct(med["ttft"], 99) * 1e3, 1),
        "itl_p50_ms": round(pct(med["itl"], 50) * 1e3, 2),
        "itl_p99_ms": round(pct(med["itl"], 99) * 1e3, 2),
        "runs_tokens_per_s": [round(r["tokens_per_s"]) for r in runs],
    } | {
        key: round(pct([r[key] for r in runs], 50), 2)
        for key in ("user_us_per_token", "sys_us_per_token")
        if all(key in r for r in runs)
    }
