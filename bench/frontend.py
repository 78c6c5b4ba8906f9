"""Frontend benchmark: stock ``vllm serve`` (its Python API server only) against
``tokenwire serve --engine vllm``, both over the same kind of engine, in one run.

    python scripts/vllm_cpu_env.py          # once: the vLLM CPU environment and tiny model
    python bench/frontend.py                # over tokenwire mock-engine (C = 64, 256, 1024)
    python bench/frontend.py --real         # over the real tiny-model vLLM engine (C = 1, 8, 32)

Mock mode: each frontend waits for a remote engine (vLLM: ``--data-parallel-size 1
--data-parallel-size-local 0 --data-parallel-address ... --data-parallel-rpc-port ...``;
tokenwire: ``--handshake-address``) and a ``tokenwire mock-engine`` (step time 0, max batch 256,
random output) dials each. Real mode: each frontend runs with its own engine on the tiny model.
Frontends are pinned to CPU 0, engines and this load generator to CPU 1; rounds alternate between
the two frontends so drifts in machine speed hit both alike. The table gives streamed tokens/s
(complete 128-token responses), TTFT and inter-chunk latency, and tokenwire's ratio over vLLM;
and each frontend process's own CPU time per streamed token (its user + system time over the
round): on a machine with fewer cores than busy processes the load generator and the engine may
bound tokens/s, while CPU per token is what the frontend itself costs.
Environment: CONCURRENCY, TOKENS=128, ROUNDS=3.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from loadgen import free_port, load, load_measured, request_bytes, summary, wait_port  # noqa: E402

TOKENS = int(os.environ.get("TOKENS", "128"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
NAME = "tiny"
MAX_LEN = 4096


def _env_paths() -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, str(HERE.parent / "scripts" / "vllm_cpu_env.py"), "--check"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit("build the vLLM environment first: python scripts/vllm_cpu_env.py")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pinned(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if (os.cpu_count() or 1) > 1 else []


def _spawn(argv: list[str], cpu: int, log: str) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1", VLLM_HOST_IP="127.0.0.1")
    out = open(log, "wb")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(
        [*_pinned(cpu), *argv],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _mock(address: str, model: str, log: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tokenwire", "mock-engine", "--handshake-address", address]
    argv += ["--tokenizer", model, "--step-time-ms", "0", "--max-batch-size", "256"]
    argv += ["--synthetic-output", "random", "--max-model-len", str(MAX_LEN)]
    return _spawn([*argv, "--log-level", "warning"], 1, log)


def _servers(real: bool, paths: dict[str, str], logdir: Path) -> dict[str, tuple[int, list]]:
    model, vllm = paths["model"], paths["vllm"]
    common = ["--served-model-name", NAME, "--max-model-len", str(MAX_LEN)]
    eager = ["--enforce-eager", "--dtype", "bfloat16"]
    out: dict[str, tuple[int, list]] = {}
    port = free_port()
    if real:
        argv = [vllm, "serve", model, "--port", str(port), *common, *eager]
        out["vllm"] = (port, [_spawn(argv, 0, str(logdir / "vllm.log"))])
    else:
        rpc = free_port()
        argv = [vllm, "serve", model, "--port", str(port), *common, "--data-parallel-size", "1"]
        argv += ["--data-parallel-size-local", "0", "--data-parallel-address", "127.0.0.1"]
        argv += ["--data-parallel-rpc-port", str(rpc)]
        front = _spawn(argv, 0, str(logdir / "vllm.log"))
        out["vllm"] = (port, [front, _mock(f"tcp://127.0.0.1:{rpc}", model, str(logdir / "m1"))])
    port = free_port()
    argv = [sys.executable, "-m", "tokenwire", "serve", "--engine", "vllm", "--port", str(port)]
    argv += ["--served-model-name", NAME, "--max-concurrent-requests", "100000"]
    argv += ["--log-level", "warning", "--max-model-len", str(MAX_LEN)]
    if real:
        argv += ["--model", model, "--vllm-command", vllm]
        argv += ["--vllm-arg=--enforce-eager", "--vllm-arg=--dtype=bfloat16"]
        out["tokenwire"] = (port, [_spawn(argv, 0, str(logdir / "tokenwire.log"))])
    else:
        rpc = free_port()
        argv += ["--tokenizer", model, "--handshake-address", f"tcp://127.0.0.1:{rpc}"]
        front = _spawn(argv, 0, str(logdir / "tokenwire.log"))
        mock = _mock(f"tcp://127.0.0.1:{rpc}", model, str(logdir / "m2"))
        out["tokenwire"] = (port, [front, mock])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="over the real tiny-model engine")
    args = parser.parse_args()
    default = "1,8,32" if args.real else "64,256,1024"
    # The tiny model's weights are random: sampling would pick the padding ids past the
    # tokenizer's vocabulary, which tokenwire refuses to decode. Greedy output stays in it.
    extra = {"temperature": 0} if args.real else {}
    levels = [int(c) for c in os.environ.get("CONCURRENCY", default).split(",")]
    paths = _env_paths()
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    logdir = Path(os.environ.get("BENCH_LOGS", "bench/results/frontend-logs"))
    logdir.mkdir(parents=True, exist_ok=True)
    servers = _servers(args.real, paths, logdir)
    rows = []
    try:
        for kind, (port, procs) in servers.items():
            wait_port(port, procs[0], timeout=1200, path="/health")
            payload = request_bytes(port, NAME, TOKENS, **extra)
            asyncio.run(load(port, 8, payload, TOKENS))  # warm-up
            print(f"{kind} is up", file=sys.stderr, flush=True)
        for c in levels:
            runs: dict[str, list[dict]] = {k: [] for k in servers}
            for _ in range(ROUNDS):
                for kind, (port, procs) in servers.items():
                    payload = request_bytes(port, NAME, TOKENS, **extra)
                    pid = procs[0].pid  # the frontend (taskset execs it: the same pid)
                    run = asyncio.run(load_measured(pid, port, c, payload, TOKENS))
                    run["cpu_us_per_token"] = run["user_us_per_token"] + run["sys_us_per_token"]
                    runs[kind].append(run)
            ratios = sorted(
                t["tokens_per_s"] / max(v["tokens_per_s"], 1e-9)
                for t, v in zip(runs["tokenwire"], runs["vllm"])
            )
            for kind in servers:
                rec = {"engine": "real" if args.real else "mock", "frontend": kind, "C": c}
                rec |= summary(runs[kind])
                cpu = sorted(r["cpu_us_per_token"] for r in runs[kind])
                rec["cpu_us_per_token"] = round(cpu[len(cpu) // 2], 1)
                rec["ratio"] = round(ratios[len(ratios) // 2], 2) if kind == "tokenwire" else 1.0
                print(json.dumps(rec), flush=True)
                rows.append(rec)
    finally:
        for _port, procs in servers.values():
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 15)
            for proc in procs:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
    print(
        "\n| engine | C | frontend | tokens/s (median) | ratio (tokenwire / vLLM, paired) "
        "| TTFT p50 / p99 ms | ITL p50 / p99 ms | frontend CPU µs/token | complete |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['C']} | {r['frontend']} | {r['tokens_per_s']:,} "
            f"| {r['ratio']:.2f} | {r['ttft_p50_ms']} / {r['ttft_p99_ms']} "
            f"| {r['itl_p50_ms']} / {r['itl_p99_ms']} | {r['cpu_us_per_token']} "
            f"| {r['complete']}/{r['C']} |"
        )


if __name__ == "__main__":
    main()
