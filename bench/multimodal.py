"""Multimodal benchmark: does a stream of image requests stall the other streams and
``/health``? ``tokenwire serve --engine vllm`` (its media workers) and stock ``vllm serve``
(its Python API server), each over its own ``tokenwire mock-engine`` (the engine side of vLLM's
protocol; it ignores the images' tensors and steps every STEP_MS), both on the tiny Qwen2.5-VL
of ``scripts/vllm_cpu_env.py`` (its folder gives both frontends the processor), in one run.

    python scripts/vllm_cpu_env.py     # once: the vLLM CPU environment and the tiny VLM
    python bench/multimodal.py

For each frontend, two phases of PHASE seconds: ``text``, TEXT_STREAMS streamed chat requests
(TOKENS tokens each, renewed as they end) and a ``/health`` probe every 50 ms; then ``+images``,
the same plus IMAGES image chat requests kept in flight (each a different IMAGE_SIZE PNG, so
neither frontend's cache helps; 8 tokens out). The table: the text streams' inter-chunk latency
(p50, p99), ``/health`` latency (p50, p99), each ``+images`` p99 over its ``text`` p99 (the
issue's bar: 1.5x), and the image requests completed per second.
Environment: FRONTENDS=tokenwire,vllm, PHASE=20, TEXT_STREAMS=8, IMAGES=16, TOKENS=256,
STEP_MS=10, IMAGE_SIZE=1280x960, WORKERS (tokenwire's --mm-processor-workers; default its own).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def images(n: int) -> list[str]:
    """``n`` different PNGs as data: URLs (smooth gradients plus noise: a photo-like size)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    base = np.linspace(0, 255, W, dtype=np.float32)[None, :, None] * np.ones((H, 1, 3))
    out = []
    for _ in range(n):
        pixels = (base + rng.normal(0, 12, (H, W, 3))).clip(0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "PNG")
        out.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    return out


def start(kind: str, env_paths: dict[str, str], logdir: Path) -> tuple[int, list]:
    port, rpc = free_port(), free_port()
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
        argv += ["--data-parallel-rpc-port", str(rpc), "--disable-log-requests"]
        argv += ["--uvicorn-log-level", "warning"]
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


async def image_stream(client, url: str, pool: list[str], k: int, done: list, stop: float):
    while time.monotonic() < stop:
        image = pool[(k + len(done) * IMAGES) % len(pool)]
        body = {
            "model": NAME,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": image}},
                        {"type": "text", "text": "What is in the picture?"},
                    ],
                }
            ],
            "max_tokens": 8,
        }
        resp = await client.post(url + "/v1/chat/completions", json=body)
        if resp.status_code != 200:
            raise RuntimeError(resp.text[:500])
        done.append(time.monotonic())


async def health(client, url: str, out: list[float], stop: float):
    while time.monotonic() < stop:
        t0 = time.perf_counter()
        await client.get(url + "/health")
        out.append(time.perf_counter() - t0)
        await asyncio.sleep(0.05)


async def phase(url: str, pool: list[str] | None) -> dict[str, float]:
    gaps: list[float] = []
    probes: list[float] = []
    done: list[float] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        if pool is not None:  # (the image requests first: the text streams start under load)
            warm = time.monotonic() + 2
            imgs = [image_stream(client, url, pool, k, done, warm + PHASE) for k in range(IMAGES)]
            tasks = [asyncio.ensure_future(t) for t in imgs]
            await asyncio.sleep(2)
        else:
            tasks = []
        stop = time.monotonic() + PHASE
        others = [text_stream(client, url, gaps, stop) for _ in range(TEXT_STREAMS)]
        await asyncio.gather(*others, health(client, url, probes, stop), *tasks)
    return {
        "itl_p50": float(np.percentile(gaps, 50)) * 1e3,
        "itl_p99": float(np.percentile(gaps, 99)) * 1e3,
        "health_p50": float(np.percentile(probes, 50)) * 1e3,
        "health_p99": float(np.percentile(probes, 99)) * 1e3,
        "images_per_s": len(done) / PHASE if pool is not None else 0.0,
    }


def main() -> None:
    env_paths = paths()
    print(f"preparing {IMAGES * 4} different {W}x{H} PNGs ...", flush=True)
    pool = images(IMAGES * 4)
    logdir = Path(tempfile.mkdtemp(prefix="tokenwire-bench-mm-"))
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
