"""Request headers are bounded (vLLM's ``--h11-max-header-count`` and
``--h11-max-incomplete-event-size`` meanings: a 431 and the connection closed), and a finished
request's objects are freed at once, with no garbage collection (nothing of a request, its
headers above all, outlives it in a reference cycle)."""

from __future__ import annotations

import contextlib
import gc
import socket
import time
import weakref

import pytest

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.server.app import App
from tokenwire.server.security import SecurityConfig
from tokenwire.server.serving import ConnectionLimits

from served import serve


def _exchange(port: int, head: bytes, body: bytes = b"") -> bytes:
    """Send one request (``Connection: close``) and read the whole answer."""
    c = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        # (The server may answer and close before it all went.)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            c.sendall(head + body)
        data = b""
        while True:
            try:
                got = c.recv(65536)
            except ConnectionResetError:
                break
            if not got:
                break
            data += got
        return data
    finally:
        c.close()


def _head(method: str, path: str, headers: list[tuple[str, str]], length: int = 0) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: localhost", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers]
    if length:
        lines += ["Content-Type: application/json", f"Content-Length: {length}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ([(f"X-H{k}", "v") for k in range(300)], b"header fields"),  # past 256 fields
        ([("X-Big", "a" * (5 << 20))], b"bytes"),  # past 4 MiB
        ([(f"X-H{k}", "a" * 60_000) for k in range(80)], b"bytes"),  # 4.8 MB in many
    ],
)
def test_headers_past_the_limits_are_a_431_and_the_connection_closes(headers, why):
    with serve(SyntheticConfig(step_time=0)) as s:
        answer = _exchange(s.port, _head("GET", "/health", headers))
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert why in answer and b'"code":431' in answer
        # Within the limits (and others' requests meanwhile): served.
        ok = _exchange(s.port, _head("GET", "/health", [("X-H", "a" * 100_000)]))
        assert ok.startswith(b"HTTP/1.1 200 ")


def test_the_header_limits_are_settings():
    limits = ConnectionLimits(max_header_count=4, max_header_bytes=None)
    with serve(SyntheticConfig(step_time=0), limits) as s:
        many = [(f"X-H{k}", "v") for k in range(5)]
        assert _exchange(s.port, _head("GET", "/health", many)).startswith(b"HTTP/1.1 431 ")
        big = [("X-Big", "a" * (6 << 20))]
        assert _exchange(s.port, _head("GET", "/health", big)).startswith(b"HTTP/1.1 200 ")


class _Marker:
    """Put in a request's scope: freed when the scope is."""


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 3}', b"200"),
        ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 3, "stream": true}', b"200"),
        ("POST", "/v1/chat/completions", b'{"messages": [{"role": 7}]}', b"400"),
        ("GET", "/health", b"", b"200"),
        ("GET", "/v1/models", b"", b"401"),
    ],
)
def test_a_finished_request_is_freed_without_a_garbage_collection(
    monkeypatch, method, path, body, status
):
    refs: list[weakref.ref] = []
    call = App.__call__

    async def marked(self, scope, receive, send):
        if scope["type"] == "http":
            marker = _Marker()
            scope["marker"] = marker
            refs.append(weakref.ref(marker))
        await call(self, scope, receive, send)

    monkeypatch.setattr(App, "__call__", marked)
    security = SecurityConfig(api_keys=("k",)) if status == b"401" else SecurityConfig()
    with serve(SyntheticConfig(step_time=0), security=security) as s:
        gc.collect()
        gc.disable()
        try:
            headers = [("X-Big", "a" * 100_000)]
            answer = _exchange(s.port, _head(method, path, headers, len(body)), body)
            assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
            deadline = time.monotonic() + 5
            while refs[-1]() is not None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert refs[-1]() is None, "the request's scope outlived it"
        finally:
            gc.enable()
