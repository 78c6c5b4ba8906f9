"""Routing benchmark: a fleet of four engines that model vLLM's prefix cache, behind each
frontend in turn, under one workload of shared system prompts: prefix-cache hit rate and time to
first token.

    python scripts/bench_env.py        # once: smg from PyPI (its cache-aware policy)
    python bench/routing.py            # every frontend below, one after the other
    python bench/routing.py --real     # tokenwire over the real CPU engine with two ranks

Each frontend gets four fresh ``tokenwire mock-engine`` processes (cold caches) with vLLM's
block pool modelled: blocks of 16 tokens, ``--num-gpu-blocks-override`` blocks each (room for
about a third of the system prompts), a prompt's uncached tokens costing
``--prefill-time-per-token-ms`` each before its first token, one prompt after the other, decode
steps of ``STEP_MS``. The workload: ``SYSTEMS`` system prompts of about ``SYSTEM_TOKENS`` tokens,
each asked by ``USERS`` users (a short question after it), in a shuffled order (the same for every
frontend), ``CONCURRENCY`` at a time, ``TOKENS`` tokens out, streamed.

Frontends (``FRONTENDS``):

- ``tw-prefix``: ``tokenwire serve --routing prefix`` over engines publishing KV-cache events;
- ``tw-prefix-approx``: the same over engines that publish none (tokenwire's approximate index);
- ``tw-fewest``: ``--routing fewest`` (vLLM's data-parallel rule);
- ``tw-round-robin``: ``--routing round-robin``;
- ``smg-cache-aware``: SGLang's Rust gateway, ``--policy cache_aware`` (its defaults), over
  the same engines.

The hit rate is the engines' own count (prompt tokens found cached over prompt tokens, from each
mock engine's ``--stats-file``); TTFT is the client's, first streamed token. Frontends, engines
and this load generator share the machine's cores.

``--real``: ``tokenwire serve --model M --data-parallel-size 2`` spawning the real vLLM CPU engine
on the tiny model (its 128-token blocks), ``--routing prefix`` (its KV-cache events configured by
tokenwire) and ``--routing fewest`` in turn, ``REAL_SYSTEMS`` system prompts of about 400 tokens
× ``REAL_USERS`` users, ``REAL_CONCURRENCY`` at a time: the hit rate is what the engines say in
each response's ``usage.prompt_tokens_details.cached_tokens``.
Each frontend runs ``ROUNDS`` times (fresh engines each time, the frontends in a rotated order
each round); the table gives each figure's median over its rounds.
Environment: FRONTENDS, ROUNDS=3, SYSTEMS=32, USERS=16, SYSTEM_TOKENS=1000, CONCURRENCY=32,
TOKENS=16, STEP_MS=5, PREFILL_MS=0.05, BLOCKS=1200, SEED=0; REAL_SYSTEMS=8, REAL_USERS=6,
REAL_CONCURRENCY=4.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from frontend import smg_handshake_port  # noqa: E402
from loadgen import free_port, load, pct, raise_open_files, request_bytes, wait_port  # noqa: E402

SYSTEMS = int(os.environ.get("SYSTEMS", "32"))
USERS = int(os.environ.get("USERS", "16"))
SYSTEM_TOKENS = int(os.environ.get("SYSTEM_TOKENS", "1000"))
CONCURRENCY = int(os.environ.get("CONCURRENCY", "32"))
TOKENS = int(os.environ.get("TOKENS", "16"))
STEP_MS = os.environ.get("STEP_MS", "5")
PREFILL_MS = os.environ.get("PREFILL_MS", "0.05")
BLOCKS = os.environ.get("BLOCKS", "1200")
SEED = int(os.environ.get("SEED", "0"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
REAL_SYSTEMS = int(os.environ.get("REAL_SYSTEMS", "8"))
REAL_USERS = int(os.environ.get("REAL_USERS", "6"))
REAL_CONCURRENCY = int(os.environ.get("REAL_CONCURRENCY", "4"))
ENGINES = 4
NAME = "tiny"
MAX_LEN = 4096
ALL = "tw-prefix,tw-prefix-approx,tw-fewest,tw-round-robin,smg-cache-aware"


def _spawn(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


def _mock(address: str, rank: int, tokenizer: str, stats: Path, log: Path, kv: str | None):
    argv = [sys.executable, "-m", "tokenwire", "mock-engine", "--handshake-address", address]
    argv += ["--data-parallel-rank", str(rank), "--tokenizer", tokenizer]
    argv += ["--step-time-ms", STEP_MS, "--prefill-time-per-token-ms", PREFILL_MS]
    argv += ["--num-gpu-blocks-override", BLOCKS, "--block-size", "16"]
    argv += ["--synthetic-output", "random", "--max-model-len", str(MAX_LEN)]
    argv += ["--stats-file", str(stats), "--log-level", "warning"]
    if kv is not None:
        argv += ["--kv-events-config", kv]
    return _spawn(argv, log)


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


def prompts(
    tokenizer: str, systems: int = SYSTEMS, users: int = USERS, length: int = SYSTEM_TOKENS
) -> list[str]:
    """The workload: every user of every system prompt, shuffled (seeded)."""
    from tokenwire import Tokenizer

    tok = Tokenizer.from_pretrained(tokenizer)
    text = (REPO / "tests" / "data" / "corpus.txt").read_text(encoding="utf-8")
    ids = tok.encode(text)
    while len(ids) < length * 2:
        ids = ids + ids
    bodies = []
    for j in range(systems):
        start = (j * 997) % (len(ids) - length)
        body = tok.decode(ids[start : start + length - 16])
        bodies.append(f"System prompt {j}. You are assistant number {j}. {body}")
    out = [f"{s}\n\nUser {u} asks: question {u} about topic {j}?" for j, s in enumerate(bodies)
           for u in range(users)]  # fmt: skip
    random.Random(SEED).shuffle(out)
    return out


def run_one(kind: str, model: str, smg: str | None, work: list[str], logdir: Path) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"tokenwire-routing-{kind}-"))
    procs: list[subprocess.Popen] = []
    stats = [tmp / f"engine-{r}.json" for r in range(ENGINES)]
    port = free_port()
    try:
        if kind.startswith("smg"):
            assert smg is not None
            folder = tempfile.mkdtemp(prefix="tokenwire-smg-")  # (mode 0700, as smg wants)
            workers = [f"ipc://{folder}/engine-{r}" for r in range(ENGINES)]
            argv = [smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--backend"]
            argv += ["vllm", "--worker-urls", *workers, "--model-path", model]
            argv += ["--model-alias", f"{NAME}={model}", "--prometheus-port", str(free_port())]
            argv += ["--log-level", "warn", "--policy", "cache_aware"]
            argv += ["--max-concurrent-requests", "0"]
            procs.append(_spawn(argv, logdir / f"{kind}.log"))
            for r, worker in enumerate(workers):
                address = f"tcp://127.0.0.1:{smg_handshake_port(worker)}"
                log = logdir / f"{kind}-engine-{r}.log"
                procs.append(_mock(address, 0, model, stats[r], log, None))
            ready = "/readiness"
        else:
            policy = {"tw-fewest": "fewest", "tw-round-robin": "round-robin"}.get(kind, "prefix")
            rpc = free_port()
            address = f"tcp://127.0.0.1:{rpc}"
            kv = None
            if kind == "tw-prefix":
                # (the engines connect to ports tokenwire binds on the loopback)
                kv = json.dumps({"enable_kv_cache_events": True,
                                 "endpoint": f"tcp://127.0.0.1:{free_port()}"})  # fmt: skip
            argv = [sys.executable, "-m", "tokenwire", "serve", "--engine", "vllm"]
            argv += ["--tokenizer", model, "--handshake-address", address, "--port", str(port)]
            argv += ["--served-model-name", NAME, "--data-parallel-size", str(ENGINES)]
            argv += ["--routing", policy, "--max-model-len", str(MAX_LEN)]
            argv += ["--max-concurrent-requests", "100000", "--log-level", "warning"]
            argv += ["--disable-access-log"]
            if kv is not None:
                argv += ["--kv-events-config", kv]
            procs.append(_spawn(argv, logdir / f"{kind}.log"))
            for r in range(ENGINES):
                log = logdir / f"{kind}-engine-{r}.log"
                procs.append(_mock(address, r, model, stats[r], log, kv))
            ready = "/health"
        wait_port(port, procs[0], timeout=300, path=ready)
        payloads = [request_bytes(port, NAME, TOKENS, prompt=p) for p in work]
        t0 = time.perf_counter()
        result = asyncio.run(load(port, CONCURRENCY, payloads, TOKENS, requests=len(payloads)))
        elapsed = time.perf_counter() - t0
    finally:
        _stop(procs[1:])  # (the engines first: each writes its counters as it exits)
        _stop(procs[:1])
    totals = {"queries": 0, "hits": 0, "requests": 0}
    for path in stats:
        with contextlib.suppress(OSError, ValueError):
            got = json.loads(path.read_text())
            for k in totals:
                totals[k] += got.get(k, 0)
    shutil.rmtree(tmp, ignore_errors=True)
    ttft = result["ttft"]
    return {
        "frontend": kind,
        "hit_rate": round(totals["hits"] / totals["queries"], 3) if totals["queries"] else 0.0,
        "ttft_p50_ms": round(pct(ttft, 50) * 1e3, 1),
        "ttft_p99_ms": round(pct(ttft, 99) * 1e3, 1),
        "requests_per_s": round(len(work) / elapsed, 1),
        "complete": result["complete"],
        "requests": result["requests"],
        "engine_requests": totals["requests"],
    }


_TOKEN = re.compile(rb'"text":"[^"]')


async def _usage_one(port: int, prompt: str, out: list) -> None:
    """One streamed request: (TTFT, prompt tokens, cached tokens) from its chunks and usage."""
    body = {"model": NAME, "prompt": prompt, "max_tokens": TOKENS, "stream": True}
    body |= {"temperature": 0, "stream_options": {"include_usage": True}}
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.perf_counter()
    writer.write(head + data)
    first = None
    raw = b""
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            break
        if first is None and _TOKEN.search(chunk):
            first = time.perf_counter() - t0
        raw += chunk
    writer.close()
    usage = None
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage":{' in line:
            usage = json.loads(line[6:]).get("usage")
    prompt_tokens = (usage or {}).get("prompt_tokens", 0)
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    out.append((first, prompt_tokens, cached))


def run_real(policy: str, paths: dict, work: list[str], logdir: Path) -> dict:
    port = free_port()
    argv = [sys.executable, "-m", "tokenwire", "serve", "--engine", "vllm"]
    argv += ["--model", paths["model"], "--vllm-command", paths["vllm"], "--port", str(port)]
    argv += ["--served-model-name", NAME, "--data-parallel-size", "2", "--routing", policy]
    argv += ["--max-model-len", "1024", "--log-level", "warning", "--disable-access-log"]
    argv += ["--vllm-arg=--enforce-eager", "--vllm-arg=--dtype=bfloat16"]
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1")
    env["VLLM_HOST_IP"] = "127.0.0.1"
    with open(logdir / f"real-{policy}.log", "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_port(port, proc, timeout=1200, path="/health")
        got: list = []

        async def go() -> None:
            gate = asyncio.Semaphore(REAL_CONCURRENCY)

            async def one(p: str) -> None:
                async with gate:
                    await _usage_one(port, p, got)

            await asyncio.gather(*(one(p) for p in work))

        t0 = time.perf_counter()
        asyncio.run(go())
        elapsed = time.perf_counter() - t0
    finally:
        _stop([proc])
    ttft = [t for t, _, _ in got if t is not None]
    prompt = sum(p for _, p, _ in got)
    return {
        "frontend": f"tw-{policy} (real, 2 ranks)",
        "hit_rate": round(sum(c for _, _, c in got) / prompt, 3) if prompt else 0.0,
        "ttft_p50_ms": round(pct(ttft, 50) * 1e3, 1),
        "ttft_p99_ms": round(pct(ttft, 99) * 1e3, 1),
        "requests_per_s": round(len(work) / elapsed, 2),
        "complete": len(ttft),
        "requests": len(work),
    }


def _median(rows: list[dict]) -> dict:
    """One frontend's rounds: the median of each figure (the counts summed)."""
    out = dict(rows[0])
    for key in ("hit_rate", "ttft_p50_ms", "ttft_p99_ms", "requests_per_s"):
        values = sorted(r[key] for r in rows)
        out[key] = values[len(values) // 2]
    out["complete"] = sum(r["complete"] for r in rows)
    out["requests"] = sum(r["requests"] for r in rows)
    return out


def _table(rows: list[dict]) -> None:
    print("| frontend | prefix-cache hit rate | TTFT p50 / p99 ms | requests/s | completed |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['frontend']} | {r['hit_rate']:.1%} | {r['ttft_p50_ms']} / {r['ttft_p99_ms']} "
            f"| {r['requests_per_s']} | {r['complete']}/{r['requests']} |"
        )


def main() -> None:
    if "--real" in sys.argv[1:]:
        env = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "vllm_cpu_env.py"), "--check"],
            capture_output=True,
            text=True,
        )
        if env.returncode != 0:
            raise SystemExit("build the vLLM environment first: python scripts/vllm_cpu_env.py")
        paths = json.loads(env.stdout.strip().splitlines()[-1])
        logdir = Path(os.environ.get("BENCH_LOGS", "bench/results/routing-logs"))
        logdir.mkdir(parents=True, exist_ok=True)
        work = prompts(paths["model"], REAL_SYSTEMS, REAL_USERS, 400)
        rows = []
        for policy in ("prefix", "fewest"):
            row = run_real(policy, paths, work, logdir)
            print(json.dumps(row), flush=True)
            rows.append(row)
        print(
            f"\nthe real vLLM CPU engine (tiny model) with 2 ranks, {REAL_SYSTEMS} system prompts "
            f"of about 400 tokens × {REAL_USERS} users, C={REAL_CONCURRENCY}\n"
        )
        _table(rows)
        return
    kinds = os.environ.get("FRONTENDS", ALL).split(",")
    env = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "vllm_cpu_env.py"), "--check"],
        capture_output=True,
        text=True,
    )
    model = (
        json.loads(env.stdout.strip().splitlines()[-1])["model"] if env.returncode == 0 else None
    )
    if model is None:
        raise SystemExit("build the vLLM environment first (its tiny model's tokenizer): "
                         "python scripts/vllm_cpu_env.py")  # fmt: skip
    model = json.loads(env.stdout.strip().splitlines()[-1])["model"]
    smg = None
    if any(k.startswith("smg") for k in kinds):
        out = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "bench_env.py"), "--check"],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise SystemExit("build smg first: python scripts/bench_env.py")
        smg = json.loads(out.stdout.strip().splitlines()[-1])["smg"]
    raise_open_files(4 * CONCURRENCY + 1024)
    logdir = Path(os.environ.get("BENCH_LOGS", "bench/results/routing-logs"))
    logdir.mkdir(parents=True, exist_ok=True)
    work = prompts(model)
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(ROUNDS):  # (each round in a rotated order: drifts hit every frontend alike)
        for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
            row = run_one(kind, model, smg, work, logdir)
            print(json.dumps(row), flush=True)
            runs[kind].append(row)
    rows = [_median(runs[k]) for k in kinds]
    print(
        f"\n{ENGINES} mock engines, {SYSTEMS} system prompts of about {SYSTEM_TOKENS} tokens × "
        f"{USERS} users, C={CONCURRENCY}, {TOKENS} tokens out, prefill {PREFILL_MS} ms/token, "
        f"{BLOCKS} blocks of 16 tokens per engine\n"
    )
    _table(rows)


if __name__ == "__main__":
    main()
