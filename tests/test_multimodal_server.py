"""Images over HTTP on the embedded engine, as ``tokenwire serve`` runs it by default (the
bundled Qwen3 tokenizer's vision tokens: images counted as Qwen2-VL counts them): chat with the
``openai`` client and langchain-openai, Responses ``input_image``, the ``anthropic`` client's
image blocks, SGLang's ``/generate`` ``image_data``; the bad inputs as 400s in each API's shape;
a text-only model refusing images. One server (and one media worker) for the module."""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
from pathlib import Path

import httpx
import pytest

from mm_helpers import data_url, needs_extra, png
from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.multimodal import MediaLimits
from tokenwire.multimodal.processing import synthetic_media
from tokenwire.runtime import Features
from tokenwire.runtime.media import MediaOptions
from tokenwire.runtime.media_fetch import FetchRules
from tokenwire.tokenizer import Tokenizer

from served import MODEL, serve

pytestmark = needs_extra

#: The bodies the real clients sent, kept (``TOKENWIRE_CAPTURE_CLIENTS=1`` rewrites them).
CAPTURED = Path(__file__).resolve().parent / "clients" / "multimodal"
IMAGE_PAD = 151655
#: 150x100 -> Qwen2-VL's 112x140 -> 4x5 merged patches.
TOKENS = 20


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    (folder / "b.png").write_bytes(png(84, 56, seed=5))  # 2x3 = 6 tokens
    return folder, png(150, 100, seed=4)


@pytest.fixture(scope="module")
def server(images):
    folder, _ = images
    tok = Tokenizer.default()
    media = synthetic_media(tok.token_to_id, MODEL)
    features = Features(media=media, media_limits=MediaLimits(media.modalities, {"image": 2}))
    options = MediaOptions(rules=FetchRules(allowed_local_media_path=str(folder)), workers=1)
    config = SyntheticConfig(output="replay")
    with serve(config, features=features, media_options=options) as served:
        yield served


def _recorder(client: str, http_module=httpx) -> httpx.Client:
    """An HTTP client for a real API client that keeps every body it sends (the captured
    fixtures, when ``TOKENWIRE_CAPTURE_CLIENTS=1``)."""
    bodies: list[dict] = []

    def record(response) -> None:
        request = response.request
        if request.method == "POST" and response.status_code == 200:
            body = json.loads(request.content)
            bodies.append(
                {"name": request.url.path, "method": "POST", "path": request.url.path, "body": body}
            )

    http = http_module.Client(event_hooks={"response": [record]}, timeout=60)
    http.bodies = bodies  # type: ignore[attr-defined]
    http.client_name = client  # type: ignore[attr-defined]
    return http


def _keep(http: httpx.Client) -> None:
    if os.environ.get("TOKENWIRE_CAPTURE_CLIENTS") != "1":
        return
    name = http.client_name  # type: ignore[attr-defined]
    package = {"langchain-openai": "langchain-openai"}.get(name, name)
    version = importlib.metadata.version(package)
    CAPTURED.mkdir(exist_ok=True)
    corpus = {
        "client": f"{name} {version}",
        "source": "captured from the client by tests/test_multimodal_server.py",
        "requests": http.bodies,  # type: ignore[attr-defined]
    }
    (CAPTURED / f"{name}.json").write_text(json.dumps(corpus, indent=1) + "\n")


def _chat(url: str, content, **kw) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    return httpx.post(f"{url}/v1/chat/completions", json={**body, **kw}, timeout=60)


def test_image_chat_counts_the_image_tokens(server, images):
    folder, image = images
    text = _chat(server.url, "Describe it.", return_prompt_token_ids=True).json()
    out = _chat(
        server.url,
        [
            {"type": "image_url", "image_url": {"url": data_url(image)}},
            {"type": "text", "text": "Describe it."},
        ],
        return_prompt_token_ids=True,
    ).json()
    ids = out["prompt_token_ids"]
    assert ids.count(IMAGE_PAD) == TOKENS
    # the placeholder and its newline before the text (vLLM's string-format prompt), expanded
    assert out["usage"]["prompt_tokens"] == text["usage"]["prompt_tokens"] + 3 + TOKENS
    two = _chat(
        server.url,
        [
            {"type": "image_url", "image_url": {"url": data_url(image)}},
            {"type": "image_url", "image_url": {"url": f"file://{folder}/b.png"}},
            {"type": "text", "text": "Compare."},
        ],
        return_prompt_token_ids=True,
    ).json()
    assert two["prompt_token_ids"].count(IMAGE_PAD) == TOKENS + 6
    assert server.runtime.media_pool.hits >= 1  # (the first image again: from the cache)


def test_openai_client_and_responses(server, images):
    openai = pytest.importorskip("openai")
    http = _recorder("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", http_client=http)
    _, image = images
    chat = client.chat.completions.create(
        model=MODEL,
        max_tokens=4,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": data_url(image), "detail": "low"}},
                ],
            }
        ],
    )
    assert chat.choices[0].message.content and chat.usage.prompt_tokens > TOKENS
    resp = client.responses.create(
        model=MODEL,
        max_output_tokens=4,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": data_url(image)},
                ],
            }
        ],
    )
    assert resp.output_text and resp.usage.input_tokens > TOKENS
    _keep(http)
    with pytest.raises(openai.BadRequestError, match="cannot decode the image"):
        client.chat.completions.create(
            model=MODEL,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": data_url(b"junk")}}],
                }
            ],
        )


def test_anthropic_client_image_block(server, images):
    anthropic = pytest.importorskip("anthropic")
    _, image = images
    http = _recorder("anthropic", pytest.importorskip("httpx2"))
    client = anthropic.Anthropic(base_url=server.url, api_key="x", http_client=http)
    msg = client.messages.create(
        model=MODEL,
        max_tokens=4,
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": base64.b64encode(image).decode(),
                        },
                    },
                    {"type": "text", "text": "What is in the image?"},
                ],
            }
        ],
    )
    assert msg.content[0].text and msg.usage.input_tokens > TOKENS
    _keep(http)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model=MODEL,
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "url", "url": "http://127.0.0.1:9/a.png"},
                        }
                    ],
                }
            ],
        )
    assert err.value.body["type"] == "error" and "loopback" in err.value.body["error"]["message"]


def test_langchain_image_message(server, images):
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage

    _, image = images
    http = _recorder("langchain-openai")
    chat = lc.ChatOpenAI(
        model=MODEL, base_url=f"{server.url}/v1", api_key="x", max_tokens=4, http_client=http
    )
    out = chat.invoke(
        [
            HumanMessage(
                content=[
                    {"type": "text", "text": "Describe the image."},
                    {"type": "image_url", "image_url": {"url": data_url(image)}},
                ]
            )
        ]
    )
    assert out.content and out.usage_metadata["input_tokens"] > TOKENS
    _keep(http)


def test_the_captured_client_bodies_replay(server):
    files = sorted(CAPTURED.glob("*.json"))
    assert {f.stem for f in files} >= {"openai", "anthropic", "langchain-openai"}
    for path in files:
        for req in json.loads(path.read_text())["requests"]:
            out = httpx.post(server.url + req["path"], json=req["body"], timeout=60)
            assert out.status_code == 200, (path.name, out.text)


def test_generate_image_data(server, images):
    _, image = images
    body = {
        "text": "<|im_start|>user\nWhat is it?<|im_end|>\n",
        "image_data": base64.b64encode(image).decode(),  # (a bare base64 string, as SGLang takes)
        "sampling_params": {"max_new_tokens": 4},
        "return_prompt_token_ids": True,
    }
    out = httpx.post(f"{server.url}/generate", json=body, timeout=60)
    assert out.status_code == 200, out.text
    assert out.json()["meta_info"]["prompt_tokens"] > TOKENS


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (
            [{"type": "image_url", "image_url": {"url": data_url(b"\x89PNG\r\n\x1a\nxx")}}],
            "cannot decode",
        ),
        (
            [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}],
            "not valid base64",
        ),
        (
            [{"type": "image_url", "image_url": {"url": "http://169.254.169.254/x.png"}}],
            "link-local",
        ),
        (
            [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}],
            "allowed-local-media-path",
        ),
        ([{"type": "image_embeds", "image_embeds": "x"}], "embeddings are not accepted"),
        (
            [{"type": "input_audio", "input_audio": {"data": "QQ==", "format": "wav"}}],
            "does not accept audio",
        ),
    ],
)
def test_bad_media_is_a_400(server, content, why):
    out = _chat(server.url, content)
    assert out.status_code == 400, out.text
    assert why in out.json()["error"]["message"]


def test_more_images_than_the_limit(server, images):
    _, image = images
    part = {"type": "image_url", "image_url": {"url": data_url(image)}}
    out = _chat(server.url, [part, part, part])
    assert out.status_code == 400 and "at most 2 image" in out.json()["error"]["message"]


def test_a_text_only_model_refuses_images():
    with serve(SyntheticConfig()) as served:
        out = _chat(served.url, [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}])
        assert out.status_code == 400
        assert "text-only" in out.json()["error"]["message"]
        out = httpx.post(
            f"{served.url}/generate", json={"text": "x", "image_data": "https://x/a.png"}
        )
        assert out.status_code == 400 and "text-only" in out.text


def test_a_dead_worker_is_replaced(server, images):
    import os
    import signal

    _, image = images
    pool = server.runtime.media_pool
    part = {"type": "image_url", "image_url": {"url": data_url(png(30, 30, seed=9))}}
    assert _chat(server.url, [part]).status_code == 200
    (pid,) = pool._pools[0]._processes
    os.kill(pid, signal.SIGKILL)
    out = _chat(server.url, [{"type": "image_url", "image_url": {"url": data_url(image)}}])
    # (the first request after the kill may be the one that meets the dead worker, or not)
    assert out.status_code in (200, 400), out.text
    if out.status_code == 400:
        assert "worker processing this media item ended" in out.json()["error"]["message"]
    assert _chat(server.url, [part]).status_code == 200


#: A server process that makes its media workers and is gone before they have started.
_GONE_AT_ONCE = """
import os, sys
from tokenwire.multimodal.processing import synthetic_media
from tokenwire.runtime.media import MediaOptions, MediaPool
from tokenwire.tokenizer import Tokenizer

tok = Tokenizer.default()
media = synthetic_media(tok.token_to_id, "m")
pool = MediaPool(media, MediaOptions(workers=2))
print(" ".join(str(pid) for p in pool._pools for pid in p._processes), flush=True)
os._exit(0)
"""


def test_workers_of_a_server_gone_before_they_started_end_too(tmp_path):
    """A server that ends while its media workers start (a startup that fails) leaves them with
    another parent before they look at theirs: they end all the same."""
    import signal
    import subprocess
    import sys

    from vllm_helpers import alive, wait_until

    printed = tmp_path / "pids"
    with printed.open("w") as f:  # (not a pipe: the workers would hold it open)
        code = subprocess.run(
            [sys.executable, "-c", _GONE_AT_ONCE], stdout=f, stdin=subprocess.DEVNULL, timeout=120
        ).returncode
    assert code == 0
    pids = [int(p) for p in printed.read_text().split()]
    assert len(pids) == 2

    try:
        wait_until(
            lambda: not any(map(alive, pids)), 30, "the media workers to end with their server"
        )
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
