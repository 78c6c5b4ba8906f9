"""Accepting every connection that waits on a listening socket at once, under uvloop.

libuv (uvloop's core) accepts one connection per turn of the event loop since its 1.45 (it
relies on the next poll to report the next one). A streaming server's turns are long: each one
writes a decode step to hundreds of streams. At a few hundred new connections a second the
others wait in the kernel's backlog, tens of milliseconds each, before a byte of their request
is read, the time to first token of every request grows by that much, and fewer requests run
at once than the clients send. (asyncio's own loop accepts up to the backlog at each poll.)

``Acceptor`` holds duplicates of a server's listening sockets; each connection libuv accepts
calls ``drain``, which accepts what else is waiting (``BATCH`` at most per socket) and hands
each to the loop as a connection of the server's own protocol, through
``connect_accepted_socket``. It is a plain object over the loop and its sockets; the HTTP
protocol calls it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

__all__ = ["BATCH", "Acceptor", "drive", "wants_acceptor"]

log = logging.getLogger("tokenwire.server")

#: Connections one ``drain`` accepts per listening socket at most (the rest wait for the next
#: connection libuv accepts, or the next turn).
BATCH = 128

#: ``accept`` errors after which this drain stops (out of descriptors or memory: libuv's own
#: accept reports them and retries on its next turn).
_STOP = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def wants_acceptor(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` accepts one connection per turn (uvloop's)."""
    return type(loop).__module__.partition(".")[0] == "uvloop"


def drive(
    coro: Coroutine[Any, Any, Any],
    done: Callable[[Any], None],
    failed: Callable[[BaseException], None],
) -> None:
    """Run ``coro`` on the running loop as a task would, without a task: its steps from the
    done callbacks of the futures it awaits; its result goes to ``done``, an exception to
    ``failed``. (A task costs a turn of the loop before its first step.)"""
    try:
        waiting = coro.send(None)
    except StopIteration as stop:
        done(stop.value)
        return
    except BaseException as exc:  # (handed to the caller's handler)
        failed(exc)
        return
    waiting._asyncio_future_blocking = False
    waiting.add_done_callback(lambda _: drive(coro, done, failed))


class Acceptor:
    """Accepts the connections waiting on ``listeners`` (duplicates of a server's listening
    sockets, owned here) as connections of ``factory``'s protocols on ``loop``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        factory: Callable[[], asyncio.Protocol],
        listeners: Iterable[socket.socket],
    ) -> None:
        self.loop = loop
        self.factory = factory
        self.listeners = list(listeners)
        for sock in self.listeners:
            sock.setblocking(False)
        #: Connections this acceptor handed to the loop (the tests read it).
        self.accepted = 0

    @classmethod
    def of_servers(
        cls,
        loop: asyncio.AbstractEventLoop,
        factory: Callable[[], asyncio.Protocol],
        servers: Iterable[Any],
    ) -> Acceptor:
        """An acceptor over duplicates of the listening sockets of ``servers`` (asyncio
        ``Server`` objects)."""
        listeners = []
        for server in servers:
            for sock in server.sockets or ():
                listeners.append(socket.socket(fileno=os.dup(sock.fileno())))
        return cls(loop, factory, listeners)

    def drain(self) -> None:
        """Accept what waits on every listening socket, up to ``BATCH`` each."""
        for sock in self.listeners:
            for _ in range(BATCH):
                try:
                    conn, _ = sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionAbortedError:
                    continue
                except OSError as exc:
                    if exc.errno in _STOP:
                        log.warning("accepting connections: %s", exc)
                    break  # (a closed listener among them)
                self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        conn.setblocking(False)  # (uvloop's TCP transports set TCP_NODELAY themselves)
        self.accepted += 1
        coro = self.loop.connect_accepted_socket(self.factory, conn)  # type: ignore[arg-type]

        def failed(exc: BaseException) -> None:
            conn.close()
            if not isinstance(exc, (OSError, asyncio.CancelledError)):
                raise exc
            log.debug("an accepted connection failed: %s", exc)

        drive(coro, lambda _: None, failed)

    def close(self) -> None:
        """Close the duplicates (the port stops listening once the server closes its own)."""
        for sock in self.listeners:
            sock.close()
        self.listeners = []
