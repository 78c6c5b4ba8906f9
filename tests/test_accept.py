"""Every connection waiting on the listening socket is accepted at once under uvloop
(``tokenwire.server.accept``): libuv takes one a turn of the event loop."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import ClassVar

import pytest

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.server.accept import Acceptor, drive, wants_acceptor

from served import raw_request, serve

uvloop = pytest.importorskip("uvloop", reason="uvloop is uvicorn[standard]'s loop on Linux")


class _Made(asyncio.Protocol):
    made: ClassVar[list[asyncio.Transport]] = []

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        _Made.made.append(transport)


def test_a_drain_accepts_every_waiting_connection_in_one_turn():
    _Made.made = []

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        assert wants_acceptor(loop)
        server = await loop.create_server(_Made, "127.0.0.1", 0)
        acceptor = Acceptor.of_servers(loop, _Made, [server])
        port = server.sockets[0].getsockname()[1]
        # (the kernel completes each handshake; none is accepted while this runs)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        acceptor.drain()
        await asyncio.sleep(0)  # (uvloop calls connection_made soon after the accept)
        got = len(_Made.made), acceptor.accepted
        for transport in _Made.made:
            transport.close()
        for c in clients:
            c.close()
        acceptor.close()
        server.close()
        await server.wait_closed()
        return got

    assert uvloop.run(main()) == (20, 20)


def test_drive_runs_a_coroutine_without_a_task_and_hands_its_result_or_error():
    async def main() -> list:
        loop = asyncio.get_running_loop()
        seen: list = []

        async def two_steps(fut: asyncio.Future) -> int:
            return await fut + 1

        fut = loop.create_future()
        drive(two_steps(fut), seen.append, lambda e: seen.append(("failed", e)))
        assert seen == []  # waiting on fut
        fut.set_result(41)
        await asyncio.sleep(0)

        async def boom() -> None:
            raise KeyError("x")

        drive(boom(), seen.append, lambda e: seen.append(("failed", type(e))))
        return seen

    assert asyncio.run(main()) == [42, ("failed", KeyError)]


def _health(port: int) -> socket.socket:
    return raw_request(port, "GET", "/health")


def test_a_burst_of_connections_is_accepted_with_the_first_and_all_are_answered():
    """While the server's loop is busy, 30 connections wait in the backlog; the first one
    libuv accepts brings the 29 others in with it (its loop's acceptor), and all are
    answered."""
    with serve(SyntheticConfig(step_time=0)) as s:
        state = s.server.server_state
        acceptor = state.tokenwire_acceptor
        assert acceptor is not None
        before = acceptor.accepted
        acceptor.loop.call_soon_threadsafe(time.sleep, 0.5)  # the loop busy for half a second
        time.sleep(0.1)
        clients = [_health(s.port) for _ in range(30)]
        answers = []
        for c in clients:
            c.settimeout(10)
            answers.append(c.recv(65536))
            c.close()
        assert all(a.startswith(b"HTTP/1.1 200") for a in answers)
        assert acceptor.accepted - before == 29


def test_the_port_stops_listening_when_the_server_stops():
    """The acceptor's duplicates of the listening socket are closed at shutdown (left open,
    they would keep the port accepting connections nobody serves)."""
    with serve(SyntheticConfig(step_time=0)) as s:
        port = s.port
        assert s.server.server_state.tokenwire_acceptor is not None
        _health(port).close()
    assert s.server.server_state.tokenwire_acceptor is None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
