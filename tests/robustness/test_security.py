"""API key, cross-site content types, CORS, quoting limits."""

from __future__ import annotations

import json

import pytest

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.server import ServerConfig, create_app
from tokenwire.server.security import SecurityConfig

from asgi_client import call
from conftest import real_tokenizer

BODY = b'{"prompt": "Hi", "max_tokens": 2}'
JSON = (b"content-type", b"application/json")


@pytest.fixture
async def make():
    apps = []

    async def make(**security):
        tok = real_tokenizer("default")
        engine = SyntheticEngine(tok, SyntheticConfig(step_time=0))
        app = create_app(tok, engine, ServerConfig(security=SecurityConfig(**security)))
        await app.runtime.start()
        apps.append(app)
        return app

    yield make
    for app in apps:
        await app.runtime.close()


async def test_api_key_on_every_route_but_health_and_metrics(make):
    app = await make(api_keys=("s3cret",))
    for method, path, body in [
        ("POST", "/v1/completions", BODY),
        ("GET", "/v1/models", b""),
        ("POST", "/tokenize", b'{"prompt": "x"}'),
        ("GET", "/nowhere", b""),
    ]:
        for auth in ([], [(b"authorization", b"Bearer wrong")], [(b"authorization", b"s3cret")]):
            resp = await call(app, method, path, body, [JSON, *auth])
            assert resp.status == 401, (path, auth)
            err = resp.error()
            assert err["code"] == 401 and err["type"] == "invalid_request_error"
    ok = [JSON, (b"authorization", b"Bearer s3cret")]
    assert (await call(app, "POST", "/v1/completions", BODY, ok)).status == 200
    assert (await call(app, "GET", "/v1/models", b"", ok)).status == 200
    assert (await call(app, "GET", "/health", b"", [])).status == 200
    assert (await call(app, "GET", "/metrics", b"", [])).status == 200


async def test_several_keys_each_admit_and_name_the_key_in_the_scope():
    from tokenwire.server.security import KEY_SCOPE, ApiKey, Security, request_key

    security = Security(SecurityConfig(api_keys=("alpha", "beta")))

    def scope(*headers):
        return {"path": "/v1/models", "method": "GET", "headers": list(headers)}

    seen = []
    for header in [(b"authorization", b"Bearer alpha"), (b"x-api-key", b"beta")]:
        s = scope(header)
        assert security.check(s) is None
        seen.append(request_key(s))
    assert seen == [ApiKey.of("alpha"), ApiKey.of("beta")]
    assert seen[0].id != seen[1].id and "alpha" not in repr(seen[0])
    # the id is stable: derived from the key, not from its place in the list
    assert ApiKey.of("beta") == request_key(
        (lambda s: (Security(SecurityConfig(api_keys=("beta",))).check(s), s)[1])(
            scope((b"x-api-key", b"beta"))
        )
    )
    refused = scope((b"authorization", b"Bearer gamma"))
    assert security.check(refused).status == 401 and KEY_SCOPE not in refused
    open_scope = {"path": "/health", "method": "GET", "headers": []}
    assert security.check(open_scope) is None and request_key(open_scope) is None
    assert request_key(scope()) is None  # no key required: none recorded


def test_api_key_flag_takes_several_keys():
    from tokenwire.entrypoints.cli import build_parser
    from tokenwire.entrypoints.options.server import security_config

    args = build_parser().parse_args(["serve", "--api-key", "k1", "k2"])
    assert security_config(args).api_keys == ("k1", "k2")
    args = build_parser().parse_args(["serve"])
    assert security_config(args).api_keys == ()


@pytest.mark.parametrize(
    "ctype",
    [
        b"text/plain",
        b"text/plain;charset=UTF-8",
        b"application/x-www-form-urlencoded",
        b"multipart/form-data; boundary=x",
        b"TEXT/PLAIN",
    ],
)
async def test_cross_site_content_types_are_415(make, ctype):
    app = await make()
    resp = await call(app, "POST", "/v1/completions", BODY, [(b"content-type", ctype)])
    assert resp.status == 415 and resp.error()["code"] == 415


async def test_missing_content_type_is_json(make):
    app = await make()
    assert (await call(app, "POST", "/v1/completions", BODY, [])).status == 200


@pytest.mark.parametrize(
    ("origin", "host", "status"),
    [
        (b"https://evil.example", b"127.0.0.1:8000", 403),  # a page elsewhere: no CORS for it
        (b"null", b"127.0.0.1:8000", 403),  # a sandboxed page, a file
        (b"http://127.0.0.1:8000", b"127.0.0.1:8000", 200),  # this server's own origin
        (None, b"127.0.0.1:8000", 200),  # not from a browser
    ],
)
@pytest.mark.parametrize("ctype", [None, b"application/json"])
async def test_a_post_from_another_origin_is_refused(make, origin, host, status, ctype):
    """``fetch(url, {method: "POST", mode: "no-cors", body: new Blob([json])})`` sends no
    Content-Type, and browsers always send Origin with it."""
    app = await make()
    headers = [(b"host", host)]
    headers += [(b"origin", origin)] if origin else []
    headers += [(b"content-type", ctype)] if ctype else []
    resp = await call(app, "POST", "/v1/completions", BODY, headers)
    assert resp.status == status
    if status == 403:
        assert resp.error()["code"] == 403 and "--allowed-origins" in resp.error()["message"]
    # Reading is not a cross-site write: GET routes answer whatever the Origin.
    resp = await call(app, "GET", "/v1/models", b"", [(b"origin", b"https://evil.example")])
    assert resp.status == 200


@pytest.mark.parametrize(
    ("host", "origin", "allowed", "status"),
    [
        # A DNS-rebinding page: its own name in both Host and Origin (served on main: 200).
        (b"rebind.evil.example:8000", b"http://rebind.evil.example:8000", (), 400),
        (b"rebind.evil.example:8000", None, (), 400),
        # The server's own names: loopback, the address the request reached, a configured one.
        (b"localhost:8000", b"http://localhost:8000", (), 200),
        (b"[::1]:8000", None, (), 200),
        (b"127.0.0.1:8000", None, (), 200),
        (b"api.example.com", b"https://api.example.com", ("api.example.com",), 200),
        (b"eu.api.example.com:443", None, (".example.com",), 200),
        (b"127.0.0.1:8000", None, ("api.example.com",), 400),  # only what is configured
        (b"anything.example", None, ("*",), 200),
    ],
)
async def test_a_host_the_server_does_not_answer_to_is_refused(make, host, origin, allowed, status):
    """The cross-site check compares the Origin with the server's own names (``--allowed-hosts``,
    by default loopback and the address reached), not with the request's own ``Host``."""
    app = await make(allowed_hosts=allowed)
    headers = [(b"host", host), JSON] + ([(b"origin", origin)] if origin else [])
    resp = await call(app, "POST", "/v1/completions", BODY, headers)
    assert resp.status == status, resp.body[:200]
    if status == 400:
        assert "--allowed-hosts" in resp.error()["message"]
    # Probes answer whatever the Host (a load balancer's health check names its own).
    health = await call(app, "GET", "/health", b"", [(b"host", host)])
    assert health.status == 200


def test_allowed_hosts_flag():
    from tokenwire.entrypoints.cli import build_parser
    from tokenwire.entrypoints.options.server import security_config

    args = build_parser().parse_args(["serve", "--allowed-hosts", "a.example,.b.example"])
    assert security_config(args).allowed_hosts == ("a.example", ".b.example")


async def test_cors_is_off_by_default(make):
    app = await make()
    origin = (b"origin", b"https://evil.example")
    resp = await call(app, "POST", "/v1/completions", BODY, [JSON, origin])
    assert resp.status == 403 and b"access-control-allow-origin" not in resp.headers
    preflight = [origin, (b"access-control-request-method", b"POST")]
    resp = await call(app, "OPTIONS", "/v1/completions", b"", preflight)
    assert resp.status in (404, 405) and b"access-control-allow-origin" not in resp.headers


async def test_cors_with_allowed_origins(make):
    app = await make(allowed_origins=("https://app.example",), allow_credentials=True)
    good = (b"origin", b"https://app.example")
    preflight = [
        good,
        (b"access-control-request-method", b"POST"),
        (b"access-control-request-headers", b"authorization, content-type"),
    ]
    resp = await call(app, "OPTIONS", "/v1/chat/completions", b"", preflight)
    assert resp.status == 200
    assert resp.headers[b"access-control-allow-origin"] == b"https://app.example"
    assert resp.headers[b"access-control-allow-credentials"] == b"true"
    assert b"POST" in resp.headers[b"access-control-allow-methods"]
    assert resp.headers[b"access-control-allow-headers"] == b"authorization, content-type"
    resp = await call(app, "POST", "/v1/completions", BODY, [JSON, good])
    assert resp.status == 200
    assert resp.headers[b"access-control-allow-origin"] == b"https://app.example"
    bad = (b"origin", b"https://evil.example")
    resp = await call(app, "OPTIONS", "/v1/completions", b"", [bad, preflight[1]])
    assert resp.status == 400 and b"access-control-allow-origin" not in resp.headers
    resp = await call(app, "POST", "/v1/completions", BODY, [JSON, bad])
    assert resp.status == 403 and b"access-control-allow-origin" not in resp.headers


async def test_error_messages_quote_input_briefly(make):
    app = await make()
    huge = "x" * 100_000
    for body in (
        {"prompt": "x", "stop": [huge]},
        {"prompt": "x", "temperature": huge},
        {"prompt": "x", "logit_bias": {huge: 1}},
        {"prompt": "x", "n": huge},
        {"prompt": "x", huge: 1, "max_tokens": huge},
        {"messages": [{"role": "user", "content": [{"type": huge}]}]},
    ):
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        resp = await call(app, "POST", path, json.dumps(body).encode())
        assert resp.status == 400
        assert len(resp.error()["message"]) <= 1024
        assert len(resp.body) < 2000
