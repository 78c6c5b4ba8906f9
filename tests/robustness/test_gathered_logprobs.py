"""A response that is not streamed holds every logprob entry until it is written: one that would
gather more than ``MAX_GATHERED_LOGPROBS`` (choices x max_tokens x (1 + top logprobs)) is refused
with a 400 naming the product before the engine runs anything; streamed, the same request runs."""

from __future__ import annotations

import asyncio
import json

import pytest

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.runtime.runtime import MAX_GATHERED_LOGPROBS
from tokenwire.server import ServerConfig, create_app

from asgi_client import call
from conftest import real_tokenizer


@pytest.fixture(scope="module")
def tok():
    return real_tokenizer("default")


@pytest.fixture
async def app(tok):
    engine = SyntheticEngine(tok, SyntheticConfig(step_time=0))
    app = create_app(tok, engine, ServerConfig())
    await app.runtime.start()
    yield app
    await app.runtime.close()


HUGE = {"n": 128, "max_tokens": 30_000, "ignore_eos": True}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "hi", "logprobs": 20, **HUGE}),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "logprobs": True,
                "top_logprobs": 20,
                **HUGE,
            },
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "n": 200},
        ),
    ],
    ids=["completions", "chat", "chat_default_max_tokens"],
)
async def test_a_non_streamed_response_past_the_logprob_bound_is_refused(app, path, body):
    """The baseline: the same request with a handful of tokens is served; the huge one (77 M
    entries, many GB once gathered) is refused, and the engine was given nothing."""
    small = {**body, "n": 1, "max_tokens": 8}
    resp = await call(app, "POST", path, json.dumps(small).encode())
    assert resp.status == 200, resp.body[:300]
    engine = app.runtime.engine
    submitted = engine.stats["submitted"]
    resp = await call(app, "POST", path, json.dumps(body).encode())
    assert resp.status == 400, resp.body[:300]
    err = resp.error()
    assert err["param"] == "logprobs" and str(MAX_GATHERED_LOGPROBS) in err["message"]
    assert "max_tokens" in err["message"] and "stream" in err["message"]
    assert engine.stats["submitted"] == submitted


async def test_streamed_it_runs(app):
    """Streamed, nothing is gathered: the same request is served (its first chunks come, then
    the client hangs up)."""
    body = {"prompt": "hi", "logprobs": 20, **HUGE, "stream": True}
    got: list[dict] = []
    chunked = asyncio.Event()
    sent = []

    async def receive():
        if not sent:
            sent.append(True)
            return {"type": "http.request", "body": json.dumps(body).encode()}
        await chunked.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        got.append(message)
        if message.get("body"):
            chunked.set()

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
        "scheme": "http",
        "http_version": "1.1",
    }
    await asyncio.wait_for(app(scope, receive, send), 60)
    assert got[0]["status"] == 200 and b"top_logprobs" in got[1]["body"]
