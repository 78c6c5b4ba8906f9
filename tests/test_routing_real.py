"""Prefix routing over a real vLLM CPU engine with two data-parallel ranks, as ``tokenwire serve
--model M --data-parallel-size 2`` starts it (tokenwire configures the ranks' KV-cache events and
subscribes to them): each shared system prompt is computed once, on one rank, and every later
request that starts with it goes where it is cached, as the ranks' ``cached_tokens`` show.

Needs the vLLM CPU environment (``scripts/vllm_cpu_env.py``); skips with that reason without it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import pytest

from vllm_helpers import free_port, stop_process, vllm_env, vllm_process_env, wait_until

from prom import scrape, value

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

ENV = vllm_env()
if ENV is None:
    pytest.skip(
        "the vLLM CPU environment is not built: run `python scripts/vllm_cpu_env.py` "
        "(about 5 minutes and 3.5 GB, once)",
        allow_module_level=True,
    )

NAME = "tiny"
START_TIMEOUT = 900
#: Four system prompts of about 400 tokens: three of the CPU engine's 128-token blocks each.
SYSTEMS = [f"System {j}. " + " ".join(f"rule{j}n{i}" for i in range(130)) for j in range(4)]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "tokenwire", "serve", "--engine", "vllm", "--model", ENV["model"]]
    argv += ["--vllm-command", ENV["vllm"], "--served-model-name", NAME, "--port", str(port)]
    argv += ["--data-parallel-size", "2", "--max-model-len", "1024", "--log-level", "warning"]
    argv += ["--vllm-arg=--enforce-eager", "--vllm-arg=--dtype=bfloat16"]
    proc = subprocess.Popen(argv, env=vllm_process_env(), stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"tokenwire exited with {proc.returncode}")
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, START_TIMEOUT, "tokenwire over two vLLM ranks")
        yield url
    finally:
        stop_process(proc, timeout=60)


def cached(url: str, prompt: str) -> int:
    body = {"model": NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    out = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert out.status_code == 200, out.text
    return (out.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def test_shared_prefixes_go_where_the_ranks_cached_them(server):
    url = server
    firsts = [cached(url, f"{s} First user.") for s in SYSTEMS]
    assert firsts == [0, 0, 0, 0]
    # later users of each system prompt, two at a time (fewest-in-flight would alternate ranks)
    results: list[int] = []
    lock = threading.Lock()

    def user(prompt: str) -> None:
        n = cached(url, prompt)
        with lock:
            results.append(n)

    for u in range(3):
        threads = [threading.Thread(target=user, args=(f"{s} User {u} asks.",)) for s in SYSTEMS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert len(results) == 12 and min(results) >= 256, results
    got = scrape(url)
    # both ranks hold prompts and told tokenwire so; every repeat was routed to its cache
    for rank in ("0", "1"):
        assert value(got, "tokenwire_kv_event_batches_total", engine=rank) > 0
        assert value(got, "vllm:prompt_tokens_total", engine=rank) > 0
    assert value(got, "tokenwire_routing_decisions_total", decision="cold") == 4
    assert value(got, "tokenwire_routing_decisions_total", decision="cache") == 12
