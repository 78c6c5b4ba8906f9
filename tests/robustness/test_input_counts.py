"""What a request can make the server render or tokenize is bounded before the work starts:
``/v1/messages/count_tokens`` refuses a prompt past the context after tokenizing a bounded part
of it (as every other route does), a request with more messages, input items or system blocks
than ``MAX_MESSAGES`` is refused before anything is rendered, and reasoning items are joined in
linear time."""

from __future__ import annotations

import json
import time

import pytest

from tokenwire.chat.messages import MAX_MESSAGES
from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.server import ServerConfig, create_app
from tokenwire.server.openai import parse as openai_parse
from tokenwire.server.responses.request import input_messages

from asgi_client import call
from conftest import real_tokenizer


@pytest.fixture
async def app():
    tok = real_tokenizer("default")
    engine = SyntheticEngine(tok, SyntheticConfig(step_time=0))
    app = create_app(tok, engine, ServerConfig(max_request_bytes=None))
    await app.runtime.start()
    yield app
    await app.runtime.close()


@pytest.fixture
def tokenized(app, monkeypatch):
    """Characters the server's tokenizer is asked to tokenize."""
    tok = app.runtime.tokenizer
    seen = {"chars": 0}
    encode = tok.encode

    def counting(text, **kwargs):
        seen["chars"] += len(text)
        return encode(text, **kwargs)

    monkeypatch.setattr(tok, "encode", counting)
    return seen


@pytest.fixture
def rendered(monkeypatch):
    """Messages handed to the chat template."""
    seen = {"messages": 0}
    render = openai_parse.render_chat

    def counting(template, messages, **kwargs):
        seen["messages"] += len(messages)
        return render(template, messages, **kwargs)

    monkeypatch.setattr(openai_parse, "render_chat", counting)
    return seen


@pytest.mark.parametrize("chars", [30_000_000, 4_000_000])
async def test_count_tokens_refuses_a_prompt_past_the_context_after_a_bounded_part(
    app, tokenized, chars
):
    """A 30 MB prompt: the quiet baseline is a short one, counted whole; the huge one is refused
    having tokenized no more than a few pieces of it (on main: all 30 million characters)."""
    short = {"model": "tokenwire", "messages": [{"role": "user", "content": "hi " * 100}]}
    resp = await call(app, "POST", "/v1/messages/count_tokens", json.dumps(short).encode())
    assert resp.status == 200 and resp.json()["input_tokens"] > 100
    baseline = tokenized["chars"]
    tokenized["chars"] = 0
    huge = {"model": "tokenwire", "messages": [{"role": "user", "content": "7" * chars}]}
    resp = await call(
        app, "POST", "/v1/messages/count_tokens", json.dumps(huge).encode(), timeout=60
    )
    assert resp.status == 400, resp.body[:300]
    err = resp.json()["error"]
    assert "maximum context length" in err["message"]
    assert tokenized["chars"] < 1000 * max(baseline, 300)  # not 30 million (10,000x baseline)


MANY = 300_000
EMPTY = [{"role": "user", "content": ""}] * MANY


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (
            "/v1/chat/completions",
            {"messages": EMPTY},
            "messages",
        ),
        ("/tokenize", {"messages": EMPTY}, "messages"),
        ("/v1/responses", {"input": EMPTY}, "input"),
        (
            "/v1/responses",
            {"input": [{"type": "reasoning", "summary": []}] * MANY},
            "input",
        ),
        (
            "/v1/messages",
            {"max_tokens": 1, "messages": [{"role": "user", "content": "x"}] * MANY},
            "messages",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 1,
                "system": [{"type": "text", "text": ""}] * MANY,
                "messages": [{"role": "user", "content": "x"}],
            },
            "system",
        ),
    ],
    ids=["chat", "tokenize", "responses", "reasoning_items", "messages", "system_blocks"],
)
async def test_too_many_messages_are_refused_before_rendering(app, rendered, path, body, field):
    """The baseline: a one-message request renders one message; 300,000 of them render none
    (on main: all 300,000 go through the template)."""
    one = {k: (v[:1] if isinstance(v, list) else v) for k, v in body.items()}
    if path == "/v1/responses" and field == "input" and one["input"][0].get("type") == "reasoning":
        one["input"] = [one["input"][0], {"role": "user", "content": "hi"}]
    resp = await call(app, "POST", path, json.dumps({"max_tokens": 1, **one}).encode())
    assert resp.status == 200, resp.body[:300]
    assert 0 < rendered["messages"] <= 3
    rendered["messages"] = 0
    resp = await call(app, "POST", path, json.dumps(body).encode(), timeout=120)
    assert resp.status == 400, resp.body[:300]
    assert f"at most {MAX_MESSAGES}" in resp.json()["error"]["message"]
    assert rendered["messages"] == 0


def _join_time(items: int, size: int) -> float:
    part = [{"type": "summary_text", "text": "r" * size}]
    body = [{"type": "reasoning", "summary": part}] * items + [{"role": "assistant", "content": ""}]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        got = input_messages(body)
        best = min(best, time.perf_counter() - start)
    assert len(got[0]["reasoning_content"]) == items * (size + 1) - 1
    return best


def test_reasoning_items_are_joined_in_linear_time():
    """2,000 reasoning items of 4 KB cost about what one item of the same 8 MB does (on main the
    text was concatenated item by item, copying 8 GB: hundreds of times longer)."""
    one = _join_time(1, 2000 * 4096)
    many = _join_time(2000, 4096)
    assert many < 30 * one + 0.05, (one, many)
