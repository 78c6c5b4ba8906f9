"""Every hostile body of the corpus gets its 4xx, naming the field, in its API's shape (OpenAI's, or
Anthropic's on /v1/messages; never a 500, never a silently changed result), and the server is
fine afterwards."""

from __future__ import annotations

import pytest

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.messages.errors import QUOTE_LIMIT
from tokenwire.server import ServerConfig, create_app
from tokenwire.server.anthropic.errors import error_type

from asgi_client import call
from conftest import real_tokenizer
from corpus import CORPUS


@pytest.fixture
async def app():
    tok = real_tokenizer("default")
    app = create_app(tok, SyntheticEngine(tok, SyntheticConfig(step_time=0)), ServerConfig())
    await app.runtime.start()
    yield app
    await app.runtime.close()


@pytest.mark.parametrize(
    ("name", "path", "body", "status", "param"), CORPUS, ids=[c[0] for c in CORPUS]
)
async def test_hostile_body(app, name, path, body, status, param):
    resp = await call(app, "POST", path, body)
    assert resp.status == status, resp.body[:300]
    assert resp.headers[b"content-type"] == b"application/json"
    assert int(resp.headers[b"content-length"]) == len(resp.body)
    if path.startswith("/v1/messages"):  # Anthropic's shape: the message names the field
        answer = resp.json()
        assert answer["type"] == "error" and set(answer["error"]) == {"type", "message"}
        err = answer["error"]
        assert err["type"] == error_type(status)
        assert param is None or param in err["message"], err
    else:
        err = resp.error()
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
        assert err["param"] == param, err
    # Client input is quoted only up to a short limit.
    assert len(err["message"]) < 4 * QUOTE_LIMIT + 200, err["message"]
    health = await call(app, "GET", "/health")
    assert health.status == 200
    assert len(app.runtime.shard) == 0
