"""Frontend benchmark: stock ``vllm serve`` (its Python API server only), SGLang's Rust model
gateway (``smg``) and ``tokenwire serve --engine vllm``, each over its own engine of the same
kind, in one run.

    python scripts/vllm_cpu_env.py          # once: the vLLM CPU environment and tiny model
    python scripts/bench_env.py             # once: smg from PyPI
    python bench/frontend.py                # over tokenwire mock-engine: every workload below
    python bench/frontend.py --real         # over the real tiny-model vLLM engine (C = 1, 8, 32)
    python bench/frontend.py --real --contended   # the same, other processes busy on both cores

Mock mode: each frontend waits for a remote engine (vLLM: ``--data-parallel-size 1
--data-parallel-size-local 0 --data-parallel-address ... --data-parallel-rpc-port ...``; smg:
``--backend vllm --worker-urls ipc://DIR/engine-0``, whose handshake port the engine dials;
tokenwire: ``--handshake-address`` with ``--engine-transport ipc``: its engine sockets are Unix
sockets, as smg's are; vLLM's frontend binds TCP ports for a remote engine) and a ``tokenwire
mock-engine`` (step time 0, max batch 256, random output) dials each. Workloads (``WORKLOADS``):

- ``completions``: streamed 128-token completions of a short prompt;
- ``chat``: streamed 128-token chat completions through the Qwen3 chat template, with a stop
  string and the ``qwen3`` reasoning parser (every frontend runs with it);
- ``long``: 8,000-token prompts (different for each request), 64 tokens out: tokenization and
  template rendering set the TTFT.

at C concurrent requests (``CONCURRENCY``, default 1, 8, 64, 256, 1024, 4096;
``LONG_CONCURRENCY``, default 64, 256, for ``long``), a round running at least 1,024 requests
(256 for ``long``; 64 at C = 1 and 256 at C = 8), C at a time. Real mode: each frontend runs
with its own engine on the tiny model (smg's is ``vllm serve --headless`` dialling it), four
requests per stream a round (16 at least).
``--contended`` is the case of ``vllm bench serve`` on a loaded machine: 32 requests of a
1,000-token prompt and 128 tokens out, 8 at a time, while busy processes this script starts (two
per core) are pinned to both cores; nothing else is pinned there, as users run them.

Frontends are pinned to CPU 0, engines and this load generator to CPU 1 (in real mode each
frontend's engine shares its CPU, as before); rounds alternate between the frontends (in a
rotating order) so drifts in machine speed hit all alike. The table gives streamed tokens/s,
TTFT and inter-chunk latency, each frontend process's own CPU time per streamed token (user +
system, all its threads, over the round: on a machine with fewer cores than busy processes the
load generator and the engine may bound tokens/s, while CPU per token is what the frontend itself
costs), tokenwire's CPU per token over smg's, and the requests completed.
Environment: FRONTENDS=vllm,smg,tokenwire, WORKLOADS, CONCURRENCY, LONG_CONCURRENCY, TOKENS=128,
ROUNDS=3, ROUND_TIMEOUT=600.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from loadgen import (  # noqa: E402
    chat_request_bytes,
    free_port,
    load,
    load_measured,
    raise_open_files,
    request_bytes,
    summary,
    wait_port,
)

TOKENS = int(os.environ.get("TOKENS", "128"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
ROUND_TIMEOUT = float(os.environ.get("ROUND_TIMEOUT", "600"))
NAME = "tiny"
#: Context length of every frontend and engine: room for the long prompts.
MAX_LEN = 16384
LONG_PROMPT = 8000
LONG_TOKENS = 64
STOP = "\n\nHuman:"
#: Requests per round at least (C at a time), so that a round lasts long enough to measure.
MIN_REQUESTS = {"completions": 1024, "chat": 1024, "long": 256, "contended": 32}
#: ... except at low concurrency, where a round of fewer gives as many latency samples (a request
#: is 128 inter-chunk gaps).
LOW_C_REQUESTS = {1: 64, 8: 256}
#: Over the real engine (a CPU engine makes a few hundred tokens a second): four requests per
#: stream, 16 at least.
REAL_REQUESTS_PER_STREAM = 4
CHAT_PROMPT = "Benchmark prompt: tell me a story about a fox."


def _check(script: str, what: str) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), "--check"], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"build {what} first: python scripts/{script}")
    return json.loads(out.stdout.strip().splitlines()[-1])


#: Whether frontends and engines are pinned to their CPUs (not in the contended case: there they
#: run as users run them, and only the busy processes are pinned).
PIN = True


def _pinned(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if PIN and (os.cpu_count() or 1) > 1 else []


def _spawn(argv: list[str], cpu: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_HOST_IP="127.0.0.1",
        VLLM_ALLOW_LONG_MAX_MODEL_LEN="1",
    )
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*_pinned(cpu), *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


#: Folders made for smg's worker sockets, removed at the end.
_FOLDERS: list[str] = []


def smg_handshake_port(worker_url: str) -> int:
    """The TCP port smg binds for an ``ipc://`` worker's handshake (FNV-1a 64 over the path,
    folded into 20000-29999), which the engine dials."""
    h = 0xCBF29CE484222325
    for b in worker_url.removeprefix("ipc://").encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return 20000 + h % 10000


def _mock(address: str, model: str, log: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tokenwire", "mock-engine", "--handshake-address", address]
    argv += ["--tokenizer", model, "--step-time-ms", "0", "--max-batch-size", "256"]
    argv += ["--synthetic-output", "random", "--max-model-len", str(MAX_LEN)]
    return _spawn([*argv, "--log-level", "warning"], 1, log)


def _headless(vllm: str, model: str, port: int, cpu: int, log: Path) -> subprocess.Popen:
    argv = [vllm, "serve", model, "--headless", "--data-parallel-size", "1"]
    argv += ["--data-parallel-size-local", "1", "--data-parallel-address", "127.0.0.1"]
    argv += ["--data-parallel-rpc-port", str(port), "--max-model-len", "4096"]
    return _spawn([*argv, "--enforce-eager", "--dtype", "bfloat16"], cpu, log)


def _servers(
    kinds: list[str], real: bool, paths: dict[str, str], smg: str | None, logdir: Path
) -> dict[str, tuple[int, list[subprocess.Popen]]]:
    """Each frontend (and its engine): ``{kind: (port, [frontend, engine...])}``."""
    model, vllm = paths["model"], paths["vllm"]
    max_len = "4096" if real else str(MAX_LEN)
    eager = ["--enforce-eager", "--dtype", "bfloat16"]
    out: dict[str, tuple[int, list[subprocess.Popen]]] = {}
    for kind in kinds:
        port = free_port()
        if kind == "vllm":
            argv = [vllm, "serve", model, "--port", str(port), "--served-model-name", NAME]
            argv += ["--max-model-len", max_len, "--reasoning-parser", "qwen3"]
            if real:
                out[kind] = (port, [_spawn([*argv, *eager], 0, logdir / "vllm.log")])
                continue
            rpc = free_port()
            argv += ["--data-parallel-size", "1", "--data-parallel-size-local", "0"]
            argv += ["--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc)]
            front = _spawn(argv, 0, logdir / "vllm.log")
            engine = _mock(f"tcp://127.0.0.1:{rpc}", model, logdir / "vllm-engine.log")
            out[kind] = (port, [front, engine])
        elif kind == "smg":
            assert smg is not None
            folder = tempfile.mkdtemp(prefix="tokenwire-smg-")  # (mode 0700, as smg wants)
            _FOLDERS.append(folder)
            worker = f"ipc://{folder}/engine-0"
            argv = [smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--backend"]
            argv += ["vllm", "--worker-urls", worker, "--model-path", model, "--model-alias"]
            argv += [f"{NAME}={model}", "--prometheus-port", str(free_port())]
            argv += ["--log-level", "warn", "--reasoning-parser", "qwen3"]
            argv += ["--max-concurrent-requests", "0"]
            front = _spawn(argv, 0, logdir / "smg.log")
            rpc = smg_handshake_port(worker)
            if real:
                engine = _headless(vllm, model, rpc, 0, logdir / "smg-engine.log")
            else:
                engine = _mock(f"tcp://127.0.0.1:{rpc}", model, logdir / "smg-engine.log")
            out[kind] = (port, [front, engine])
        else:
            argv = [sys.executable, "-m", "tokenwire", "serve", "--engine", "vllm"]
            argv += ["--port", str(port), "--served-model-name", NAME, "--log-level", "warning"]
            argv += ["--max-concurrent-requests", "100000", "--max-model-len", max_len]
            argv += ["--reasoning-parser", "qwen3"]
            if real:
                argv += ["--model", model, "--vllm-command", vllm]
                argv += ["--vllm-arg=--enforce-eager", "--vllm-arg=--dtype=bfloat16"]
                out[kind] = (port, [_spawn(argv, 0, logdir / "tokenwire.log")])
                continue
            rpc = free_port()
            argv += ["--tokenizer", model, "--handshake-address", f"tcp://127.0.0.1:{rpc}"]
            argv += ["--engine-transport", "ipc"]  # (the engine's sockets: smg's are ipc:// too)
            front = _spawn(argv, 0, logdir / "tokenwire.log")
            engine = _mock(f"tcp://127.0.0.1:{rpc}", model, logdir / "tokenwire-engine.log")
            out[kind] = (port, [front, engine])
    return out


def long_prompts(count: int, length: int) -> list[str]:
    """``count`` different prompts of about ``length`` tokens of natural text (the test corpus,
    on the bundled Qwen3 tokenizer, the tiny model's)."""
    from tokenwire import Tokenizer

    tok = Tokenizer.default()
    text = (REPO / "tests" / "data" / "corpus.txt").read_text(encoding="utf-8")
    ids = tok.encode(text)
    while len(ids) < length:
        ids = ids + ids
    body = tok.decode(ids[: length - 16])
    return [f"Request {i}. {body}" for i in range(count)]


def payloads(workload: str, port: int, c: int, real: bool, contended: bool) -> list[bytes]:
    """The requests of one round (taken in turn)."""
    usage = {"stream_options": {"include_usage": True}}
    # The tiny model's weights are random: sampling would pick the padding ids past the
    # tokenizer's vocabulary, which tokenwire refuses to decode. Greedy output stays in it.
    extra = {"temperature": 0} if real else {}
    if contended:
        return [
            request_bytes(port, NAME, TOKENS, prompt=p, **usage, **extra)
            for p in long_prompts(32, 1000)
        ]
    if workload == "chat":
        body = {"stop": [STOP], **usage, **extra}
        return [chat_request_bytes(port, NAME, TOKENS, CHAT_PROMPT, **body)]
    if workload == "long":
        prompts = long_prompts(min(c, 256), LONG_PROMPT)
        return [request_bytes(port, NAME, LONG_TOKENS, prompt=p, **usage, **extra) for p in prompts]
    return [request_bytes(port, NAME, TOKENS, **usage, **extra)]


def _busy(cpu: int) -> subprocess.Popen:
    """A process that keeps ``cpu`` busy until killed."""
    return subprocess.Popen(
        ["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"],
        start_new_session=True,
    )


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
    parser.add_argument("--real", action="store_true", help="over the real tiny-model engine")
    parser.add_argument(
        "--contended",
        action="store_true",
        help="with --real: 32 requests of 1,000 tokens, 8 at a time, both cores kept busy",
    )
    args = parser.parse_args()
    global PIN
    if args.contended:
        args.real = True
        PIN = False
    kinds = os.environ.get("FRONTENDS", "vllm,smg,tokenwire").split(",")
    if args.contended:
        workloads, default_c = ["contended"], "8"
    elif args.real:
        workloads, default_c = ["completions"], "1,8,32"
    else:
        workloads = os.environ.get("WORKLOADS", "completions,chat,long").split(",")
        default_c = "1,8,64,256,1024,4096"
    levels = [int(c) for c in os.environ.get("CONCURRENCY", default_c).split(",")]
    long_levels = [int(c) for c in os.environ.get("LONG_CONCURRENCY", "64,256").split(",")]
    paths = _check("vllm_cpu_env.py", "the vLLM environment")
    smg = _check("bench_env.py", "smg")["smg"] if "smg" in kinds else None
    raise_open_files(4 * max(levels + long_levels) + 1024)
    if PIN and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    logdir = Path(os.environ.get("BENCH_LOGS", "bench/results/frontend-logs"))
    logdir.mkdir(parents=True, exist_ok=True)
    servers = _servers(kinds, args.real, paths, smg, logdir)
    busy: list[subprocess.Popen] = []
    rows = []
    try:
        for kind, (port, procs) in servers.items():
            path = "/readiness" if kind == "smg" else "/health"
            wait_port(port, procs[0], timeout=1200, path=path)
            for workload in workloads:
                warm = payloads(workload, port, 8, args.real, args.contended)
                asyncio.run(load(port, 8, warm, TOKENS, requests=8))
            print(f"{kind} is up", file=sys.stderr, flush=True)
        if args.contended:
            busy = [_busy(cpu) for cpu in (0, 1) for _ in range(2)]
        for workload in workloads:
            for c in long_levels if workload == "long" else levels:
                runs: dict[str, list[dict]] = {k: [] for k in servers}
                order = list(servers)
                for r in range(ROUNDS):
                    for kind in order[r % len(order) :] + order[: r % len(order)]:
                        port, procs = servers[kind]
                        batch = payloads(workload, port, c, args.real, args.contended)
                        n = 32 if args.contended else max(c, MIN_REQUESTS[workload])
                        if not args.contended and not args.real and c in LOW_C_REQUESTS:
                            n = LOW_C_REQUESTS[c]
                        elif args.real and not args.contended:
                            n = max(16, REAL_REQUESTS_PER_STREAM * c)
                        tokens = LONG_TOKENS if workload == "long" else TOKENS
                        # The frontend alone (taskset execs it: the same pid); in mock mode
                        # with the processes it started, in real mode without its engine.
                        measured = load_measured(
                            procs[0].pid,
                            port,
                            c,
                            batch,
                            tokens,
                            children=not args.real,
                            requests=n,
                        )
                        try:
                            run = asyncio.run(asyncio.wait_for(measured, ROUND_TIMEOUT))
                        except TimeoutError:
                            print(f"{kind} {workload} C={c}: timed out", file=sys.stderr)
                            run = {"tokens_per_s": 0.0, "complete": 0, "requests": n}
                            run |= {"ttft": [], "itl": []}
                            run |= {"user_us_per_token": 0.0, "sys_us_per_token": 0.0}
                            run["cpu_us_per_token"] = 0.0
                        runs[kind].append(run)
                cpu_of = {}
                for kind in servers:
                    rec = {"engine": "real" if args.real else "mock", "workload": workload}
                    rec |= {"frontend": kind, "C": c} | summary(runs[kind])
                    cpu = sorted(r["cpu_us_per_token"] for r in runs[kind])
                    rec["cpu_us_per_token"] = round(cpu[len(cpu) // 2], 2)
                    cpu_of[kind] = rec["cpu_us_per_token"]
                    rows.append(rec)
                for rec in rows[-len(servers) :]:
                    base = cpu_of.get("smg")
                    rec["cpu_vs_smg"] = round(rec["cpu_us_per_token"] / base, 2) if base else None
                    print(json.dumps(rec), flush=True)
    finally:
        _stop(busy)
        _stop([p for _port, procs in servers.values() for p in procs])
        for folder in _FOLDERS:
            shutil.rmtree(folder, ignore_errors=True)
    print(
        "\n| engine | workload | C | frontend | tokens/s | TTFT p50 / p99 ms "
        "| ITL p50 / p99 ms | frontend CPU µs/token | CPU vs smg | completed |"
    )
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['workload']} | {r['C']} | {r['frontend']} "
            f"| {r['tokens_per_s']:,} | {r['ttft_p50_ms']} / {r['ttft_p99_ms']} "
            f"| {r['itl_p50_ms']} / {r['itl_p99_ms']} | {r['cpu_us_per_token']} "
            f"| {r['cpu_vs_smg'] if r['cpu_vs_smg'] is not None else '-'} "
            f"| {r['complete']}/{r['requests']} |"
        )


if __name__ == "__main__":
    main()
