"""Robustness under hostile load, as one table from one run: a ``tokenwire serve`` process (the
synthetic engine at 20 ms a step) driven by raw asyncio clients; the scenarios that need another
topology (vLLM engines, several API servers, a health port) start their own.

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

Hostile requests (issue 28), each against what it used to do:

6. ``huge_prompt``: H unauthenticated 20 MB prompts at once, half to /v1/completions, half to
   /tokenize; the time to each 400 and server RSS before, at its peak and after.
7. ``headers``: H requests with a header of tens of MB at once (431), then H with one just under
   the limit, one after another (served); RSS before and after each.
8. ``unknown_fields``: K requests with an unknown field name of M MB, one after another; RSS
   before, after the first, after the last.
9. ``role``: ``{"role": [1]}`` to /v1/chat/completions and /tokenize; the statuses.
10. ``engine_stall``: ``--engine vllm`` over a ``tokenwire mock-engine`` stopped (SIGSTOP) under
    streams: the time to their errors and to /health 503, then to /health 200 after SIGCONT.
11. ``engine_restart``: the mock engine killed, then started again: the time to /health 503, and
    from its start to /health 200.
12. ``drain``: ``--api-server-count 2`` with streams holding the drain open: the time from SIGTERM
    (or a worker killed) to the first refused connection, and what the connections before it got.
13. ``bad_message``: two mock engines under streams, a truncated output message said to come from
    rank 1 (sent to the output address a HELLO in rank 1's name is told): how the streams ended.
14. ``templates``: ``--trust-request-chat-template`` with templates built to exhaust the server:
    status and time of each, and of a plain template after it; /health meanwhile.
15. ``health_port``: F clients reconnecting as fast as they can at ``--max-connections``; the share
    of /health probes (one per 100 ms, 1 s timeout) answered on ``--health-port`` and on the main
    port.
16. ``batch_limit``: 20,000 texts of 1 KB to /generate and /v1/completions; the time to the 400.
17. ``origin``: a POST without Content-Type from another origin, the server's own, and none, and
    a DNS-rebinding page (its own name in Host and Origin); the statuses.

What the probe of issue 38 broke, each against a quiet baseline in the same run:

18. ``grammar_stall`` (not in the default set: see ``ALL``): a plain stream's inter-token gaps
    (p50 / max) alone, then beside a constrained request whose every token is costly.
19. ``grammar_fair`` (not in the default set): one client's trivial JSON schema compiled alone,
    then while another client (another API key) compiles 8 distinct heavy regexes.
20. ``count_tokens``: a 30 MB prompt to /v1/messages/count_tokens: the time to the 400, RSS.
21. ``many_messages``: 300,000 empty chat messages, Responses reasoning items, Messages system
    blocks: the time to each 400.
22. ``template_queue``: a plain 100 KB completion alone, then beside 12 request templates that
    run to their time limit (``--trust-request-chat-template``); their statuses.
23. ``logprobs``: n=128 x 30,000 tokens x 20 top logprobs, not streamed: the time to the 400.
24. ``handshake``: two-frame messages on the handshake port, then the engine killed and started
    again (the time to /health 200), and a second engine saying HELLO as the serving rank
    (how the stream on the live one ended).
25. ``tls_idle``: 5,000 TCP connections to the HTTPS port that never start TLS
    (``--max-connections 64 --header-timeout 2``): a fresh TLS client's time to /health, alone
    and beside them, and the server's descriptors.

Environment: STREAMS=1000 STORM=500 SLOWLORIS=500 SOAK=20000 HUGE=8 HUGE_MB=20 HEADERS=16
HEADER_MB=32 FIELDS=12 FIELD_MB=25 ENGINE_STALL=2 DRAIN_S=5 FLOOD=2000 FLOOD_CAP=256
FLOOD_SECONDS=10 BATCH=20000 TLS_IDLE=5000, SCENARIOS=held,non_reading,storm,slowloris,soak,...
(a subset, in any order; all of them by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import multiprocessing
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from loadgen import free_port, pct, wait_port  # noqa: E402

STREAMS = int(os.environ.get("STREAMS", "1000"))
STORM = int(os.environ.get("STORM", "500"))
SLOWLORIS = int(os.environ.get("SLOWLORIS", "500"))
SOAK = int(os.environ.get("SOAK", "20000"))
HUGE = int(os.environ.get("HUGE", "8"))
HUGE_MB = float(os.environ.get("HUGE_MB", "20"))
HEADERS = int(os.environ.get("HEADERS", "16"))
HEADER_MB = float(os.environ.get("HEADER_MB", "32"))
FIELDS = int(os.environ.get("FIELDS", "12"))
FIELD_MB = float(os.environ.get("FIELD_MB", "25"))
ENGINE_STALL = float(os.environ.get("ENGINE_STALL", "2"))
DRAIN_S = float(os.environ.get("DRAIN_S", "5"))
FLOOD = int(os.environ.get("FLOOD", "2000"))
FLOOD_CAP = int(os.environ.get("FLOOD_CAP", "256"))
FLOOD_SECONDS = float(os.environ.get("FLOOD_SECONDS", "10"))
BATCH = int(os.environ.get("BATCH", "20000"))
TLS_IDLE = int(os.environ.get("TLS_IDLE", "5000"))
HEADER_TIMEOUT = 5.0
#: The server's limit on a request's line and headers (--h11-max-incomplete-event-size).
HEADER_LIMIT = 4 << 20
ALL = (
    "held,non_reading,storm,slowloris,soak,huge_prompt,headers,unknown_fields,role,engine_stall,"
    "engine_restart,drain,bad_message,templates,health_port,batch_limit,origin,count_tokens,"
    "many_messages,template_queue,logprobs,handshake,tls_idle"
)
# grammar_stall and grammar_fair are not in the default set: /generate checks a regex with RE2,
# which refuses a repetition past 1000, so \p{L}{3000} is a 400 before any grammar work and the
# two measure nothing yet; they need a heavy grammar the request checks admit (an ebnf or a
# JSON schema). tests/robustness/test_grammar_isolation.py measures both at the engine.
Row = tuple[str, str, str]


def _request(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
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
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
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
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n")
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


# ---- hostile requests (issue 28) -----------------------------------------------------------------


def _raw(
    method: str,
    path: str,
    body: bytes | dict | None = None,
    headers: tuple[tuple[str, str], ...] = (),
    *,
    json_type: bool = True,
) -> bytes:
    """One request as raw HTTP/1.1, ``Connection: close``."""
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    lines = [f"{method} {path} HTTP/1.1", "Host: localhost", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers]
    if body is not None:
        lines += ["Content-Type: application/json"] if json_type else []
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def _exchange(port: int, data: bytes, timeout: float = 120) -> tuple[int, bytes, float]:
    """Send one request and read its whole answer, blocking: (status, body, seconds). The server
    may answer and close before all of it went (a 431): what it answered is still read."""
    start = time.perf_counter()
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            c.sendall(data)
        while True:
            try:
                got = c.recv(1 << 16)
            except ConnectionResetError:
                break
            if not got:
                break
            answer += got
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return status, answer.split(b"\r\n\r\n", 1)[-1], time.perf_counter() - start


async def _exchanges(port: int, payloads: list[bytes]) -> list[tuple[int, bytes, float]]:
    """``_exchange`` of every payload at once (a thread each)."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(len(payloads)) as pool:
        return list(
            await asyncio.gather(
                *(loop.run_in_executor(pool, _exchange, port, p) for p in payloads)
            )
        )


def _statuses(results: list[tuple[int, bytes, float]]) -> str:
    """``400 x8`` (0: no answer)."""
    return ", ".join(f"{s} x{n}" for s, n in sorted(Counter(r[0] for r in results).items()))


def _rss(pid: int) -> float:
    return _proc_stats(pid)[0]


class _Rss:
    """The peak RSS (MiB) of process ``pid``, sampled every 20 ms while a scenario runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = _rss(pid)
        self._task: asyncio.Task | None = None

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, _rss(self.pid))
            await asyncio.sleep(0.02)

    def __enter__(self) -> _Rss:
        self._task = asyncio.ensure_future(self._sample())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.peak = max(self.peak, _rss(self.pid))


async def huge_prompt(port: int, pid: int) -> Row:
    body = json.dumps({"prompt": "7" * int(HUGE_MB * 1e6)}).encode()
    paths = ["/v1/completions", "/tokenize"]
    payloads = [_raw("POST", paths[i % 2], body) for i in range(HUGE)]
    before = _rss(pid)
    with _Health(port) as health, _Rss(pid) as rss:
        results = await _exchanges(port, payloads)
    await asyncio.sleep(1)
    took = [r[2] for r in results]
    refused = sum(r[0] == 400 and b"maximum context length" in r[1] for r in results)
    result = (
        f"{_statuses(results)} ({refused} past the context); {pct(took, 50):.2f} s each (p50), "
        f"max {max(took):.2f} s; RSS {before:.0f} / {rss.peak:.0f} / {_rss(pid):.0f} MiB "
        "(before / peak / after)"
    )
    return f"huge prompts ({HUGE} x {HUGE_MB:g} MB at once, no API key)", result, health.text()


async def headers(port: int, pid: int) -> Row:
    big = _raw("GET", "/health", headers=(("X-Big", "a" * int(HEADER_MB * (1 << 20))),))
    size = HEADER_LIMIT - (64 << 10)  # just under the limit: served
    within = _raw("GET", "/health", headers=(("X-Big", "a" * size),))
    before = _rss(pid)
    with _Health(port) as health:
        refused = await _exchanges(port, [big] * HEADERS)
        await asyncio.sleep(1)
        after_big = _rss(pid)
        served = [await asyncio.to_thread(_exchange, port, within) for _ in range(HEADERS)]
        await asyncio.sleep(1)
    took = [r[2] for r in refused]
    result = (
        f"{HEADER_MB:g} MB: {_statuses(refused)} in {pct(took, 50) * 1e3:.0f} ms (p50); "
        f"{size / (1 << 20):.2f} MiB: {_statuses(served)}; "
        f"RSS {before:.0f} / {after_big:.0f} / {_rss(pid):.0f} MiB (before / after the 431s / "
        "after the served)"
    )
    return (
        f"huge headers ({HEADERS} past the limit at once, {HEADERS} within)",
        result,
        health.text(),
    )


async def unknown_fields(port: int, pid: int) -> Row:
    marks = [_rss(pid)]
    results = []
    with _Health(port) as health:
        for k in range(FIELDS):
            name = "abcdefghijklmnopqrstuvwxyz"[k % 26] * int(FIELD_MB * 1e6)
            body = _raw("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1, name: 1})
            results.append(await asyncio.to_thread(_exchange, port, body))
            if k == 0:
                marks.append(_rss(pid))
    marks.append(_rss(pid))
    took = [r[2] for r in results]
    rss = " / ".join(f"{m:.0f}" for m in marks)
    result = (
        f"{_statuses(results)}, {pct(took, 50):.2f} s each (p50); RSS {rss} MiB "
        "(before / after the first / after the last)"
    )
    return f"unknown field names ({FIELDS} x {FIELD_MB:g} MB)", result, health.text()


async def role(port: int) -> Row:
    body = {"messages": [{"role": [1], "content": "hi"}]}
    out = []
    for path in ("/v1/chat/completions", "/tokenize"):
        status, answer, _ = await asyncio.to_thread(_exchange, port, _raw("POST", path, body))
        param = json.loads(answer)["error"].get("param") if status != 200 else None
        out.append(f"{path} {status} (param {param})")
    return '"role": [1]', "; ".join(out), "-"


async def batch_limit(port: int) -> Row:
    texts = ["x" * 1000] * BATCH
    out = []
    for path, body in (("/generate", {"text": texts}), ("/v1/completions", {"prompt": texts})):
        status, answer, took = await asyncio.to_thread(_exchange, port, _raw("POST", path, body))
        limit = b"limit is" in answer
        out.append(f"{path} {status}{' (limit)' if limit else ''} in {took:.2f} s")
    return f"batch past the limit ({BATCH} x 1 KB texts)", "; ".join(out), "-"


async def origin(port: int) -> Row:
    body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
    out = []
    for who, head in (
        ("another origin", (("Origin", "http://attacker.example"),)),
        ("its own", (("Origin", "http://localhost"),)),
        ("no Origin", ()),
        ("a rebinding page (Host and Origin its own name)", (("Origin", "http://rebind.example"),)),
    ):
        data = _raw("POST", "/v1/completions", body, head, json_type=False)
        if who.startswith("a rebinding"):
            data = data.replace(b"Host: localhost", b"Host: rebind.example", 1)
        status, _, _ = await asyncio.to_thread(_exchange, port, data)
        out.append(f"{who} {status}")
    return "POST without Content-Type, from a web page", "; ".join(out), "-"


# ---- servers of their own ----------------------------------------------------------------------


def _stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM, then SIGKILL for the process and whatever of its session is left."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def _server(*extra: str, timeout: float = 180) -> Iterator[tuple[int, subprocess.Popen]]:
    """``tokenwire serve`` with ``extra`` arguments, up (``/health`` 200) until the block ends."""
    port = free_port()
    cmd = [sys.executable, "-m", "tokenwire", "serve", "--port", str(port)]
    cmd += ["--disable-access-log", "--log-level", "warning", *extra]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_port(port, proc, timeout, path="/health")
        yield port, proc
    finally:
        _stop(proc)


def _mock(address: str, rank: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tokenwire", "mock-engine", "--handshake-address", address]
    cmd += ["--data-parallel-rank", str(rank), "--step-time-ms", "10"]
    cmd += ["--synthetic-output", "random", "--log-level", "warning"]
    return subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


class _Engines:
    """``tokenwire serve --engine vllm --handshake-address`` over ``tokenwire mock-engine``s."""

    def __init__(self, port: int, proc: subprocess.Popen, address: str, mocks: list) -> None:
        self.port = port
        self.proc = proc
        self.address = address
        self.mocks = mocks
        self.started_s = 0.0


@contextlib.contextmanager
def _engines(ranks: int, *extra: str) -> Iterator[_Engines]:
    address = f"tcp://127.0.0.1:{free_port()}"
    mocks: list[subprocess.Popen] = []
    t0 = time.perf_counter()
    try:
        mocks += [_mock(address, r) for r in range(ranks)]
        args = ["--engine", "vllm", "--handshake-address", address]
        args += ["--data-parallel-size", str(ranks), *extra]
        with _server(*args) as (port, proc):
            srv = _Engines(port, proc, address, mocks)
            srv.started_s = time.perf_counter() - t0
            yield srv
    finally:
        for m in mocks:
            _stop(m, 20)


class _Stream:
    """A streaming request read to its end: its body, when its first chunk came, when it
    ended."""

    def __init__(self, port: int, payload: bytes) -> None:
        self.body = b""
        self.first = asyncio.Event()
        self.ended = float("nan")
        self.task = asyncio.ensure_future(self._run(port, payload))

    async def _run(self, port: int, payload: bytes) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(payload)
        try:
            while chunk := await reader.read(1 << 16):
                self.body += chunk
                if b"data: " in self.body:
                    self.first.set()
                if b"data: [DONE]" in self.body[-len(chunk) - 16 :]:
                    break  # (the connection stays open: keep-alive)
        except OSError:
            pass
        finally:
            self.ended = time.perf_counter()
            self.first.set()
            writer.close()


async def _streams(port: int, count: int, tokens: int) -> list[_Stream]:
    """``count`` streams of ``tokens`` tokens each, once every one has its first chunk."""
    streams = [_Stream(port, _completion(tokens)) for _ in range(count)]
    await asyncio.wait_for(asyncio.gather(*(s.first.wait() for s in streams)), 60)
    return streams


async def _until_health(port: int, status: int, timeout: float = 60) -> float:
    """Seconds until /health answers ``status`` (polled every 20 ms); nan if it never does."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        with contextlib.suppress(OSError):
            if (await _get(port, "/health"))[0] == status:
                return time.perf_counter() - t0
        await asyncio.sleep(0.02)
    return float("nan")


async def _one(port: int) -> int:
    status, _, _ = await asyncio.to_thread(_exchange, port, _completion_close(4))
    return status


def _completion_close(tokens: int) -> bytes:
    body = {"prompt": "Hi", "max_tokens": tokens, "ignore_eos": True}
    return _raw("POST", "/v1/completions", body)


async def engine_stall() -> Row:
    with _engines(1, "--engine-stall-timeout", f"{ENGINE_STALL:g}") as srv:
        streams = await _streams(srv.port, 4, 3000)
        t0 = time.perf_counter()
        os.kill(srv.mocks[0].pid, signal.SIGSTOP)  # hung: connected, silent
        to_503 = await _until_health(srv.port, 503)
        await asyncio.wait_for(asyncio.gather(*(s.task for s in streams)), 60)
        errors = sum(b"is not answering" in s.body for s in streams)
        first = min(s.ended for s in streams) - t0
        os.kill(srv.mocks[0].pid, signal.SIGCONT)
        to_200 = await _until_health(srv.port, 200)
        after = await _one(srv.port)
    result = (
        f"{errors}/4 streams ended with an error {first:.1f} s after SIGSTOP; "
        f"/health 200 again {to_200:.2f} s after SIGCONT, "
        f"then a request {after}"
    )
    return (
        f"hung engine (SIGSTOP; --engine-stall-timeout {ENGINE_STALL:g})",
        result,
        f"503 {to_503:.1f} s after SIGSTOP",
    )


async def engine_restart() -> Row:
    with _engines(1) as srv:
        (stream,) = await _streams(srv.port, 1, 3000)
        t0 = time.perf_counter()
        srv.mocks[0].kill()
        to_503 = await _until_health(srv.port, 503)
        await asyncio.wait_for(stream.task, 30)
        died = b"the engine died" in stream.body
        srv.mocks.append(_mock(srv.address, 0))
        to_200 = await _until_health(srv.port, 200, 120)
        after = await _one(srv.port)
    result = (
        f"restarted mock-engine to /health 200: {to_200:.2f} s (a first start: "
        f"{srv.started_s:.2f} s), then a request {after}; the stream in flight "
        f"{'ended with an error' if died else 'did not end with an error'} "
        f"{stream.ended - t0:.2f} s after the kill"
    )
    return "dead engine (SIGKILL, then started again)", result, f"503 {to_503:.2f} s after the kill"


def _children(pid: int) -> list[tuple[int, str]]:
    """The live children of ``pid`` and their command lines."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append((int(entry), line))
    return out


async def _connect_probe(port: int) -> str:
    """What a new connection gets: refused, an answer to /health (its status), or nothing
    within 1 s (hung)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1)
    except ConnectionRefusedError:
        return "refused"
    except (OSError, asyncio.TimeoutError):
        return "failed"
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        line = await asyncio.wait_for(reader.readline(), 1)
        return f"answered {line.split()[1].decode()}" if line.startswith(b"HTTP/") else "closed"
    except asyncio.TimeoutError:
        return "hung"
    except OSError:
        return "reset"
    finally:
        writer.close()


async def _drain_once(how: str) -> Row:
    args = ["--api-server-count", "2", "--step-time-ms", "20"]
    args += ["--shutdown-timeout", f"{DRAIN_S:g}"]
    with _server(*args) as (port, proc):
        streams = await _streams(port, 2, 5000)  # they hold the drain open
        if how == "SIGTERM":
            t0 = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
        else:
            worker = next(p for p, line in _children(proc.pid) if " serve " in line)
            t0 = time.perf_counter()
            os.kill(worker, signal.SIGKILL)
        exited = asyncio.ensure_future(asyncio.to_thread(proc.wait, 60))
        probes: list[tuple[float, asyncio.Task]] = []
        refused_at = float("nan")
        while time.perf_counter() - t0 < 10:
            probes.append((time.perf_counter() - t0, asyncio.ensure_future(_connect_probe(port))))
            await asyncio.sleep(0.01)
            done = [at for at, task in probes if task.done() and task.result() == "refused"]
            if done:
                refused_at = min(done)
                break
        # What the connections tried before the first refused one got.
        outcomes = Counter([await task for at, task in probes if not at >= refused_at])
        await exited
        drained = time.perf_counter() - t0
        await asyncio.gather(*(s.task for s in streams))
    before = ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items())) or "none"
    result = (
        f"first refused connection {refused_at * 1e3:.0f} ms after it (tried every 10 ms; "
        f"before it: {before}); the server exited {drained:.1f} s after it"
    )
    return f"drain, --api-server-count 2 ({how})", result, "-"


async def drain() -> list[Row]:
    return [await _drain_once("SIGTERM"), await _drain_once("a worker killed")]


def _output_address(handshake: str, rank: int) -> str:
    """The frontend's output address, as it tells an engine that says HELLO in ``rank``'s name
    (a restarted engine is told the same addresses)."""
    import zmq

    from tokenwire.engine.vllm import protocol as wire

    ctx = zmq.Context()
    try:
        hs = ctx.socket(zmq.DEALER)
        hs.setsockopt(zmq.IDENTITY, wire.engine_identity(rank))
        hs.setsockopt(zmq.LINGER, 0)
        hs.setsockopt(zmq.RCVTIMEO, 10_000)
        hs.connect(handshake)
        hs.send(wire.encode_handshake("HELLO"))
        _, outputs = wire.decode_init(hs.recv())
        hs.close()
        return outputs[0]
    finally:
        ctx.destroy(linger=0)


def _send_truncated(address: str, rank: int) -> None:
    """An output message of engine ``rank`` cut short: it no longer decodes."""
    import zmq

    from tokenwire.engine.vllm import protocol as wire

    whole = wire.encode_outputs(wire.outputs_for_step(rank, [("r", [5, 6, 7], None, None)]))
    cut = whole[: len(whole) - 6]
    assert wire.engine_index_in(cut) == rank
    ctx = zmq.Context()
    try:
        push = ctx.socket(zmq.PUSH)
        push.connect(address)
        push.send(cut)
        push.close(linger=2000)
    finally:
        ctx.term()


async def bad_message() -> Row:
    with _engines(2) as srv:
        address = await asyncio.to_thread(_output_address, srv.address, 1)
        with _Health(srv.port) as health:
            streams = await _streams(srv.port, 8, 400)
            t0 = time.perf_counter()
            await asyncio.to_thread(_send_truncated, address, 1)
            await asyncio.wait_for(asyncio.gather(*(s.task for s in streams)), 60)
        bad = [s for s in streams if b"malformed engine output" in s.body]
        ran = sum(b'"finish_reason":"length"' in s.body for s in streams)
        after = [await _one(srv.port) for _ in range(8)]
        _, metrics, _ = await _get(srv.port, "/metrics")
        alive = next(
            (ln.rsplit(" ", 1)[1] for ln in metrics.decode().splitlines()
             if ln.startswith("tokenwire_engines_alive")),
            "?",
        )  # fmt: skip
    late = max((s.ended - t0 for s in bad), default=float("nan"))
    result = (
        f"{len(bad)}/8 ended with an error ('malformed engine output', the last "
        f"{late * 1e3:.0f} ms after the message was sent), {ran} ran to their length (the other "
        "engine's); then "
        f"{after.count(200)}/8 requests 200, engines alive {float(alive):.0f}"
    )
    return "undecodable engine message (rank 1 of 2, 8 streams)", result, health.text()


HOSTILE_TEMPLATES = {
    "a huge join": "{{ range(100000)|join(',' * 10000) }}",
    "a huge string": "{{ 'a' * 10**8 }}",
    "10^4 x 10^4 loops": (
        "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}"
    ),
    "a bigger string": "{{ 'a' * 10**10 }}",
}
PLAIN_TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"


async def _template(port: int, template: str) -> tuple[int, float]:
    body = {"messages": [{"role": "user", "content": "Hi"}], "chat_template": template}
    body["max_tokens"] = 2
    status, _, took = await asyncio.to_thread(
        _exchange, port, _raw("POST", "/v1/chat/completions", body)
    )
    return status, took


async def templates() -> list[Row]:
    rows = []
    with _server("--trust-request-chat-template", "--step-time-ms", "20") as (port, _):
        with _Health(port) as health:
            first = await _template(port, PLAIN_TEMPLATE)
            again = await _template(port, PLAIN_TEMPLATE)
        rows.append(
            (
                "request template: a plain one",
                f"{first[0]} in {first[1]:.2f} s (the worker starting), then {again[0]} in "
                f"{again[1] * 1e3:.0f} ms",
                health.text(),
            )
        )
        for name, template in HOSTILE_TEMPLATES.items():
            with _Health(port) as health:
                status, took = await _template(port, template)
                after = await _template(port, PLAIN_TEMPLATE)
            rows.append(
                (
                    f"request template: {name}",
                    f"{status} in {took:.2f} s; a plain one next {after[0]} in {after[1]:.2f} s",
                    health.text(),
                )
            )
    return rows


def _probe_ports(ports: list[int], seconds: float) -> dict[int, list[float | None]]:
    """/health on each port every 100 ms for ``seconds`` (a thread per port, in a process of its
    own so that the flood's event loop does not delay it): each probe's latency, or None when it
    got no 200 within 1 s."""
    out: dict[int, list[float | None]] = {p: [] for p in ports}

    def probe(port: int) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                status, _, took = _exchange(port, _raw("GET", "/health"), timeout=1)
                out[port].append(took if status == 200 and took <= 1 else None)
            except OSError:
                out[port].append(None)
            time.sleep(max(0.0, 0.1 - (time.perf_counter() - t0)))

    threads = [threading.Thread(target=probe, args=(p,)) for p in ports]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


async def health_port() -> Row:
    hp = free_port()
    args = ["--health-port", str(hp), "--max-connections", str(FLOOD_CAP), "--step-time-ms", "20"]
    with _server(*args) as (port, _):
        stop = False
        served = Counter()
        payload = _completion_close(4)

        async def client() -> None:
            while not stop:
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(payload)
                    line = await reader.readline()
                    served[line.split(b" ", 2)[1] if line.startswith(b"HTTP/") else b"closed"] += 1
                    await reader.read()
                    writer.close()
                except OSError:
                    served[b"failed"] += 1
                    await asyncio.sleep(0)

        flood = [asyncio.ensure_future(client()) for _ in range(FLOOD)]
        await asyncio.sleep(2)  # at the cap
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            got = await loop.run_in_executor(pool, _probe_ports, [hp, port], FLOOD_SECONDS)
        stop = True
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
    got = {int(k): v for k, v in got.items()}

    def share(lat: list[float | None]) -> str:
        ok = [x for x in lat if x is not None]
        return f"{len(ok)}/{len(lat)} ({100 * len(ok) / max(len(lat), 1):.0f}%)"

    answered = [x for x in got[hp] if x is not None]
    counts = ", ".join(f"{k.decode()} {n}" for k, n in served.most_common(3))
    result = (
        f"/health answered within 1 s: {share(got[hp])} on --health-port, {share(got[port])} on "
        f"the main port (the flood's requests: {counts})"
    )
    health = f"health port p50 {pct(answered, 50) * 1e3:.1f} / p99 {pct(answered, 99) * 1e3:.1f} ms"
    return (
        f"connection flood ({FLOOD} reconnecting clients, --max-connections {FLOOD_CAP})",
        result,
        health,
    )


# ---- issue 38 ------------------------------------------------------------------------------


async def _gaps(port: int, payload: bytes) -> list[float]:
    """A stream's gaps between the reads that brought tokens (seconds, sorted)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    times = []
    tail = b""
    try:
        while chunk := await reader.read(1 << 16):
            times.append(time.perf_counter())
            tail = (tail + chunk)[-32:]
            if b"data: [DONE]" in tail:
                break
    finally:
        writer.close()
    return sorted(b - a for a, b in itertools.pairwise(times[1:]))  # (after the first)


def _gap_text(gaps: list[float]) -> str:
    return f"gaps p50 {pct(gaps, 50) * 1e3:.0f} / max {max(gaps) * 1e3:.0f} ms"


HEAVY_REGEX = r"\p{L}{3000}"


def _generate_regex(regex: str, tokens: int, key: str | None = None) -> bytes:
    body = {"text": "Tell me.", "sampling_params": {"regex": regex, "max_new_tokens": tokens}}
    head = (("Authorization", f"Bearer {key}"),) if key else ()
    return _raw("POST", "/generate", body, head)


async def grammar_stall(port: int) -> Row:
    plain = _completion(150)
    quiet = await _gaps(port, plain)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_generate_regex(HEAVY_REGEX, 4000))  # (not read: it runs until hung up)
    await asyncio.sleep(6)  # its compile and first rollout, in the pool
    with _Health(port) as health:
        loaded = await _gaps(port, plain)
    writer.close()  # (the client goes: the request is aborted)
    result = f"alone: {_gap_text(quiet)}; beside {HEAVY_REGEX}: {_gap_text(loaded)}"
    return "a costly grammar beside a plain stream (150 tokens)", result, health.text()


async def grammar_fair() -> Row:
    props = {"a": {"type": "string"}, "b": {"type": "string"}}
    schema = {"type": "object", "properties": props}

    def chat(props: str) -> bytes:
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 16,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {**schema, "required": [props]}},
            },
        }
        return _raw("POST", "/v1/chat/completions", body, (("Authorization", "Bearer kb"),))

    with _server("--api-key", "ka", "kb", "--step-time-ms", "20") as (port, _):
        warm = await asyncio.to_thread(_exchange, port, _generate_regex("[ab]+", 4, "ka"))
        quiet = await asyncio.to_thread(_exchange, port, chat("a"))
        # (max_new_tokens 100: each is compiled, its rollout run, then refused as unfinishable)
        heavy = [_generate_regex(rf"\p{{L}}{{{3000 + i}}}", 100, "ka") for i in range(8)]
        pending = asyncio.ensure_future(_exchanges(port, heavy))
        await asyncio.sleep(0.5)
        loaded = await asyncio.to_thread(_exchange, port, chat("b"))
        took = [r[2] for r in await pending]
    result = (
        f"client B's schema alone {quiet[0]} in {quiet[2] * 1e3:.0f} ms; while client A compiles "
        f"8 heavy regexes {loaded[0]} in {loaded[2] * 1e3:.0f} ms (A's: {_statuses(await pending)}"
        f", the last after {max(took):.1f} s; warm-up {warm[0]})"
    )
    return "grammar compiles, two clients (API keys)", result, "-"


async def count_tokens(port: int, pid: int) -> Row:
    body = {"messages": [{"role": "user", "content": "7" * 30_000_000}]}
    before = _rss(pid)
    with _Health(port) as health, _Rss(pid) as rss:
        status, _, took = await asyncio.to_thread(
            _exchange, port, _raw("POST", "/v1/messages/count_tokens", body)
        )
    result = (
        f"{status} in {took:.2f} s; RSS {before:.0f} / {rss.peak:.0f} / {_rss(pid):.0f} MiB "
        "(before / peak / after)"
    )
    return "count_tokens, a 30 MB prompt", result, health.text()


async def many_messages(port: int) -> Row:
    empty = [{"role": "user", "content": ""}] * 300_000
    cases = {
        "chat": ("/v1/chat/completions", {"messages": empty, "max_tokens": 1}),
        "Responses reasoning items": (
            "/v1/responses",
            {"input": [{"type": "reasoning", "summary": []}] * 300_000},
        ),
        "Messages system blocks": (
            "/v1/messages",
            {
                "max_tokens": 1,
                "system": [{"type": "text", "text": ""}] * 300_000,
                "messages": [{"role": "user", "content": "x"}],
            },
        ),
    }
    out = []
    with _Health(port) as health:
        for name, (path, body) in cases.items():
            status, _, took = await asyncio.to_thread(_exchange, port, _raw("POST", path, body))
            out.append(f"{name} {status} in {took:.2f} s")
    return "300,000 messages or items", "; ".join(out), health.text()


async def template_queue() -> Row:
    plain = _raw("POST", "/v1/completions", {"prompt": "lorem ipsum " * 8500, "max_tokens": 2})
    slow = HOSTILE_TEMPLATES["10^4 x 10^4 loops"]
    with _server("--trust-request-chat-template", "--step-time-ms", "20") as (port, _):
        await _template(port, PLAIN_TEMPLATE)  # (the worker processes start)
        quiet = min([(await asyncio.to_thread(_exchange, port, plain))[2] for _ in range(2)])
        slow_ones = asyncio.gather(*(_template(port, slow) for _ in range(12)))
        await asyncio.sleep(0.3)
        with _Health(port) as health:
            status, _, loaded = await asyncio.to_thread(_exchange, port, plain)
        results = await slow_ones
    statuses = ", ".join(f"{s} x{n}" for s, n in sorted(Counter(r[0] for r in results).items()))
    result = (
        f"alone {quiet * 1e3:.0f} ms; beside the 12 templates {status} in {loaded * 1e3:.0f} ms "
        f"(the templates: {statuses})"
    )
    return "a plain 100 KB completion beside 12 slow request templates", result, health.text()


async def logprobs(port: int) -> Row:
    body = {"prompt": "hi", "n": 128, "max_tokens": 30_000, "logprobs": 20, "ignore_eos": True}
    status, answer, took = await asyncio.to_thread(
        _exchange, port, _raw("POST", "/v1/completions", body)
    )
    said = json.loads(answer)["error"]["message"][:60] if status == 400 else ""
    return (
        "n=128 x 30,000 tokens x 20 logprobs, not streamed",
        f"{status} in {took:.2f} s ({said}...)",
        "-",
    )


def _handshake_junk(address: str) -> None:
    import zmq

    from tokenwire.engine.vllm import protocol as wire

    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, wire.engine_identity(0))
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(address)
        for frames in ([b"a", b"b"], [b"\xc1"], [b"x", b"y", b"z"]):
            sock.send_multipart(frames)
        sock.close()
    finally:
        ctx.term()


async def handshake() -> list[Row]:
    rows = []
    with _engines(1) as e:
        await asyncio.to_thread(_handshake_junk, e.address)
        await asyncio.sleep(0.5)
        e.mocks[0].kill()
        await _until_health(e.port, 503, 20)
        t0 = time.perf_counter()
        e.mocks.append(_mock(e.address, 0))
        back = await _until_health(e.port, 200, 120)
        first = await _one(e.port)
        rows.append(
            (
                "handshake port: two-frame messages, then the engine restarted",
                f"restarted mock-engine to /health 200 in {time.perf_counter() - t0:.1f} s "
                f"({back:.1f} s polling), then a request {first}",
                "-",
            )
        )
        streams = await _streams(e.port, 1, 1500)
        e.mocks.append(_mock(e.address, 0))  # a second engine in rank 0's name
        await asyncio.gather(*(s.task for s in streams))
        body = streams[0].body
        ended = (
            "ran to its length" if b'"finish_reason":"length"' in body else "ended with an error"
        )
        rows.append(
            (
                "handshake port: a second engine says HELLO as the serving rank",
                f"the stream on the live engine {ended}; then a request {await _one(e.port)}",
                "-",
            )
        )
    return rows


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def tls_idle() -> Row:
    import resource

    import trustme

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, TLS_IDLE + 1024), hard))
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    with cert.private_key_pem.tempfile() as key, cert.cert_chain_pems[0].tempfile() as crt:
        args = ["--ssl-keyfile", key, "--ssl-certfile", crt, "--max-connections", "64"]
        args += ["--header-timeout", "2"]
        port = free_port()
        cmd = [sys.executable, "-m", "tokenwire", "serve", "--port", str(port)]
        cmd += ["--disable-access-log", "--log-level", "warning", *args]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)

        def fresh() -> float | None:
            start = time.perf_counter()
            while time.perf_counter() - start < 30:
                with (
                    contextlib.suppress(OSError, ssl.SSLError),
                    socket.create_connection(("127.0.0.1", port), timeout=2) as raw,
                    ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
                ):
                    tls.sendall(
                        b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
                    )
                    if tls.recv(64).startswith(b"HTTP/1.1 200"):
                        return time.perf_counter() - start
                time.sleep(0.1)
            return None

        try:
            deadline = time.perf_counter() + 180
            while await asyncio.to_thread(fresh) is None:
                if time.perf_counter() > deadline:
                    raise RuntimeError("the TLS server did not start")
            quiet = min(t for t in [await asyncio.to_thread(fresh) for _ in range(3)] if t)
            idle = []
            for _ in range(TLS_IDLE):
                with contextlib.suppress(OSError):
                    idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            peak = _fds(proc.pid)
            loaded = await asyncio.to_thread(fresh)
            peak = max(peak, _fds(proc.pid))
            for sock in idle:
                sock.close()
        finally:
            _stop(proc)
    got = "none in 30 s" if loaded is None else f"{loaded * 1e3:.0f} ms"
    result = (
        f"a fresh TLS client's /health: alone {quiet * 1e3:.0f} ms, beside {len(idle)} idle "
        f"connections {got}; server descriptors at most {peak}"
    )
    return f"{TLS_IDLE} TCP connections that never start TLS (--max-connections 64)", result, "-"


async def main_async(port: int, pid: int) -> list[Row]:
    chosen = os.environ.get("SCENARIOS", ALL).split(",")
    scenarios = {
        "held": lambda: held(port),
        "non_reading": lambda: non_reading(port),
        "storm": lambda: storm(port),
        "slowloris": lambda: slowloris(port),
        "soak": lambda: soak(port, pid),
        "huge_prompt": lambda: huge_prompt(port, pid),
        "headers": lambda: headers(port, pid),
        "unknown_fields": lambda: unknown_fields(port, pid),
        "role": lambda: role(port),
        "engine_stall": engine_stall,
        "engine_restart": engine_restart,
        "drain": drain,
        "bad_message": bad_message,
        "templates": templates,
        "health_port": health_port,
        "batch_limit": lambda: batch_limit(port),
        "origin": lambda: origin(port),
        "grammar_stall": lambda: grammar_stall(port),
        "grammar_fair": grammar_fair,
        "count_tokens": lambda: count_tokens(port, pid),
        "many_messages": lambda: many_messages(port),
        "template_queue": template_queue,
        "logprobs": lambda: logprobs(port),
        "handshake": handshake,
        "tls_idle": tls_idle,
    }
    rows: list[Row] = []
    for name in chosen:
        got = await scenarios[name]()
        rows += got if isinstance(got, list) else [got]
    return rows


def main() -> None:
    args = [
        "--step-time-ms", "20", "--max-batch-size", "4096",
        "--max-concurrent-requests", "8192", "--header-timeout", str(HEADER_TIMEOUT),
    ]  # fmt: skip
    with _server(*args) as (port, proc):
        rows = asyncio.run(main_async(port, proc.pid))
    print("| scenario | result | /health meanwhile |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
