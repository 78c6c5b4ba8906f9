"""Embeddings benchmark: stock ``vllm serve`` (its Python API server) and ``tokenwire serve
--engine vllm``, each over its own engine of the same kind, in one run.

    python scripts/vllm_cpu_env.py     # once: the vLLM CPU environment and the tiny BERT model
    python bench/pooling.py            # over tokenwire mock-engine (--runner pooling)
    python bench/pooling.py --real     # over the real tiny-BERT vLLM engine

``/v1/embeddings`` requests of BATCH inputs each (``BATCHES``, default 1 and 64; the inputs are
short sentences, different in every request), C at a time (``CONCURRENCY``, default 16) on
keep-alive connections, a round sending ``INPUTS`` inputs (default 4096). Mock mode: each
frontend waits for a remote engine (vLLM: ``--data-parallel-size-local 0``; tokenwire:
``--handshake-address``) and a ``tokenwire mock-engine --runner pooling`` dials it (step time 0,
the synthetic engine's vectors of the model's size, tensors in vLLM's frames). Real mode: each
frontend with its own engine on the tiny BERT model. Frontends are pinned to CPU 0, engines and
this load generator to CPU 1; rounds alternate between the frontends (``ROUNDS``, default 3,
the median kept). The table gives embeddings per second, request latency, and each frontend
process's own CPU time per input (all its threads, the scheduler's count: with two cores shared
by the load generator and the engine, throughput may be bound elsewhere, while CPU per input is
what the frontend itself costs). ``FRONTENDS=vllm,tokenwire``, ``ENCODING=float`` (or base64).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from loadgen import cpu_ns, free_port, pct, wait_port  # noqa: E402

NAME = "tiny-embed"
BATCHES = [int(x) for x in os.environ.get("BATCHES", "1,64").split(",")]
CONCURRENCY = int(os.environ.get("CONCURRENCY", "16"))
INPUTS = int(os.environ.get("INPUTS", "4096"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
ENCODING = os.environ.get("ENCODING", "float")
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "near",
    "river",
    "bank",
    "under",
    "bright",
    "moon",
]


def _env() -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "vllm_cpu_env.py"), "--check"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit("build the vLLM CPU environment first: python scripts/vllm_cpu_env.py")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spawn(argv: list[str], cpu: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1", VLLM_HOST_IP="127.0.0.1")
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["taskset", "-c", str(cpu), *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def _mock(address: str, model: str, log: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tokenwire", "mock-engine", "--handshake-address", address]
    argv += ["--tokenizer", model, "--runner", "pooling", "--step-time-ms", "0"]
    argv += ["--embedding-dim", "128", "--max-model-len", "256", "--max-batch-size", "256"]
    return _spawn([*argv, "--log-level", "warning"], 1, log)


def servers(kinds: list[str], real: bool, env: dict[str, str], logs: Path) -> dict:
    """Each frontend and its engine: ``{kind: (port, [frontend, engine...])}``."""
    model, vllm = env["embed_model"], env["vllm"]
    vargs = ["--enforce-eager", "--dtype", "float32"]
    out: dict[str, tuple[int, list[subprocess.Popen]]] = {}
    for kind in kinds:
        port = free_port()
        if kind == "vllm":
            argv = [vllm, "serve", model, "--port", str(port), "--served-model-name", NAME]
            argv += ["--disable-log-stats", "--uvicorn-log-level", "warning"]
            if real:
                out[kind] = (port, [_spawn([*argv, *vargs], 0, logs / "vllm.log")])
                continue
            rpc = free_port()
            argv += ["--data-parallel-size", "1", "--data-parallel-size-local", "0"]
            argv += ["--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc)]
            front = _spawn(argv, 0, logs / "vllm.log")
            engine = _mock(f"tcp://127.0.0.1:{rpc}", model, logs / "vllm-engine.log")
            out[kind] = (port, [front, engine])
        else:
            argv = [sys.executable, "-m", "tokenwire", "serve", "--engine", "vllm"]
            argv += ["--port", str(port), "--served-model-name", NAME, "--log-level", "warning"]
            argv += ["--max-concurrent-requests", "100000", "--disable-access-log"]
            if real:
                argv += ["--model", model, "--vllm-command", vllm]
                argv += [f"--vllm-arg={a}" for a in vargs]
                out[kind] = (port, [_spawn(argv, 0, logs / "tokenwire.log")])
                continue
            rpc = free_port()
            argv += ["--tokenizer", model, "--handshake-address", f"tcp://127.0.0.1:{rpc}"]
            front = _spawn(argv, 0, logs / "tokenwire.log")
            engine = _mock(f"tcp://127.0.0.1:{rpc}", model, logs / "tokenwire-engine.log")
            out[kind] = (port, [front, engine])
    return out


def _texts(start: int, count: int) -> list[str]:
    n = len(WORDS)
    return [
        f"Sentence {start + i}: " + " ".join(WORDS[(start + i + k) % n] for k in range(8))
        for i in range(count)
    ]


def _request(port: int, texts: list[str]) -> bytes:
    body = json.dumps({"model": NAME, "input": texts, "encoding_format": ENCODING}).encode()
    return (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _worker(port: int, queue: list[bytes], latencies: list[float], bad: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while queue:
            payload = queue.pop()
            t0 = time.perf_counter()
            writer.write(payload)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - t0)
            if not head.startswith(b"HTTP/1.1 200"):
                bad.append(1)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def round_(pid: int, port: int, batch: int, seed: int, inputs: int = INPUTS) -> dict:
    """One round: ``inputs`` inputs in requests of ``batch``, ``CONCURRENCY`` at a time."""
    count = max(inputs // batch, CONCURRENCY)
    queue = [_request(port, _texts(seed * 100_000 + i * batch, batch)) for i in range(count)]
    latencies: list[float] = []
    bad: list[int] = []
    ns0 = cpu_ns(pid)
    t0 = time.perf_counter()
    await asyncio.gather(*(_worker(port, queue, latencies, bad) for _ in range(CONCURRENCY)))
    wall = time.perf_counter() - t0
    ns1 = cpu_ns(pid)
    inputs = count * batch
    return {
        "embeddings_per_s": inputs / wall,
        "cpu_us_per_input": (ns1 - ns0) / inputs / 1e3,
        "p50_ms": pct(latencies, 50) * 1e3,
        "p99_ms": pct(latencies, 99) * 1e3,
        "failed": len(bad),
    }


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="over real vLLM engines")
    args = parser.parse_args()
    env = _env()
    kinds = os.environ.get("FRONTENDS", "vllm,tokenwire").split(",")
    logs = Path(tempfile.mkdtemp(prefix="tokenwire-bench-pooling-"))
    os.sched_setaffinity(0, {1})
    running = servers(kinds, args.real, env, logs)
    try:
        for port, procs in running.values():
            wait_port(port, procs[0], timeout=900, path="/health")
            # (a warm-up round: what each frontend does lazily is done before the measures)
            asyncio.run(round_(procs[0].pid, port, 4, 99, inputs=256))
        results: dict[tuple[str, int], list[dict]] = {}
        for r in range(ROUNDS):
            for batch in BATCHES:
                order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
                for kind in order:
                    port, procs = running[kind]
                    got = asyncio.run(round_(procs[0].pid, port, batch, r))
                    results.setdefault((kind, batch), []).append(got)
    finally:
        _stop([p for _, procs in running.values() for p in procs])
    mode = "real tiny-BERT vLLM engine" if args.real else "tokenwire mock-engine"
    print(f"\n/v1/embeddings over {mode}, {CONCURRENCY} requests at a time, {ENCODING}")
    print("| frontend | inputs/request | embeddings/s | p50 ms | p99 ms | CPU µs/input | failed |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for batch in BATCHES:
        for kind in kinds:
            runs = sorted(results[(kind, batch)], key=lambda x: x["embeddings_per_s"])
            m = runs[len(runs) // 2]
            print(
                f"| {kind} | {batch} | {m['embeddings_per_s']:.0f} | {m['p50_ms']:.1f} | "
                f"{m['p99_ms']:.1f} | {m['cpu_us_per_input']:.0f} | {m['failed']} |"
            )
    print(f"(logs in {logs})")


if __name__ == "__main__":
    main()
