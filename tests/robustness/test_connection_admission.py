"""Connection admission under ``max_connections``, driven at the protocol level: requests whose
headers arrive together, before any connection closes, as in a burst."""

from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.server import ServerState

from tokenwire.server.serving import ConnectionLimits, connection_protocol

REQUEST = b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n"


class _Transport(asyncio.Transport):
    """A connection's transport that keeps what the server writes."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.out = b""
        self.closed = False

    def get_extra_info(self, name, default=None):
        peers = {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000 + self.n)}
        return peers.get(name, default)

    def write(self, data) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True

    abort = close

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _connections(count: int, cap: int):
    limits = ConnectionLimits(max_connections=cap, idle_timeout=None, header_timeout=None)
    protocol = connection_protocol(limits)
    config = uvicorn.Config(_app, http=protocol, log_level="warning")
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    out = []
    for n in range(count):
        conn = protocol(config=config, server_state=state, app_state={}, _loop=loop)
        transport = _Transport(n)
        conn.connection_made(transport)
        out.append((conn, transport))
    return out


def _status(transport: _Transport) -> int:
    return int(transport.out.split(b" ", 2)[1])


async def test_a_burst_past_the_cap_is_served_up_to_the_cap():
    """Twelve connections, then their twelve requests at once, against a cap of eight: eight are
    served (not none, as when each request counted the connections open at the time)."""
    conns = _connections(12, cap=8)
    for conn, _ in conns:
        conn.data_received(REQUEST)
    await asyncio.sleep(0.05)
    assert sorted(_status(t) for _, t in conns) == [200] * 8 + [503] * 4
    assert [t.closed for _, t in conns[8:]] == [True] * 4  # the last ones have no place


async def test_a_place_freed_before_the_request_comes_is_taken():
    """A connection accepted past the cap is served if a place was freed (a connection closed)
    before its request came."""
    conns = _connections(9, cap=8)
    conns[0][0].connection_lost(None)
    conns[8][0].data_received(REQUEST)
    await asyncio.sleep(0.05)
    assert _status(conns[8][1]) == 200
