"""``--health-port``: ``/health`` and ``/metrics`` on a listener of their own, which the data
plane's connection cap and timeouts do not reach (as gateways offer for orchestrators): a flood of
clients holding the main port at its cap cannot fail the liveness probes.

A plain asyncio server speaking just enough HTTP/1.1 for probes and scrapers: one ``GET`` (or
``HEAD``) per connection, answered by the app's own handlers for those routes, then closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import TYPE_CHECKING, Any

from tokenwire.server import utility

if TYPE_CHECKING:
    from tokenwire.server.app import App

__all__ = ["HealthListener"]

log = logging.getLogger("tokenwire.server")

#: Bytes of a probe's request line and headers, and seconds to send them.
_MAX_HEAD = 16 << 10
_HEAD_TIMEOUT = 5.0
_PATHS = {
    b"/health": "/health",
    b"/ping": "/ping",
    b"/metrics": "/metrics",
    b"/live": "/live",
    b"/ready": "/ready",
}
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class HealthListener:
    """Serves ``/health``, ``/ping``, ``/live``, ``/ready`` and ``/metrics`` of ``app`` on
    ``host:port``."""

    def __init__(self, app: App, host: str, port: int) -> None:
        self.app = app
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        """Listen (several API-server processes share the port: ``SO_REUSEPORT``)."""
        self._server = await asyncio.start_server(
            self._serve,
            self.host,
            self.port,
            reuse_port=hasattr(socket, "SO_REUSEPORT"),
            limit=_MAX_HEAD,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _HEAD_TIMEOUT)
            method, _, rest = head.partition(b" ")
            target = rest.partition(b" ")[0].split(b"?", 1)[0]
            status, headers, body = await self._answer(method, target)
            reason = _REASONS.get(status, "")
            lines = [f"HTTP/1.1 {status} {reason}", *headers, f"content-length: {len(body)}"]
            writer.write(("\r\n".join([*lines, "connection: close"]) + "\r\n\r\n").encode())
            if method != b"HEAD":
                writer.write(body)
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # not a probe: just close
        except (ConnectionError, OSError):
            pass
        except Exception:
            log.exception("the health listener failed to answer")
        finally:
            writer.close()

    async def _answer(self, method: bytes, target: bytes) -> tuple[int, list[str], bytes]:
        path = _PATHS.get(target)
        if path is None:
            return 404, ["content-type: application/json"], b'{"error": "not found"}'
        if method not in (b"GET", b"HEAD"):
            return 405, ["content-type: application/json"], b'{"error": "method not allowed"}'
        sent: dict[str, Any] = {}

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
                sent["headers"] = [
                    f"{k.decode('latin-1')}: {v.decode('latin-1')}"
                    for k, v in message.get("headers", ())
                    if k.lower() != b"content-length"
                ]
            else:
                sent["body"] = sent.get("body", b"") + message.get("body", b"")

        handler = self.app._routes.get(("GET", path)) or utility.ROUTES[("GET", path)]
        await handler(self.app, receive, send)
        return sent["status"], sent["headers"], sent.get("body", b"")
