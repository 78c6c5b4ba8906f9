"""Request size and time limits, and big inputs kept off the event loop."""

from __future__ import annotations

import asyncio
import json

import pytest

from tokenwire.context_length import max_prompt_chars
from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.server import ServerConfig, create_app
from tokenwire.server.limits import OFFLOAD_BYTES

from asgi_client import call
from conftest import real_tokenizer


async def _app(**config):
    tok = real_tokenizer("default")
    engine = SyntheticEngine(tok, SyntheticConfig(step_time=0))
    app = create_app(tok, engine, ServerConfig(**config))
    await app.runtime.start()
    return app


async def test_declared_body_over_the_limit_is_413_before_reading_it():
    app = await _app(max_request_bytes=1000)
    try:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"5000000")]
        resp = await call(app, "POST", "/v1/completions", b"", headers)
        assert resp.status == 413 and resp.error()["code"] == 413
        assert "--max-request-bytes" in resp.error()["message"]
        assert resp.headers[b"connection"] == b"close"
        # An undeclared body is refused as soon as it passes the limit.
        body = json.dumps({"prompt": "x" * 2000}).encode()
        resp = await call(app, "POST", "/v1/completions", body)
        assert resp.status == 413
        # Under the limit: served.
        resp = await call(app, "POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 2}')
        assert resp.status == 200
    finally:
        await app.runtime.close()


async def test_body_that_never_arrives_is_408():
    app = await _app(body_timeout=0.2)
    try:
        sent = []

        async def receive():
            await asyncio.Event().wait()  # the body never comes

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
        await asyncio.wait_for(app(scope, receive, send), 10)
        assert sent[0]["status"] == 408
    finally:
        await app.runtime.close()


async def test_text_too_long_for_the_context_is_refused_before_tokenizing(monkeypatch):
    app = await _app()
    try:
        tok = app.runtime.tokenizer
        most = max_prompt_chars(tok)
        assert most is not None
        calls = []
        real = tok.encode
        monkeypatch.setattr(tok, "encode", lambda *a, **k: calls.append(1) or real(*a, **k))
        body = json.dumps({"prompt": "a" * (most + 1)}).encode()
        resp = await call(app, "POST", "/v1/completions", body)
        assert resp.status == 400 and resp.error()["param"] == "prompt"
        assert calls == []  # never tokenized
        chat = {"messages": [{"role": "user", "content": "a" * (most + 1)}]}
        resp = await call(app, "POST", "/v1/chat/completions", json.dumps(chat).encode())
        assert resp.status == 400 and resp.error()["param"] == "messages" and calls == []
    finally:
        await app.runtime.close()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate"])
async def test_large_prompt_is_tokenized_off_the_event_loop(path, monkeypatch):
    app = await _app()
    # A context that holds it: the prompt is tokenized whole (one past the context is refused
    # after a bounded part of it, tests/robustness/test_bounded_inputs.py).
    monkeypatch.setattr(app.runtime.tokenizer, "max_model_len", 10**7)
    try:
        text = "hello world, " * 150_000  # ~2M characters: ~0.5 s of tokenizing
        assert len(text) > OFFLOAD_BYTES
        if path == "/generate":
            body = {"text": text, "sampling_params": {"max_new_tokens": 1}}
        elif path == "/v1/completions":
            body = {"prompt": text, "max_tokens": 1}
        else:
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
        order = []

        async def big():
            resp = await call(app, "POST", path, json.dumps(body).encode(), timeout=60)
            order.append("big")
            assert resp.status == 200

        async def health():
            await asyncio.sleep(0.05)
            resp = await call(app, "GET", "/health")
            order.append("health")
            assert resp.status == 200

        await asyncio.gather(big(), health())
        assert order == ["health", "big"]  # /health answered while the prompt was tokenized
    finally:
        await app.runtime.close()
