"""The last line of defence around every HTTP handler: an exception that escapes one never reaches
the client as a bare 500 or a cut stream.

Before the response has started the client gets a 500 in its API's JSON shape (OpenAI's unless the
route has its own ``ErrorDialect``) with a generic message (the details go to the log only); a
server-sent-event stream that fails mid-way ends as the API ends a failed stream (OpenAI's: an
error event and ``[DONE]``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tokenwire.messages.errors import InternalError, TokenwireError
from tokenwire.server.errors import OPENAI_ERRORS, ErrorDialect
from tokenwire.server.http import encode

__all__ = ["guarded", "json_response", "GENERIC_ERROR"]

log = logging.getLogger("tokenwire.server")

#: What the client is told when a handler fails in a way nobody planned for.
GENERIC_ERROR = "the server failed to handle this request (the details are in its log)"

Handler = Callable[[dict, Any, Any], Awaitable[None]]


def json_response(status: int, body: bytes, extra: list | None = None) -> list[dict]:
    """The two ASGI messages of a complete JSON response, with ``Content-Length``."""
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(extra or []),
    ]
    return [
        {"type": "http.response.start", "status": status, "headers": headers},
        {"type": "http.response.body", "body": body, "more_body": False},
    ]


def passing(wrapper: Any, send: Any) -> Any:
    """Mark ``wrapper``, an ASGI ``send`` that only looks at a response's start and last body
    message, as one that mid-stream body messages may skip: ``direct(wrapper)`` is then the
    ``send`` under it (and under any such wrappers it wraps)."""
    wrapper.direct = direct(send)
    return wrapper


def direct(send: Any) -> Any:
    """The ``send`` for a streamed response's mid-stream body messages (``more_body`` true):
    ``send`` itself, or what the wrappers marked with ``passing`` wrap."""
    return getattr(send, "direct", send)


async def guarded(
    handler: Handler,
    scope: dict,
    receive: Any,
    send: Any,
    on_error: Callable[[TokenwireError], None] | None = None,
    dialect: ErrorDialect = OPENAI_ERRORS,
) -> None:
    """Run ``handler``; should it raise, answer the client as well as the response so far allows,
    in ``dialect`` (``on_error`` hears of it, for metrics)."""
    started = is_sse = done = False

    async def tracked(message: dict) -> None:
        nonlocal started, is_sse, done
        if message["type"] == "http.response.start":
            started = True
            is_sse = any(
                k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                for k, v in message.get("headers", ())
            )
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            done = True
        await send(message)

    try:
        await handler(scope, receive, passing(tracked, send))
    except Exception:
        log.exception("%s %s failed", scope.get("method"), scope.get("path"))
        if done:
            return
        err = InternalError(GENERIC_ERROR)
        if on_error is not None:
            on_error(err)
        with contextlib.suppress(Exception):
            if not started:
                for message in json_response(err.status, encode(dialect.body(err))):
                    await send(message)
            else:
                tail = dialect.stream_end(err) if is_sse else b""
                await send({"type": "http.response.body", "body": tail, "more_body": False})
