"""Images over real vLLM engines, differentially: stock ``vllm serve`` and ``tokenwire serve
--engine vllm`` on the tiny random Qwen2.5-VL of ``scripts/vllm_cpu_env.py``, the same image
chats (a ``data:`` PNG, a local file, two images), compared on the prompt token ids and the
greedy output ids. (The mm hashes and the tensors are compared with vLLM's own frontend in
``test_multimodal.py``; the engine receives tokenwire's and answers with the same ids.) One pair
of servers for the module, started together."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from mm_helpers import data_url, needs_extra, png
from vllm_helpers import free_port, vllm_process_env

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500), needs_extra]

from test_vllm_real import ENV, START_TIMEOUT, Server, start_all  # noqa: E402

if ENV is None or "vlm" not in ENV:  # pragma: no cover - skipped with test_vllm_real's reason
    pytest.skip(
        "the vLLM environment has no tiny VLM: run scripts/vllm_cpu_env.py", allow_module_level=True
    )

NAME = "tiny"  # (what test_vllm_real.Server.post names)
ARGS = ["--max-model-len", "1024", "--limit-mm-per-prompt", '{"image": 2, "video": 0}']
assert START_TIMEOUT


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("vlm-media")
    (folder / "a.png").write_bytes(png(112, 84, seed=11))  # (multiples of 28: no resize)
    (folder / "b.png").write_bytes(png(56, 140, seed=12))
    return str(folder)


@pytest.fixture(scope="module")
def pair(media_dir) -> Iterator[list[Server]]:
    a, b = free_port(), free_port()
    common = [*ARGS, "--served-model-name", NAME, "--allowed-local-media-path", media_dir]
    stock = [ENV["vllm_mm"], "serve", ENV["vlm"], "--port", str(a), "--enforce-eager"]
    stock += ["--dtype", "bfloat16", *common]
    ours = [
        sys.executable, "-m", "tokenwire", "serve", "--engine", "vllm", "--model", ENV["vlm"],
        "--vllm-command", ENV["vllm_mm"], "--port", str(b), "--vllm-arg=--enforce-eager",
        "--vllm-arg=--dtype=bfloat16", "--mm-processor-workers", "1", *common,
    ]  # fmt: skip
    env = vllm_process_env()
    with start_all((stock, env, a), (ours, env, b)) as servers:
        yield servers


def _chat(srv: Server, content: list) -> tuple[list[int], list[int]]:
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
        "temperature": 0,
        "return_token_ids": True,
    }
    out = srv.post("/v1/chat/completions", body)
    return out["prompt_token_ids"], out["choices"][0]["token_ids"]


def test_same_prompt_and_output_ids_as_stock_vllm(pair, media_dir):
    stock, ours = pair
    with open(f"{media_dir}/a.png", "rb") as f:
        inline = data_url(f.read())
    cases = [
        [{"type": "image_url", "image_url": {"url": inline}}, {"type": "text", "text": "What?"}],
        [
            {"type": "text", "text": "Look:"},
            {"type": "image_url", "image_url": {"url": f"file://{media_dir}/b.png"}},
        ],
        [
            {"type": "image_url", "image_url": {"url": f"file://{media_dir}/a.png"}},
            {"type": "image_url", "image_url": {"url": f"file://{media_dir}/b.png"}},
            {"type": "text", "text": "Compare the two."},
        ],
    ]
    for content in cases:
        want = _chat(stock, content)
        got = _chat(ours, content)
        assert got[0] == want[0], content[-1]
        assert got[1] == want[1], content[-1]
        assert want[0].count(151655) in (12, 10, 22)  # (the images' tokens, expanded)


def test_the_engine_refuses_what_vllm_refuses(pair):
    _, ours = pair
    part = {"type": "image_url", "image_url": {"url": "file:///etc/hostname"}}
    resp = ours.http.post(
        ours.url + "/v1/chat/completions",
        json={"model": NAME, "messages": [{"role": "user", "content": [part, part, part]}]},
    )
    assert resp.status_code == 400 and "at most 2 image" in resp.text
