"""Multimodal benchmark: does a stream of image requests stall the other streams and
``/health``? ``tokenwire serve --engine vllm`` (its media workers) and stock ``vllm serve``
(its Python API server), each over its own ``tokenwire mock-engine`` (the engine side of vLLM's
protocol; it ignores the images' tensors and steps every STEP_MS), both on the tiny Qwen2.5-VL
of ``scripts/vllm_cpu_env.py`` (its folder gives both frontends the processor), in one run.

    python scripts/vllm_cpu_env.py     # once: the vLLM CPU environment and the tiny VLM
    python bench/multimodal.py

For each frontend, two phases of PHASE seconds: ``text``, TEXT_STREAMS streamed chat requests
(TOKENS tokens each, renewed as they end) and a ``/health`` probe every 50 ms; then ``+images``,
the same plus IMAGES image chat requests kept in flight (IMAGE_SIZE PNGs, 8 tokens out). The
requests cycle through IMAGES * 4 different PNGs, so both frontends' processed-input caches are
off (``--mm-processor-cache-gb 0``; CACHE_GB sets another size for both): every image request is
fetched, decoded and processed. The table: the text streams' inter-chunk latency
(p50, p99), ``/health`` latency (p50, p99), each ``+images`` p99 over its ``text`` p99 (the
issue's bar: 1.5x), and the image requests completed per second.
Environment: FRONTENDS=tokenwire,vllm, PHASE=20, TEXT_STREAMS=8, IMAGES=16, TOKENS=256,
STEP_MS=10, IMAGE_SIZE=1280x960, CACHE_GB=0, WORKERS (tokenwire's --mm-processor-workers; default
its own).
"""

from __future__ import annotations

import sys
from pathlib import Path

# (bench/http.py would shadow the standard library's http package that httpx imports)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import asyncio
import base64
import json
import os
import signal
import subprocess
import tempfile
import time

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent
FRONTENDS = os.environ.get("FRONTENDS", "tokenwire,vllm").split(",")
PHASE = float(os.environ.get("PHASE", "20"))
TEXT_STREAMS = int(os.environ.get("TEXT_STREAMS", "8"))
IMAGES = int(os.environ.get("IMAGES", "16"))
TOKENS = int(os.environ.get("TOKENS", "256"))
STEP_MS = os.environ.get("STEP_MS", "10")
W, H = (int(x) for x in os.environ.get("IMAGE_SIZE", "1280x960").split("x"))
CACHE_GB = os.environ.get("CACHE_GB", "0")
NAME = "tiny"
ENV = {
    **os.environ,
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def paths() -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "vllm_cpu_env.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def images(n: int, folder: Path) -> None:
    """``n`` different PNGs in ``folder`` (smooth gradients plus noise: a photo-like size)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    base = np.linspace(0, 255, W, dtype=np.float32)[None, :, None] * np.ones((H, 1, 3))
    for k in range(n):
        pixels = (base + rng.normal(0, 12, (H, W, 3))).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{k:04d}.png", "PNG")


def frontend_argv(kind: str, env_paths: dict[str, str], port: int, rpc: int) -> list[str]:
    """The frontend's command line: ``tokenwire serve`` or stock ``vllm serve``, waiting on
    ``rpc`` for the engine, its processed-input cache at CACHE_GB."""
    vlm = env_paths["vlm"]
    if kind == "tokenwire":
        argv = [sys.executable, "-m", "tokenwire", "serve", "--engine", "vllm", "--model", vlm]
        argv += ["--handshake-address", f"tcp://127.0.0.1:{rpc}", "--served-model-name", NAME]
        argv += ["--port", str(port), "--max-model-len", "4096", "--disable-access-log"]
        if os.environ.get("WORKERS"):
            argv += ["--mm-processor-workers", os.environ["WORKERS"]]
    else:
        argv = [env_paths["vllm_mm"], "serve", vlm, "--served-model-name", NAME]
        argv += ["--port", str(port), "--max-model-len", "4096", "--data-parallel-size", "1"]
        argv += ["--data-parallel-size-local", "0", "--data-parallel-address", "127.0.0.1"]
        argv += ["--data-parallel-rpc-port", str(rpc)]
        argv += ["--uvicorn-log-level", "warning"]
    return argv + ["--mm-processor-cache-gb", CACHE_GB]


def start(kind: str, env_paths: dict[str, str], logdir: Path) -> tuple[int, list]:
    port, rpc = free_port(), free_port()
    vlm = env_paths["vlm"]
    argv = frontend_argv(kind, env_paths, port, rpc)
    with open(logdir / f"{kind}.log", "wb") as log:
        front = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=ENV)
    mock = [sys.executable, "-m", "tokenwire", "mock-engine", "--handshake-address"]
    mock += [f"tcp://127.0.0.1:{rpc}", "--tokenizer", vlm, "--step-time-ms", STEP_MS]
    mock += ["--synthetic-output", "random", "--max-model-len", "4096", "--log-level", "warning"]
    with open(logdir / f"{kind}-engine.log", "wb") as log:
        engine = subprocess.Popen(mock, stdout=log, stderr=subprocess.STDOUT, env=ENV)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if front.poll() is not None:
            raise RuntimeError((logdir / f"{kind}.log").read_text()[-3000:])
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return port, [front, engine]
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{kind} did not start")


async def text_stream(client: httpx.AsyncClient, url: str, gaps: list[float], stop: float):
    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    while time.monotonic() < stop:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            last = None
            async for line in resp.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
                if time.monotonic() >= stop:
                    break


async def image_stream(client, url: str, bodies: list[bytes], k: int, done: list, stop: float):
    headers = {"Content-Type": "application/json"}
    while time.monotonic() < stop:
        body = bodies[(k + len(done) * IMAGES) % len(bodies)]
        resp = await client.post(url + "/v1/chat/completions", content=body, headers=headers)
        if resp.status_code != 200:
            raise RuntimeError(resp.text[:500])
        done.append(time.monotonic())


def image_load(url: str, folder: str, start: float, stop: float, result) -> None:
    """The image requests, from a process of their own (so that building and sending them
    does not delay the measuring loop's timestamps), from ``start`` to ``stop``."""
    bodies = []
    for name in sorted(os.listdir(folder)):
        image = (
            "data:image/png;base64," + base64.b64encode(Path(folder, name).read_bytes()).decode()
        )
        message = {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image}},
                {"type": "text", "text": "What is in the picture?"},
            ],
        }
        body = {"model": NAME, "messages": [message], "max_tokens": 8}
        bodies.append(json.dumps(body).encode())

    async def run() -> int:
        done: list[float] = []
        await asyncio.sleep(max(0.0, start - time.time()))
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            jobs = [image_stream(client, url, bodies, k, done, stop) for k in range(IMAGES)]
            await asyncio.gather(*jobs)
        return len(done)

    stop = time.monotonic() + (stop - time.time())
    result.value = asyncio.run(run())


async def health(client, url: str, out: list[float], stop: float):
    while time.monotonic() < stop:
        t0 = time.perf_counter()
        await client.get(url + "/health")
        out.append(time.perf_counter() - t0)
        await asyncio.sleep(0.05)


async def phase(url: str, folder: str | None) -> dict[str, float]:
    import multiprocessing

    gaps: list[float] = []
    probes: list[float] = []
    loader = None
    if folder is not None:  # (the image requests first: the text streams start under load)
        result = multiprocessing.Value("i", 0)
        start_at = time.time() + 5
        loader = multiprocessing.Process(
            target=image_load, args=(url, folder, start_at, start_at + PHASE + 2, result)
        )
        loader.start()
        await asyncio.sleep(start_at + 2 - time.time())
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        stop = time.monotonic() + PHASE
        others = [text_stream(client, url, gaps, stop) for _ in range(TEXT_STREAMS)]
        await asyncio.gather(*others, health(client, url, probes, stop))
    images = 0
    if loader is not None:
        loader.join(600)
        images = result.value
    return {
        "itl_p50": float(np.percentile(gaps, 50)) * 1e3,
        "itl_p99": float(np.percentile(gaps, 99)) * 1e3,
        "health_p50": float(np.percentile(probes, 50)) * 1e3,
        "health_p99": float(np.percentile(probes, 99)) * 1e3,
        "images_per_s": images / (PHASE + 2),
    }


def main() -> None:
    env_paths = paths()
    print(f"preparing {IMAGES * 4} different {W}x{H} PNGs ...", flush=True)
    logdir = Path(tempfile.mkdtemp(prefix="tokenwire-bench-mm-"))
    (logdir / "images").mkdir()
    images(IMAGES * 4, logdir / "images")
    pool = str(logdir / "images")
    rows = []
    for kind in FRONTENDS:
        port, procs = start(kind, env_paths, logdir)
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(phase(url, None))  # (warm-up: every path taken once)
            base = asyncio.run(phase(url, None))
            loaded = asyncio.run(phase(url, pool))
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
        rows.append((kind, base, loaded))
        print(kind, json.dumps({"text": base, "+images": loaded}), flush=True)
    print(
        f"\n{TEXT_STREAMS} text streams (+ {IMAGES} image requests in flight, {W}x{H} PNGs), "
        f"mock engine stepping every {STEP_MS} ms, {PHASE:g} s a phase\n"
    )
    print("| frontend | phase | ITL p50 ms | ITL p99 ms | /health p50 ms | /health p99 ms ", end="")
    print("| images/s |")
    print("|---|---|---|---|---|---|---|")
    for kind, base, loaded in rows:
        for name, r in (("text", base), ("+images", loaded)):
            print(
                f"| {kind} | {name} | {r['itl_p50']:.1f} | {r['itl_p99']:.1f} | "
                f"{r['health_p50']:.1f} | {r['health_p99']:.1f} | {r['images_per_s']:.1f} |"
            )
        print(
            f"| {kind} | ratio | | {loaded['itl_p99'] / base['itl_p99']:.2f}x | | "
            f"{loaded['health_p99'] / base['health_p99']:.2f}x | |"
        )


if __name__ == "__main__":
    main()
