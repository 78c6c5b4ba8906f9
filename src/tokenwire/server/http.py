"""The HTTP plumbing every route shares: JSON and server-sent-event encoding, whole JSON
responses (errors in OpenAI's shape among them), request headers, the request being handled, and
reading a JSON body."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

import msgspec

from tokenwire.messages.errors import TokenwireError
from tokenwire.runtime.metrics import Metrics
from tokenwire.server import limits
from tokenwire.server.errors import OPENAI_ERRORS, ErrorDialect
from tokenwire.server.security import request_key

__all__ = [
    "GONE_ATTR",
    "JSON",
    "JSON_CLOSE",
    "SSE",
    "SSE_DONE",
    "current_scope",
    "disconnected",
    "encode",
    "header",
    "read_json",
    "respond",
    "route_of",
    "send_error",
    "sse",
    "wait_disconnect",
]

_json = msgspec.json.Encoder()
log = logging.getLogger("tokenwire.server")


def encode(obj: Any) -> bytes:
    """JSON bytes."""
    return _json.encode(obj)


def sse(obj: Any) -> bytes:
    """One server-sent event."""
    return b"data: " + _json.encode(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"

JSON = [(b"content-type", b"application/json")]
JSON_CLOSE = [*JSON, (b"connection", b"close")]
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def respond(send: Any, status: int, body: bytes, headers: list = JSON) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(
    metrics: Metrics,
    send: Any,
    err: TokenwireError,
    route: str,
    dialect: ErrorDialect = OPENAI_ERRORS,
) -> None:
    """Answer with ``err`` in the API's shape (OpenAI's by default), counted under ``route``
    (and logged: a client's error at INFO, with the field it names, the server's at ERROR)."""
    scope = current_scope.get()
    rid = header(scope, b"x-request-id")
    key = request_key(scope) if scope is not None else None
    log.log(
        logging.ERROR if err.status >= 500 else logging.INFO,
        "%s: %d %s%s%s%s: %s",
        route,
        err.status,
        err.error_type,
        f" (request {rid})" if rid else "",
        f" (key {key.name})" if key is not None else "",
        f" [{err.param}]" if err.param else "",
        err.detail[:300],
    )
    metrics.requests.labels(route, str(err.status)).inc()
    metrics.request_errors.labels(err.error_type).inc()
    # A body refused part-way is not read to its end: the connection goes with it.
    headers = JSON_CLOSE if err.status in (408, 413) else JSON
    if err.headers:
        headers = [*headers, *err.headers]
    await respond(send, err.status, encode(dialect.body(err)), headers)


#: The HTTP request being handled (each ASGI request runs in its own task, so its own context).
current_scope: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "tokenwire_scope", default=None
)


def header(scope: dict | None, name: bytes) -> str | None:
    """A request header's value (the first one), or None."""
    for key, value in (scope or {}).get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def wait_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


#: The attribute under which tokenwire's connection protocol keeps the futures
#: ``disconnected`` gave for a request cycle (a list; ``serving._LimitedProtocol`` resolves them).
GONE_ATTR = "tokenwire_gone"


def disconnected(receive: Any) -> asyncio.Future[None]:
    """A future done when the client goes away. Over tokenwire's connection protocol, once the
    request's body has arrived whole, a plain future its connection resolves (no task per
    request); else a task reading ``receive`` until the disconnect. Cancel it once the response
    is over."""
    cycle = getattr(getattr(receive, "inner", receive), "__self__", None)
    futures = getattr(cycle, GONE_ATTR, None) if cycle is not None else None
    if futures is not None and cycle.more_body is False:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if cycle.disconnected:
            fut.set_result(None)
        else:
            futures.append(fut)
        return fut
    return asyncio.ensure_future(wait_disconnect(receive))


async def read_json(receive: Any) -> Any:
    return await limits.parse_body(receive, lambda body: body)


_ROUTE_NAMES = {
    "/v1/completions": "completion",
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages_count_tokens",
}


def route_of(path: str) -> str:
    """The metrics label of a request path (a response's own routes share one)."""
    if path.startswith("/v1/responses/"):
        return "responses_by_id"
    if path == "/v1/conversations" or path.startswith("/v1/conversations/"):
        return "conversations"
    return _ROUTE_NAMES.get(path) or path.strip("/").replace("/", "_") or "other"
