"""Robustness under hostile load, as one table from one run: a ``tokenwire serve`` process (the
synthetic engine at 20 ms a step) driven by raw asyncio clients.

    python bench/robustness.py

1. Concurrent streams held: C streams at once; p50/p99 time to first token, and /health latency
   while they run.
2. Non-reading clients vs a reading one: a reading stream's duration alone, then beside 50
   clients that stopped reading (their sinks full and merging).
3. Disconnect storm: D clients start a stream and hang up after its first chunk; engine requests
   left once the dust settles (must be 0).
4. Slowloris: S connections sending a header byte every 2 s; how many the server still holds after
   its header timeout, and /health meanwhile.
5. Soak: N short requests, 64 at a time; server RSS and open descriptors at start, middle, end.

Environment: STREAMS=1000 STORM=500 SLOWLORIS=500 SOAK=20000,
SCENARIOS=held,non_reading,storm,slowloris,soak (a subset, in any order).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from loadgen import free_port, pct, wait_port  # noqa: E402

STREAMS = int(os.environ.get("STREAMS", "1000"))
STORM = int(os.environ.get("STORM", "500"))
SLOWLORIS = int(os.environ.get("SLOWLORIS", "500"))
SOAK = int(os.environ.get("SOAK", "20000"))
HEADER_TIMEOUT = 5.0


def _request(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


def _completion(tokens: int, stream: bool = True) -> bytes:
    body = {"prompt": "Hi", "max_tokens": tokens, "stream": stream, "ignore_eos": True}
    return _request("/v1/completions", body)


async def _stream(port: int, payload: bytes) -> tuple[float, float, bool]:
    """(time to first chunk, total time, ended with [DONE])."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    first = None
    tail = b""
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            if first is None and b"data: " in chunk:
                first = time.perf_counter() - start
            tail = (tail + chunk)[-64:]
            if b"data: [DONE]" in tail:
                break
    finally:
        writer.close()
    return (first or float("nan")), time.perf_counter() - start, b"[DONE]" in tail


async def _get(port: int, path: str) -> tuple[int, bytes, float]:
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, data.split(b"\r\n\r\n", 1)[-1], time.perf_counter() - start


class _Health:
    """/health latency, probed every 100 ms while a scenario runs."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.lat: list[float] = []
        self.failures = 0
        self._task: asyncio.Task | None = None

    async def _probe(self) -> None:
        while True:
            try:
                status, _, took = await asyncio.wait_for(_get(self.port, "/health"), 10)
                self.lat.append(took)
                self.failures += status != 200
            except (OSError, asyncio.TimeoutError):
                self.failures += 1
            await asyncio.sleep(0.1)

    def __enter__(self) -> _Health:
        self._task = asyncio.ensure_future(self._probe())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def text(self) -> str:
        if not self.lat:
            return "no answer"
        fails = f", {self.failures} failed" if self.failures else ""
        return f"p50 {pct(self.lat, 50) * 1e3:.1f} / p99 {pct(self.lat, 99) * 1e3:.1f} ms{fails}"


async def _engine_requests(port: int) -> int:
    _, body, _ = await _get(port, "/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def _proc_stats(pid: int) -> tuple[float, int]:
    """(RSS in MiB, open descriptors) of process ``pid``."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


async def held(port: int) -> tuple[str, str, str]:
    with _Health(port) as health:
        results = await asyncio.gather(
            *(_stream(port, _completion(64)) for _ in range(STREAMS)), return_exceptions=True
        )
    ok = [r for r in results if not isinstance(r, BaseException) and r[2]]
    ttft = [r[0] for r in ok]
    result = (
        f"{len(ok)}/{STREAMS} complete; TTFT p50 {pct(ttft, 50) * 1e3:.0f} / "
        f"p99 {pct(ttft, 99) * 1e3:.0f} ms"
    )
    return f"concurrent streams held ({STREAMS} x 64 tokens)", result, health.text()


async def non_reading(port: int) -> tuple[str, str, str]:
    reading = _completion(200)
    alone = min([(await _stream(port, reading))[1] for _ in range(3)])
    stall = _request(
        "/generate",
        {
            "text": "Hi",
            "stream": True,
            "sampling_params": {"max_new_tokens": 30000, "ignore_eos": True},
        },
    )
    writers = []
    for _ in range(50):
        import socket

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(stall)
        writers.append(sock)
    await asyncio.sleep(15)  # until their socket buffers and sinks are full
    with _Health(port) as health:
        beside = min([(await _stream(port, reading))[1] for _ in range(3)])
    for sock in writers:
        sock.close()
    result = (
        f"reading stream {alone:.2f} s alone, {beside:.2f} s beside them ({beside / alone:.2f}x)"
    )
    return "non-reading clients (50) vs a reading one (200 tokens)", result, health.text()


async def storm(port: int) -> tuple[str, str, str]:
    async def hang_up() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_completion(2000))
        await reader.read(1)  # the first byte of the response, then gone
        writer.transport.abort()

    with _Health(port) as health:
        await asyncio.gather(*(hang_up() for _ in range(STORM)), return_exceptions=True)
        await asyncio.sleep(2)
    left = await _engine_requests(port)
    return f"disconnect storm ({STORM} streams)", f"engine requests left: {left}", health.text()


async def slowloris(port: int) -> tuple[str, str, str]:
    conns = []
    for _ in range(SLOWLORIS):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            conns.append((reader, writer))
        except OSError:
            pass
    with _Health(port) as health:
        deadline = time.monotonic() + HEADER_TIMEOUT + 5
        while time.monotonic() < deadline:
            for _, writer in conns:
                if not writer.is_closing():
                    writer.write(b"X")
            await asyncio.sleep(2)
    alive = 0
    for reader, writer in conns:
        try:
            await asyncio.wait_for(reader.read(), 0.05)  # 408 and EOF: closed by the server
        except asyncio.TimeoutError:
            alive += 1  # still open
        except OSError:
            pass  # reset: closed by the server (a byte came after its close)
        writer.close()
    return (
        f"slowloris ({len(conns)} connections, a byte every 2 s)",
        f"still held after {HEADER_TIMEOUT + 5:.0f} s: {alive}",
        health.text(),
    )


async def soak(port: int, pid: int) -> tuple[str, str, str]:
    payload = _completion(8, stream=False)
    marks = [_proc_stats(pid)]
    done = 0
    errors = 0

    async def worker() -> None:
        nonlocal done, errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while done < SOAK:
            done += 1
            writer.write(payload)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            errors += not head.startswith(b"HTTP/1.1 200")
            if done == SOAK // 2:
                marks.append(_proc_stats(pid))
        writer.close()

    with _Health(port) as health:
        await asyncio.gather(*(worker() for _ in range(64)))
    marks.append(_proc_stats(pid))
    rss = " / ".join(f"{m[0]:.0f}" for m in marks)
    fds = " / ".join(str(m[1]) for m in marks)
    result = f"{errors} errors; RSS {rss} MiB, descriptors {fds} (start / middle / end)"
    return f"soak ({SOAK} requests, 64 at a time)", result, health.text()


async def main_async(port: int, pid: int) -> list[tuple[str, str, str]]:
    chosen = os.environ.get("SCENARIOS", "held,non_reading,storm,slowloris,soak").split(",")
    scenarios = {
        "held": lambda: held(port),
        "non_reading": lambda: non_reading(port),
        "storm": lambda: storm(port),
        "slowloris": lambda: slowloris(port),
        "soak": lambda: soak(port, pid),
    }
    return [await scenarios[name]() for name in chosen]


def main() -> None:
    port = free_port()
    cmd = [
        sys.executable, "-m", "tokenwire", "serve", "--port", str(port),
        "--step-time-ms", "20", "--max-batch-size", "4096",
        "--max-concurrent-requests", "8192", "--header-timeout", str(HEADER_TIMEOUT),
        "--disable-access-log", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc, path="/health")
        rows = asyncio.run(main_async(port, proc.pid))
    finally:
        proc.terminate()
        proc.wait(30)
    print("| scenario | result | /health meanwhile |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
