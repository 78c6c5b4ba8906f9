"""HTTP streaming benchmark: tokenwire serving the synthetic engine at step time 0, against a bare
ASGI app that streams pre-built SSE chunks of the same sizes (the HTTP stack's own ceiling).

    python bench/http.py                     (C = 64, 256, 1024 concurrent streaming requests)

Each server runs in its own process pinned to one core (CPU 0); this process is the load generator
(pinned to CPU 1): C concurrent streaming ``/v1/completions`` requests, each for ``TOKENS``
tokens (random output, ``ignore_eos``), over raw asyncio connections so the client stays cheap.
Reported side by side: streamed tokens/s, time to first token and inter-chunk latency
percentiles, and tokenwire's share of the ceiling.
Environment: CONCURRENCY=64,256,1024  TOKENS=128  ROUNDS=5.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# This file is named http.py: keep it from shadowing the standard library's http package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402

from loadgen import free_port, load, request_bytes, summary, wait_port  # noqa: E402

TOKENS = int(os.environ.get("TOKENS", "128"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
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


CHUNKS = _ceiling_chunks()


def _start(kind: str, port: int) -> subprocess.Popen:
    if kind == "tokenwire":
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
            "0",
            "--synthetic-output",
            "random",
            "--max-batch-size",
            "4096",
            "--max-concurrent-requests",
            "100000",
            "--log-level",
            "warning",
        ]
    else:
        cmd = [sys.executable, str(Path(__file__)), "ceiling-server", str(port)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "ceiling-server":
        import uvicorn

        os.sched_setaffinity(0, {0})
        uvicorn.run(
            ceiling_app,
            host="127.0.0.1",
            port=int(sys.argv[2]),
            log_level="warning",
            access_log=False,
        )
        return
    if os.cpu_count() and os.cpu_count() > 1:
        os.sched_setaffinity(0, {1})
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    levels = [int(c) for c in os.environ.get("CONCURRENCY", "64,256,1024").split(",")]
    # Both servers up (idle when not loaded, both pinned to CPU 0); rounds alternate between them
    # so that drifts in machine speed hit both alike.
    ports = {"ceiling": free_port(), "tokenwire": free_port()}
    procs = {k: _start(k, p) for k, p in ports.items()}
    rows = []
    try:
        payloads = {k: request_bytes(p, MODEL, TOKENS) for k, p in ports.items()}
        for k, p in ports.items():
            wait_port(p, procs[k])
            asyncio.run(load(p, 16, payloads[k], TOKENS))  # warm-up
        for c in levels:
            runs: dict[str, list[dict]] = {"ceiling": [], "tokenwire": []}
            for _ in range(ROUNDS):
                for kind, port in ports.items():
                    runs[kind].append(asyncio.run(load(port, c, payloads[kind], TOKENS)))
            ratios = [
                t["tokens_per_s"] / e["tokens_per_s"]
                for t, e in zip(runs["tokenwire"], runs["ceiling"])
            ]
            for kind in ports:
                rec = {"impl": kind, "C": c, **summary(runs[kind])}
                rec["share"] = (
                    round(sorted(ratios)[len(ratios) // 2], 3) if kind == "tokenwire" else 1.0
                )
                print(json.dumps(rec), flush=True)
                rows.append(rec)
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(10)
    print(
        "\n| C | server | tokens/s (median) | share of ceiling (median of paired rounds) "
        "| TTFT p50 / p99 ms | ITL p50 / p99 ms |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['C']} | {r['impl']} | {r['tokens_per_s']:,} | {r['share']:.2f} "
            f"| {r['ttft_p50_ms']} / {r['ttft_p99_ms']} | {r['itl_p50_ms']} / {r['itl_p99_ms']} |"
        )


if __name__ == "__main__":
    main()
