"""Serving the app over HTTP/1.1 (uvicorn), bounded in connections and time, with a graceful
shutdown.

uvicorn gives a keep-alive timeout between requests and ``limit_concurrency``, which answers 503
to *every* request past the limit (``/health`` too) and never times out a connection that has
not sent a full request. tokenwire's connection protocol adds:

- an idle timeout before a connection's first byte (and between requests: uvicorn's keep-alive),
- header limits (vLLM's ``--h11-max-header-count`` and ``--h11-max-incomplete-event-size``): a
  request with more header fields, or whose request line and headers take more bytes, is
  answered 431 and its connection closed, before more of it is kept,
- a header timeout: a request's headers must be complete within ``header_timeout`` seconds of its
  first byte (slowloris), else 408 and the connection is closed,
- ``max_connections``: connections are admitted in the order they come, up to this many at a
  time (a connection keeps its place until it closes; one accepted past the limit takes a place
  freed before its request arrives); a request on a connection without a place gets a 503 in
  OpenAI's shape and its connection is closed, except ``/health``, which keeps answering; past a
  small reserve above the limit, connections are closed as soon as they are accepted (so
  descriptors never run out).
- TLS (``--ssl-certfile``) is done by the connection protocol itself, from the connection's
  accept: a connection in its TLS handshake counts against ``max_connections`` (and the reserve
  above it) like any other, and a handshake not done within ``header_timeout`` seconds closes it
  (asyncio's own handshake, before any protocol sees the connection, waits 60 s uncounted).

``TokenwireServer`` shuts down gracefully: it stops accepting, lets requests in flight finish for
up to ``shutdown_timeout`` seconds (new ones get a 503), then ends every stream with an error
event and ``[DONE]`` and every unary request with a JSON 503, and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import ssl
import weakref
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tokenwire.messages.errors import QueueFullError, RequestTimeoutError, ValidationError
from tokenwire.server.accept import Acceptor, drive, wants_acceptor
from tokenwire.server.errors import error_body
from tokenwire.server.http import GONE_ATTR, encode

__all__ = [
    "BODY_WRITER",
    "BodyWriter",
    "ConnectionLimits",
    "TokenwireServer",
    "connection_protocol",
    "raise_open_files_limit",
]

log = logging.getLogger("tokenwire.server")

#: Paths that keep answering past ``max_connections``.
_ALWAYS = {b"/health", b"/ping", b"/live", b"/ready"}


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds on connections, in number and in time (None: no bound)."""

    #: Connections admitted at a time; requests on the others get a 503 (``/health`` excepted).
    max_connections: int | None = 8192
    #: Seconds from a request's first byte to the end of its headers.
    header_timeout: float | None = 10.0
    #: Seconds a connection may stay silent before its first request and between requests.
    idle_timeout: float | None = 5.0
    #: Header fields a request may have (vLLM's ``--h11-max-header-count``).
    max_header_count: int | None = 256
    #: Bytes a request's line and headers may take (vLLM's ``--h11-max-incomplete-event-size``).
    max_header_bytes: int | None = 4 << 20

    @property
    def hard_cap(self) -> int | None:
        """Connections past which new ones are closed at once: a reserve above
        ``max_connections`` for ``/health`` and for the 503 answers."""
        if self.max_connections is None:
            return None
        return self.max_connections + max(16, self.max_connections // 16)


#: The ASGI scope extension under which tokenwire's connection protocol gives each request its
#: ``BodyWriter``.
BODY_WRITER = "tokenwire.body_writer"


class BodyWriter:
    """Writes a started response's body bytes straight to its connection, as a plain call
    instead of an ASGI ``send`` coroutine (for a stream's chunks, written from the loop callback
    that delivers a decode step to every stream). The response's start and end still go through
    ``send``; uvicorn's flow control still applies: while the connection's write buffer is full
    the writer is ``paused``, and ``drained`` waits for it to empty. It holds its request only
    weakly: it lives in the request's scope, which the request holds, and a reference back would
    keep a finished request (its headers, its body) alive until a garbage collection."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle: Any) -> None:
        self._cycle = weakref.ref(cycle)

    def serves(self, send: Any) -> bool:
        """Whether body bytes may bypass ``send`` (the ASGI ``send`` under the app's wrappers
        that pass mid-stream messages through, as ``guard.direct`` finds it): it is this
        request's own, and the response has started with chunked transfer coding."""
        cycle = self._cycle()
        return (
            cycle is not None
            and getattr(send, "__self__", None) is cycle
            and cycle.response_started
            and bool(cycle.chunked_encoding)
            and not cycle.response_complete
        )

    @property
    def paused(self) -> bool:
        """Whether the connection's write buffer is full (the client reads slowly)."""
        cycle = self._cycle()
        return cycle is not None and cycle.flow.write_paused and not cycle.disconnected

    def write(self, data: bytes) -> None:
        """Write ``data`` as one chunk of the response body (dropped once the client is gone or
        the response is over, as uvicorn's ``send`` drops it)."""
        cycle = self._cycle()
        if data and cycle is not None and not cycle.disconnected and not cycle.response_complete:
            cycle.transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    async def drained(self) -> None:
        """Wait until the connection takes writes again (or is gone)."""
        if self.paused:
            cycle = self._cycle()
            if cycle is not None:
                await cycle.flow.drain()


class _HeadersTooLarge(ValidationError):
    """A request's headers past the server's limits (431)."""

    status = 431

    def __init__(self, detail: str) -> None:
        super().__init__(detail, param=None)


def _raw_response(status: int, reason: str, err: Any) -> bytes:
    body = encode(error_body(err))
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


_OVER_CAPACITY = _raw_response(
    503,
    "Service Unavailable",
    QueueFullError("too many open connections: try again later"),
)


def _no_cycle() -> None:
    return None


class _Handshaking(asyncio.Protocol):
    """Holds what a TLS connection receives between the end of its handshake and the moment its
    HTTP protocol takes the transport over."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.eof = False
        self.lost: tuple[Exception | None] | None = None

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool:
        self.eof = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = (exc,)


class HeadWithBody:
    """A request's transport, as its response sees it: the response's head (its status line and
    headers, the first write once the response has started) is held and goes out with the
    response's next write (its body, a streamed response's first chunk, its end), in one system
    call instead of two. Anything written before the response starts (``100 Continue``) goes at
    once; closing the transport writes a held head first. Once the head has gone, the request's
    cycle writes to the transport itself again. (It holds the cycle weakly, as ``BodyWriter``
    does.)"""

    __slots__ = ("_cycle", "_head", "_transport")

    def __init__(self, transport: Any, cycle: Any) -> None:
        self._transport = transport
        self._cycle: Any = weakref.ref(cycle)
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        """Hold the response's head; write anything else (after a held head)."""
        head = self._head
        if head is not None:
            self._release()
            self._transport.write(head + data)
        elif (cycle := self._cycle()) is not None and cycle.response_started:
            self._head = data
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Write a held head (a response with no body bytes to write: to ``HEAD``)."""
        head = self._head
        self._release()
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)

    def close(self) -> None:
        """Write a held head, then close."""
        self.flush()
        self._transport.close()

    def _release(self) -> None:
        """The head has gone: the cycle writes to its transport itself from now on."""
        self._head = None
        cycle = self._cycle()
        if cycle is not None and cycle.transport is self:
            cycle.transport = self._transport
        self._cycle = _no_cycle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


#: Seconds a TLS handshake may take when ``header_timeout`` is None (asyncio's default).
_TLS_HANDSHAKE_DEFAULT = 60.0


class _LimitedProtocol(HttpToolsProtocol):
    """One HTTP/1.1 connection, with tokenwire's connection limits (``limits`` is set on the
    subclass ``connection_protocol`` makes, ``tls`` by ``TokenwireServer`` when it serves TLS)."""

    limits: ConnectionLimits = ConnectionLimits()
    #: The server's TLS context: the protocol does the handshake itself (see the module doc).
    tls: ssl.SSLContext | None = None
    #: Whether this connection's accept accepts the others waiting (``accept.Acceptor``): not
    #: for those it accepts.
    drains = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._awaiting_headers = False
        self._refused = False  # answered 503 over capacity: the rest of the request is ignored
        self._admitted = False  # holds one of the max_connections places
        self._header_bytes = 0  # of the request whose headers are arriving
        self._header_count = 0
        # The request being answered: with pipelining, ``self.cycle`` is the newest one queued.
        self._active: Any = None

    def _arm(self, seconds: float | None, callback: Any) -> None:
        self._disarm()
        if seconds is not None:
            self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        acceptor = getattr(self.server_state, "tokenwire_acceptor", None)
        if acceptor is not None and self.drains:
            acceptor.drain()  # (the others waiting behind the one libuv just accepted)
        if self.tls is not None and transport.get_extra_info("sslcontext") is None:
            self._start_tls(transport)
            return
        super().connection_made(transport)
        cap = self.limits.hard_cap
        if cap is not None and len(self.connections) > cap:
            transport.abort()
            return
        self._admit()
        self._arm(self.limits.idle_timeout, self._idle_expired)

    def _start_tls(self, transport: asyncio.Transport) -> None:
        """A TLS connection just accepted: counted at once (closed past the hard cap), its
        handshake bounded by ``header_timeout``; served once it is done."""
        state = self.server_state
        handshaking = getattr(state, "tokenwire_handshaking", 0)
        cap = self.limits.hard_cap
        if cap is not None and len(state.connections) + handshaking >= cap:
            transport.abort()
            return
        state.tokenwire_handshaking = handshaking + 1  # type: ignore[attr-defined]
        shim = _Handshaking()
        assert self.tls is not None
        timeout = self.limits.header_timeout or _TLS_HANDSHAKE_DEFAULT
        handshake = self.loop.start_tls(
            transport, shim, self.tls, server_side=True, ssl_handshake_timeout=timeout
        )
        # Its first step now, before this returns: the transport's protocol must be the TLS
        # layer by the time the event loop starts reading it (uvloop starts reading once
        # connection_made returns), so the client's hello goes to it.
        self._step_tls(handshake, transport, shim)

    def _step_tls(self, handshake: Any, transport: asyncio.Transport, shim: _Handshaking) -> None:
        """Drive ``loop.start_tls`` as a task would (a plain callback chain on its futures)."""

        def failed(exc: BaseException) -> None:
            self._tls_over(transport)
            if not isinstance(exc, (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError)):
                raise exc
            log.debug("a TLS handshake failed or timed out: %s", exc)

        drive(handshake, lambda tls: self._tls_done(tls, shim), failed)

    def _tls_over(self, transport: asyncio.Transport) -> None:
        self.server_state.tokenwire_handshaking -= 1  # type: ignore[attr-defined]
        transport.abort()

    def _tls_done(self, tls: asyncio.Transport | None, shim: _Handshaking) -> None:
        """The handshake is done: HTTP takes the TLS transport over, with what came meanwhile."""
        self.server_state.tokenwire_handshaking -= 1  # type: ignore[attr-defined]
        if tls is None or shim.lost is not None:
            return
        tls.set_protocol(self)
        self.connection_made(tls)
        for data in shim.data:
            if tls.is_closing():
                break
            self.data_received(data)
        if shim.eof and not tls.is_closing():
            self.eof_received()

    def _admit(self) -> bool:
        """Give this connection a place if one is free (it keeps it until it closes)."""
        cap = self.limits.max_connections
        if self._admitted or cap is None:
            return True
        state = self.server_state
        held = getattr(state, "tokenwire_admitted", 0)
        if held >= cap:
            return False
        state.tokenwire_admitted = held + 1  # type: ignore[attr-defined]
        self._admitted = True
        return True

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._active = cycle
        super()._start_asgi_task(cycle, app)

    def _end_requests(self) -> None:
        """Tell the requests in flight that their client is gone. (uvicorn's connection_lost
        tells only the newest, which with pipelining is one still queued: the one being
        answered never heard of it, its engine request left running for nobody.)"""
        for cycle in (self._active, self.cycle):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
                for gone in getattr(cycle, GONE_ATTR, None) or ():
                    if not gone.done():
                        gone.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._end_requests()
        if self._admitted:
            self._admitted = False
            self.server_state.tokenwire_admitted -= 1  # type: ignore[attr-defined]
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._awaiting_headers and (self.cycle is None or self.cycle.response_complete):
            # The first byte of a request: its headers have header_timeout to arrive.
            self._awaiting_headers = True
            self._header_bytes = self._header_count = 0
            self._arm(self.limits.header_timeout, self._headers_expired)
        if self._awaiting_headers:
            # (Bytes past the headers in this read count too: at most one read's worth more.)
            self._header_bytes += len(data)
            most = self.limits.max_header_bytes
            if most is not None and self._header_bytes > most:
                self._too_large(f"the request line and headers are over {most} bytes")
                return
        super().data_received(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._header_count += 1
        most = self.limits.max_header_count
        if most is not None and self._header_count > most:
            self._too_large(f"the request has more than {most} header fields")
            return
        super().on_header(name, value)

    def _too_large(self, why: str) -> None:
        """Answer 431 and close: the rest of the request is not read."""
        self._refused = True
        self._awaiting_headers = False
        self._disarm()
        log.info("a request's headers are too large (%s): closing", why)
        err = _HeadersTooLarge(why + " (--h11-max-header-count, --h11-max-incomplete-event-size)")
        self.transport.write(_raw_response(431, "Request Header Fields Too Large", err))
        self.transport.close()

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._awaiting_headers = False
        self._disarm()
        if not self._admit():
            path = self.url.split(b"?", 1)[0]
            if path not in _ALWAYS:
                self._refused = True
                self.transport.write(_OVER_CAPACITY)
                self.transport.close()
                return
        super().on_headers_complete()
        cycle = self.cycle  # the request just parsed (its task has not started yet)
        if cycle is not None and cycle.scope is self.scope:
            self.scope.setdefault("extensions", {})[BODY_WRITER] = BodyWriter(cycle)
            cycle.transport = HeadWithBody(cycle.transport, cycle)
            setattr(cycle, GONE_ATTR, [])  # (see ``http.disconnected``)

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        cycle = self._active  # (the response just completed: a pipelined next one starts below)
        if cycle is not None and type(cycle.transport) is HeadWithBody:
            cycle.transport.flush()  # (a response to HEAD writes no body)
        super().on_response_complete()  # arms uvicorn's keep-alive (idle) timeout

    def send_400_response(self, msg: str) -> None:
        """A request that is not valid HTTP: a 400 in OpenAI's shape, and the connection closes.
        When the bad bytes follow a complete request whose response is still due, no answer
        can go in order: the connection just closes (which ends that request everywhere)."""
        cycle = self.cycle
        if self.pipeline or (
            cycle is not None
            and not cycle.response_complete
            and (cycle.response_started or not cycle.more_body)
        ):
            # At once: a write between the close and connection_lost would fail.
            self._end_requests()
            self.transport.close()
            return
        err = ValidationError("the request is not valid HTTP/1.1", param=None)
        self.transport.write(_raw_response(400, "Bad Request", err))
        self.transport.close()

    def _idle_expired(self) -> None:
        self._timer = None
        if not self.transport.is_closing() and self.cycle is None:
            self.transport.close()

    def _headers_expired(self) -> None:
        self._timer = None
        if self._awaiting_headers and not self.transport.is_closing():
            log.info("a client did not send its request headers in time: closing")
            self.transport.write(
                _raw_response(
                    408,
                    "Request Timeout",
                    RequestTimeoutError("the request headers did not arrive in time"),
                )
            )
            self.transport.close()


def connection_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """The uvicorn HTTP protocol class that enforces ``limits``."""
    return type("TokenwireHTTPProtocol", (_LimitedProtocol,), {"limits": limits})


def raise_open_files_limit(wanted: int) -> int:
    """Raise the soft limit on open files towards ``wanted`` (at most the hard limit); returns
    the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


class TokenwireServer(uvicorn.Server):
    """uvicorn's server with a graceful shutdown: requests in flight get ``shutdown_timeout``
    seconds to finish, then end with an error the client can read."""

    def __init__(self, config: uvicorn.Config, app: Any, shutdown_timeout: float = 30.0) -> None:
        super().__init__(config)
        self.app = app
        self.shutdown_timeout = shutdown_timeout

    async def startup(self, sockets: list | None = None) -> None:
        """uvicorn's, except that tokenwire's connection protocol does TLS itself (see the
        module docstring)."""
        config = self.config
        protocol = config.http_protocol_class
        tls = config.ssl
        if (
            tls is not None
            and isinstance(protocol, type)
            and issubclass(protocol, _LimitedProtocol)
        ):
            protocol.tls = tls
            config.ssl = None  # (the listeners accept plain TCP; the protocol wraps it)
            try:
                await super().startup(sockets)
            finally:
                config.ssl = tls
        else:
            await super().startup(sockets)
        self._install_acceptor()

    def _install_acceptor(self) -> None:
        """Under uvloop, every connection waiting is accepted with the one libuv accepts
        (``accept``'s module doc)."""
        loop = asyncio.get_running_loop()
        config = self.config
        protocol = config.http_protocol_class
        servers = getattr(self, "servers", None)
        if not (
            servers
            and wants_acceptor(loop)
            and isinstance(protocol, type)
            and issubclass(protocol, _LimitedProtocol)
        ):
            return
        state = self.server_state
        app_state = self.lifespan.state

        def accepted() -> asyncio.Protocol:
            proto = protocol(config=config, server_state=state, app_state=app_state, _loop=loop)
            proto.drains = False
            return proto

        state.tokenwire_acceptor = Acceptor.of_servers(loop, accepted, servers)  # type: ignore[attr-defined]

    def _close_acceptor(self) -> None:
        acceptor = getattr(self.server_state, "tokenwire_acceptor", None)
        if acceptor is not None:
            self.server_state.tokenwire_acceptor = None  # type: ignore[attr-defined]
            acceptor.close()

    async def shutdown(self, sockets: list | None = None) -> None:
        self._close_acceptor()
        for server in self.servers:  # stop accepting
            server.close()
        for sock in sockets or []:
            sock.close()
        if self.config.fd is not None:
            # A listening socket handed over by descriptor (--api-server-count): uvicorn listens
            # on a duplicate and leaves this one open, which would keep the socket listening,
            # new connections waiting in its backlog for the whole drain.
            with contextlib.suppress(OSError):
                os.close(self.config.fd)
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle keep-alive connections go now, busy ones after
        runtime = self.app.runtime
        await runtime.drain(0 if self.force_exit else self.shutdown_timeout)
        # Let the handlers write the errors they were just given.
        deadline = asyncio.get_running_loop().time() + 2.0
        while self.server_state.tasks and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        await super().shutdown(sockets)


def uvicorn_config(app: Any, limits: ConnectionLimits, **kwargs: Any) -> uvicorn.Config:
    """A uvicorn config for ``app`` with tokenwire's connection protocol and timeouts (the
    open-files limit raised to fit ``limits.hard_cap`` connections and what else is open)."""
    if limits.hard_cap is not None:
        raise_open_files_limit(limits.hard_cap + 1024)
    kwargs.setdefault("timeout_graceful_shutdown", 3)
    # No WebSocket routes: an upgrade request is served as plain HTTP. (uvicorn's WebSocket
    # protocol would take the connection over, out of the connection limits, keeping its place
    # forever, and answer 500 since the app never accepts it.)
    kwargs.setdefault("ws", "none")
    if limits.idle_timeout is not None:
        kwargs.setdefault("timeout_keep_alive", limits.idle_timeout)
    return uvicorn.Config(app, http=connection_protocol(limits), **kwargs)
