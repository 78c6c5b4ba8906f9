"""What one request can make the server hold is bounded by what it sent: a prompt past the context
is refused after tokenizing a bounded part of it (on every route that tokenizes), a batch past the
limit is refused before anything is tokenized, unknown field names are remembered only briefly,
and messages are checked by type before use."""

from __future__ import annotations

import json
import logging

import pytest

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.server import ServerConfig, create_app, fields

from asgi_client import call
from conftest import real_tokenizer

HUGE = "7" * 20_000_000  # 20 million digits: 20 million Qwen3 tokens


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


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": HUGE}, "prompt"),
        ("/v1/completions", {"prompt": ["hi", HUGE]}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": HUGE}]}, "messages"),
        ("/generate", {"text": HUGE}, "text"),
        ("/tokenize", {"prompt": HUGE}, "prompt"),
        ("/tokenize", {"messages": [{"role": "user", "content": HUGE}]}, "messages"),
    ],
)
async def test_a_prompt_far_past_the_context_is_refused_after_a_bounded_part(
    app, tokenized, path, body, param
):
    resp = await call(app, "POST", path, json.dumps(body).encode(), timeout=60)
    assert resp.status == 400 and resp.error()["param"] == param
    assert "maximum context length" in resp.error()["message"]
    assert tokenized["chars"] < 300_000  # not the 20 million characters


async def test_truncating_a_huge_prompt_tokenizes_only_its_end(app, tokenized):
    body = {"prompt": "Start. " + HUGE, "truncate_prompt_tokens": 50, "max_tokens": 2}
    resp = await call(app, "POST", "/v1/completions", json.dumps(body).encode(), timeout=60)
    assert resp.status == 200 and resp.json()["usage"]["prompt_tokens"] == 50
    assert tokenized["chars"] < 300_000


async def test_tokenize_refuses_a_text_past_the_context(app):
    limit = app.runtime.tokenizer.max_model_len
    resp = await call(app, "POST", "/tokenize", json.dumps({"prompt": "7" * (limit + 1)}).encode())
    assert resp.status == 400 and resp.error()["param"] == "prompt"
    resp = await call(app, "POST", "/tokenize", json.dumps({"prompt": "7" * limit}).encode())
    assert resp.status == 200 and resp.json()["count"] == limit


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/generate", {"text": ["x" * 1000] * 20_000}, "n"),
        ("/v1/completions", {"prompt": ["x" * 1000] * 20_000}, "n"),
        ("/v1/completions", {"prompt": ["x" * 1000] * 100, "n": 3}, "n"),
    ],
)
async def test_a_batch_past_the_limit_is_refused_before_anything_is_tokenized(
    app, tokenized, path, body, param
):
    resp = await call(app, "POST", path, json.dumps(body).encode(), timeout=60)
    assert resp.status == 400 and resp.error()["param"] == param
    assert "limit is 256" in resp.error()["message"]
    assert tokenized["chars"] == 0


@pytest.mark.parametrize("role", [[1], {"a": 1}, 7, None, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
async def test_a_role_of_the_wrong_type_is_a_400(app, path, role):
    body = {"messages": [{"role": role, "content": "hi"}]}
    resp = await call(app, "POST", path, json.dumps(body).encode())
    assert resp.status == 400 and resp.error()["param"] == "messages"
    # (any string is a role the chat template may know, as vLLM passes it; these are not strings)
    assert "role must be a non-empty string" in resp.error()["message"]


async def test_unknown_field_names_are_kept_and_logged_briefly(app, monkeypatch, caplog):
    monkeypatch.setattr(fields, "_warned", set())
    names = [str(k) * 2_000_000 for k in range(3)]  # 2 MB names
    with caplog.at_level(logging.WARNING, "tokenwire.server"):
        for name in names:
            body = {"prompt": "x", "max_tokens": 1, name: 1}
            resp = await call(app, "POST", "/v1/completions", json.dumps(body).encode())
            assert resp.status == 200
    assert len(fields._warned) == 3
    assert all(len(name) <= 48 for name in fields._warned)
    assert max(len(r.getMessage()) for r in caplog.records) < 200
