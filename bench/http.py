"""HTTP streaming benchmark: tokenwire serving the synthetic engine at step time 0, against a bare
ASGI app that streams pre-built SSE chunks of the same sizes (the HTTP stack's own ceiling).

    python bench/http.py                     (C = 64, 256, 1024 concurrent streaming requests)
    SERVERS=uvicorn,granian python bench/http.py     (the ceiling under each server)

Each server runs in its own process pinned to one core (CPU 0); this process is the load generator
(pinned to CPU 1): C concurrent streaming ``/v1/completions`` requests, each for ``TOKENS``
tokens (random output, ``ignore_eos``), over raw asyncio connections so the client stays cheap.
Reported side by side: streamed tokens/s, time to first token and inter-chunk latency
percentiles, each one's share of the best ceiling (the median of per-round ratios), and each
server process's CPU time per streamed token, user and kernel apart (medians of the rounds): the
kernel's part is mostly the sends, which the ceiling pays too, and differs with how many chunks
go in one send (``/proc`` counts clock ticks of 10 ms: at C=256, about 0.3 µs per token).

``STEP_MS`` gives the synthetic engine a step time (default 0): with a real engine's step time
the stack is not the bound, and the server CPU per token is what to compare. ``BASELINE=DIR``
also serves tokenwire from another checkout's source folder (``DIR`` is its ``src``) as
``tokenwire@baseline``, in the same rounds: a change measured side by side with the code before it.

``SERVERS`` runs the ceiling app under each of: ``uvicorn`` (httptools, uvloop; the default and
what ``tokenwire serve`` runs on), ``granian`` (its ASGI interface, one worker, uvloop),
``granian-rsgi`` (the same chunks through granian's native RSGI interface) and ``hypercorn``
(uvloop); granian and hypercorn come with the ``bench`` extra. All servers are up at once and
idle when not loaded; rounds alternate between them.
Environment: CONCURRENCY=64,256,1024  TOKENS=128  ROUNDS=5  SERVERS=uvicorn  STEP_MS=0  BASELINE.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# This file is named http.py: keep its folder behind the standard library (whose http package it
# would shadow) but on the path, for loadgen.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402

from loadgen import free_port, load, load_measured, request_bytes, summary, wait_port  # noqa: E402

TOKENS = int(os.environ.get("TOKENS", "128"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
SERVERS = ("uvicorn", "granian", "granian-rsgi", "hypercorn")
MODEL = "Qwen/Qwen3-0.6B"


# ---- the ceiling: a bare ASGI app streaming pre-built chunks -------------------------------------


def _ceiling_chunks() -> list[bytes]:
    texts = [" the", " quick", " brown", " fox", ",", " 你好", " world", "!"]
    head = (
        '{"id":"cmpl-0123456789abcdef0123456789abcdef","object":"text_completion",'
        f'"created":1700000000,"model":"{MODEL}","choices":[{{"index":0,"text":'
    )
    chunks = []
    for i in range(TOKENS):
        reason = '"length"' if i == TOKENS - 1 else "null"
        body = (
            head
            + json.dumps(texts[i % len(texts)], ensure_ascii=False)
            + f',"logprobs":null,"finish_reason":{reason}'
            + (',"stop_reason":null' if i == TOKENS - 1 else "")
            + "}]}"
        )
        chunks.append(b"data: " + body.encode() + b"\n\n")
    chunks[-1] += b"data: [DONE]\n\n"
    return chunks


async def ceiling_app(scope, receive, send):  # pragma: no cover - runs in its own process
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    for chunk in CHUNKS:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await asyncio.sleep(0)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class CeilingRSGI:  # pragma: no cover - runs in its own process
    """The ceiling app on granian's RSGI interface: the same chunks, one ``send_bytes`` each."""

    async def __rsgi__(self, scope, proto):
        await proto()  # the request body
        transport = proto.response_stream(200, [("content-type", "text/event-stream")])
        for chunk in CHUNKS:
            await transport.send_bytes(chunk)
            await asyncio.sleep(0)


CHUNKS = _ceiling_chunks()


def serve_ceiling(server: str, port: int) -> None:  # pragma: no cover - its own process
    """Serve the ceiling app on ``port`` under ``server`` (one of ``SERVERS``), pinned to CPU 0."""
    os.sched_setaffinity(0, {0})  # threads started from here on (granian's too) inherit it
    if server == "uvicorn":
        import uvicorn

        uvicorn.run(
            ceiling_app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
        )
    elif server in ("granian", "granian-rsgi"):
        from granian import Granian

        rsgi = server == "granian-rsgi"
        app = CeilingRSGI() if rsgi else ceiling_app
        Granian(
            "ceiling",  # a name only: the loader below hands over the app itself
            address="127.0.0.1",
            port=port,
            interface="rsgi" if rsgi else "asgi",
            http="1",
            loop="uvloop",
            backlog=2048,  # uvicorn's
            backpressure=1 << 16,  # never queue requests: the load decides concurrency
            log_level="warning",
        ).serve(target_loader=lambda: app, wrap_loader=False)
    elif server == "hypercorn":
        import uvloop
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.backlog = 2048  # uvicorn's
        config.loglevel = "WARNING"
        uvloop.run(serve(ceiling_app, config))
    else:
        raise SystemExit(f"unknown server {server!r}: one of {', '.join(SERVERS)}")


def _start(kind: str, port: int) -> subprocess.Popen:
    env = None
    if kind == "tokenwire@baseline":
        env = {**os.environ, "PYTHONPATH": os.environ["BASELINE"]}
    if kind.startswith("tokenwire"):
        cmd = [
            sys.executable,
            "-m",
            "tokenwire",
            "serve",
            "--port",
            str(port),
            "--cpu",
            "0",
            "--step-time-ms",
            os.environ.get("STEP_MS", "0"),
            "--synthetic-output",
            "random",
            "--max-batch-size",
            "4096",
            "--max-concurrent-requests",
            "100000",
            "--log-level",
            "warning",
        ]
    else:  # "ceiling" or "ceiling/SERVER"
        server = kind.partition("/")[2] or "uvicorn"
        cmd = [sys.executable, str(Path(__file__)), "ceiling-server", str(port), server]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "ceiling-server":
        serve_ceiling(sys.argv[3] if len(sys.argv) > 3 else "uvicorn", int(sys.argv[2]))
        return
    if os.cpu_count() and os.cpu_count() > 1:
        os.sched_setaffinity(0, {1})
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    levels = [int(c) for c in os.environ.get("CONCURRENCY", "64,256,1024").split(",")]
    servers = os.environ.get("SERVERS", "uvicorn").split(",")
    unknown = set(servers) - set(SERVERS)
    if unknown:
        raise SystemExit(f"SERVERS: unknown {', '.join(sorted(unknown))} (one of {SERVERS})")
    ceilings = ["ceiling"] if servers == ["uvicorn"] else [f"ceiling/{s}" for s in servers]
    # Every server up (idle when not loaded, all pinned to CPU 0); rounds alternate between them
    # so that drifts in machine speed hit all alike.
    tokenwires = (
        ["tokenwire", "tokenwire@baseline"] if os.environ.get("BASELINE") else ["tokenwire"]
    )
    ports = {k: free_port() for k in [*ceilings, *tokenwires]}
    procs = {k: _start(k, p) for k, p in ports.items()}
    rows = []
    try:
        payloads = {k: request_bytes(p, MODEL, TOKENS) for k, p in ports.items()}
        for k, p in ports.items():
            wait_port(p, procs[k])
            asyncio.run(load(p, 16, payloads[k], TOKENS))  # warm-up
        for c in levels:
            runs: dict[str, list[dict]] = {k: [] for k in ports}
            for _ in range(ROUNDS):
                for kind, port in ports.items():
                    pid = procs[kind].pid
                    # (granian serves from a worker process: count the server's children)
                    run = load_measured(pid, port, c, payloads[kind], TOKENS, children=True)
                    runs[kind].append(asyncio.run(run))
            # The best ceiling at this C (by median tokens/s); shares are paired per round.
            best = max(ceilings, key=lambda k: summary(runs[k])["tokens_per_s"])
            for kind in ports:
                ratios = sorted(
                    r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(runs[kind], runs[best])
                )
                rec = {"impl": kind, "C": c, **summary(runs[kind])}
                rec["share"] = round(ratios[len(ratios) // 2], 3)
                print(json.dumps(rec), flush=True)
                rows.append(rec)
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(10)
    print(
        "\n| C | server | tokens/s (median) | share of best ceiling (median of paired rounds) "
        "| server CPU µs/token: user + kernel | TTFT p50 / p99 ms | ITL p50 / p99 ms |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['C']} | {r['impl']} | {r['tokens_per_s']:,} | {r['share']:.2f} "
            f"| {r['user_us_per_token']:.1f} + {r['sys_us_per_token']:.1f} "
            f"| {r['ttft_p50_ms']} / {r['ttft_p99_ms']} | {r['itl_p50_ms']} / {r['itl_p99_ms']} |"
        )


if __name__ == "__main__":
    main()
