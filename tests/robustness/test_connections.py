"""Connections are bounded in time and number, and /health answers through it all."""

from __future__ import annotations

import socket
import time

import httpx
import msgspec

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.server.serving import ConnectionLimits

from served import serve, wait_until


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(10)
    return s


def _read_all(s: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def test_a_connection_that_sends_nothing_is_closed():
    with serve(SyntheticConfig(), ConnectionLimits(idle_timeout=0.3)) as s:
        sock = _connect(s.port)
        assert _read_all(sock) == b""  # closed by the server (the read would time out otherwise)
        sock.close()


def test_slowloris_headers_get_408_and_are_closed():
    with serve(SyntheticConfig(), ConnectionLimits(header_timeout=0.5, idle_timeout=5)) as s:
        sock = _connect(s.port)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n")
        closed = False
        for _ in range(40):  # a header byte every 0.1 s, never finishing
            try:
                sock.sendall(b"X")
            except OSError:
                closed = True
                break
            time.sleep(0.1)
        answer = _read_all(sock)
        assert closed or answer.startswith(b"HTTP/1.1 408")
        if answer:
            err = msgspec.json.decode(answer.split(b"\r\n\r\n", 1)[1])["error"]
            assert err["code"] == 408
        sock.close()
        assert httpx.get(s.url + "/health").status_code == 200


def test_connection_cap_answers_503_and_health_still_answers():
    limits = ConnectionLimits(max_connections=8, idle_timeout=None, header_timeout=None)
    with serve(SyntheticConfig(), limits) as s:
        idle = [_connect(s.port) for _ in range(8)]
        assert wait_until(lambda: len(s.server.server_state.connections) >= 8)
        with httpx.Client() as client:
            # A request with a body, refused before it is read.
            resp = client.post(s.url + "/v1/completions", json={"prompt": "x" * 5000})
            assert resp.status_code == 503
            resp = client.get(s.url + "/v1/models")
            assert resp.status_code == 503
            err = msgspec.json.decode(resp.content)["error"]
            assert err["code"] == 503 and "connections" in err["message"]
            assert resp.headers["connection"] == "close"
            assert client.get(s.url + "/health").status_code == 200
        # Past the reserve above the cap, connections are closed at once.
        extra = [_connect(s.port) for _ in range(40)]
        assert wait_until(lambda: len(s.server.server_state.connections) <= limits.hard_cap)
        closed = 0
        for sock in extra:
            sock.settimeout(0.5)
            try:
                closed += sock.recv(1) == b""
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 40 - (limits.hard_cap - 8)
        for sock in idle + extra:
            sock.close()
        assert wait_until(lambda: len(s.server.server_state.connections) == 0)
        assert httpx.get(s.url + "/v1/models").status_code == 200


def test_a_websocket_upgrade_is_served_as_http_and_keeps_no_place():
    # tokenwire serves no WebSocket: an upgrade request is plain HTTP (not a 500 from an app that
    # never accepts it), and its connection gives its place back when it closes.
    limits = ConnectionLimits(max_connections=2, idle_timeout=None, header_timeout=None)
    with serve(SyntheticConfig(), limits) as s:
        for _ in range(4):
            sock = _connect(s.port)
            sock.sendall(
                b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n"
            )
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            sock.close()
        assert wait_until(lambda: len(s.server.server_state.connections) == 0)
        assert httpx.get(s.url + "/v1/models").status_code == 200


def test_a_malformed_request_is_a_json_400_and_never_lands_inside_another_response():
    with serve(SyntheticConfig(output="random", step_time=0.005)) as s:
        sock = _connect(s.port)
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"
        )
        head, body = _read_all(sock).split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
        assert msgspec.json.decode(body)["error"]["code"] == 400
        sock.close()
        # Garbage pipelined behind a stream: the stream's response is not interleaved with a
        # second status line; the connection goes, and the stream's engine request with it.
        body = msgspec.json.encode({"prompt": "x", "max_tokens": 3000, "stream": True})
        sock = _connect(s.port)
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.sendall(b"garbage\r\n\r\n")
        assert b"HTTP/1.1 400" not in _read_all(sock)
        sock.close()
        assert wait_until(lambda: len(s.runtime.shard) == 0)
        assert httpx.get(s.url + "/health").status_code == 200


def test_a_client_gone_with_a_request_pipelined_ends_the_request_being_answered():
    with serve(SyntheticConfig(output="random", step_time=0.005)) as s:
        for stream in (False, True):
            body = msgspec.json.encode({"prompt": "x", "max_tokens": 30000, "stream": stream})
            sock = _connect(s.port)
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n"
                % len(body)
                + body
                + b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
            )
            assert wait_until(lambda: s.engine.running == 1)
            sock.close()
            assert wait_until(lambda: s.engine.running == 0 and len(s.runtime.shard) == 0, 5)
        assert httpx.get(s.url + "/health").status_code == 200
