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
import re
import resource
import socket
import subprocess
import time


def _http(port: int, path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + data


def request_bytes(
    port: int, model: str, tokens: int, *, prompt: str | None = None, **extra: object
) -> bytes:
    """One streaming completion request for ``tokens`` tokens (``ignore_eos``), as raw HTTP;
    ``extra`` adds request fields."""
    body = {
        "model": model,
        "prompt": prompt or "Benchmark prompt: tell me a story about a fox.",
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        **extra,
    }
    return _http(port, "/v1/completions", body)


def chat_request_bytes(port: int, model: str, tokens: int, content: str, **extra: object) -> bytes:
    """One streaming chat request for ``tokens`` tokens (``ignore_eos``), as raw HTTP."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        **extra,
    }
    return _http(port, "/v1/chat/completions", body)


#: A chunk that carries generated text: a non-empty completion text, chat content or reasoning.
_TOKEN_CHUNK = re.compile(rb'"(?:text|content|reasoning_content|reasoning)":"[^"]')
_FINISHED = re.compile(rb'"finish_reason":"(?:length|stop)"')
_USAGE = re.compile(rb'"completion_tokens":(\d+)')


async def _one(port: int, payload: bytes, out: list) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.perf_counter()
    writer.write(payload)
    await writer.drain()
    arrivals = []
    tail = b""
    done = False
    finished = False  # a finish reason came (an error also ends with [DONE])
    used = None  # completion tokens, when the stream reports its usage
    while True:
        data = await reader.read(1 << 16)
        if not data:
            break
        now = time.perf_counter()
        window = tail + data
        if _TOKEN_CHUNK.search(window):
            arrivals.append(now)
        if not finished and _FINISHED.search(window):
            finished = True
        if b'"usage":' in window:
            got = _USAGE.findall(window)
            if got:
                used = int(got[-1])
        if b"data: [DONE]" in window:
            done = finished
        tail = window[-64:]
    writer.close()
    out.append((t0, arrivals, done, used))


async def load(
    port: int,
    concurrency: int,
    payload: bytes | list[bytes],
    tokens: int,
    *,
    requests: int | None = None,
) -> dict:
    """Run ``requests`` (default: ``concurrency``) requests, ``concurrency`` at a time (a list of
    payloads is taken in turn); tokens/s (of responses that ran to a finish reason: the tokens
    their usage reports, else ``tokens`` each), TTFT, ITL."""
    payloads = payload if isinstance(payload, list) else [payload]
    total = requests or concurrency
    results: list = []
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            await _one(port, payloads[i % len(payloads)], results)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(total)))
    elapsed = time.perf_counter() - t0
    ttft = [arr[0] - start for start, arr, _, _ in results if arr]
    itl = [b - a for _, arr, _, _ in results for a, b in itertools.pairwise(arr)]
    complete = sum(done for _, _, done, _ in results)
    streamed = sum((tokens if used is None else used) for _, _, done, used in results if done)
    return {
        "elapsed": elapsed,
        "tokens_per_s": streamed / elapsed,
        "streamed": streamed,
        "complete": complete,
        "requests": total,
        "ttft": ttft,
        "itl": itl,
    }


def pct(xs: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank)."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def raise_open_files(at_least: int) -> None:
    """Raise this process's open-files limit to ``at_least`` (within the hard limit): one
    descriptor per connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = at_least if hard == resource.RLIM_INFINITY else min(at_least, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


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
                head = f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
                s.sendall(head.encode())
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


def cpu_ns(pid: int, *, children: bool = False) -> int:
    """Nanoseconds on a CPU of every thread of a process so far (the scheduler's own count,
    ``/proc/PID/task/*/schedstat``: finer than the clock ticks of ``cpu_times``); with
    ``children``, with those of the living processes it started."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if children else ():
        if entry.isdigit():
            with contextlib.suppress(OSError):
                tree.setdefault(int(_stat(int(entry))[1]), []).append(int(entry))
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
        todo += tree.get(p, [])
    return total


async def load_measured(
    pid: int,
    port: int,
    concurrency: int,
    payload: bytes | list[bytes],
    tokens: int,
    *,
    children: bool = False,
    requests: int | None = None,
) -> dict:
    """``load``, with the server's own CPU time per streamed token: ``cpu_us_per_token`` (all
    its threads, from the scheduler's count), ``user_us_per_token`` and ``sys_us_per_token``
    (from clock ticks) (process ``pid``, and with ``children`` those it started, over the
    round)."""
    user0, sys0 = cpu_times(pid, children=children)
    ns0 = cpu_ns(pid, children=children)
    run = await load(port, concurrency, payload, tokens, requests=requests)
    ns1 = cpu_ns(pid, children=children)
    user1, sys1 = cpu_times(pid, children=children)
    streamed = max(run["streamed"], 1)
    run["user_us_per_token"] = (user1 - user0) / streamed * 1e6
    run["sys_us_per_token"] = (sys1 - sys0) / streamed * 1e6
    run["cpu_us_per_token"] = (ns1 - ns0) / streamed / 1e3
    return run


def summary(runs: list[dict]) -> dict:
    """The median round by tokens/s, with its latency percentiles (ms)."""
    rs = sorted(runs, key=lambda r: r["tokens_per_s"])
    med = rs[len(rs) // 2]
    return {
        "tokens_per_s": round(med["tokens_per_s"]),
        "complete": med["complete"],
        "requests": med.get("requests", med["complete"]),
        "ttft_p50_ms": round(pct(med["ttft"], 50) * 1e3, 1),
        "ttft_p99_ms": round(pct(med["ttft"], 99) * 1e3, 1),
        "itl_p50_ms": round(pct(med["itl"], 50) * 1e3, 2),
        "itl_p99_ms": round(pct(med["itl"], 99) * 1e3, 2),
        "runs_tokens_per_s": [round(r["tokens_per_s"]) for r in runs],
        "runs_ttft_p50_ms": [round(pct(r["ttft"], 50) * 1e3, 1) for r in runs],
    } | {
        key: round(pct([r[key] for r in runs], 50), 2)
        for key in ("user_us_per_token", "sys_us_per_token")
        if all(key in r for r in runs)
    }
