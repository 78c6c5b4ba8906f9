"""Errors as clients see them: OpenAI's error shape (``{"error": {"message", "type", "param",
"code"}}``), an API's way of writing errors (``ErrorDialect``: OpenAI's unless the API has its
own), and the routing errors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from tokenwire.messages.errors import TokenwireError

__all__ = ["MAX_ERROR_MESSAGE", "OPENAI_ERRORS", "ErrorDialect", "NotFound", "error_body"]


#: Longest error message sent to a client (the messages quote client input only briefly anyway).
MAX_ERROR_MESSAGE = 1024


def error_body(err: TokenwireError) -> dict[str, Any]:
    """OpenAI's error shape. A client's error (4xx) reads as its bare detail, its kind in
    ``type``; a server error keeps its kind in the message too (where it failed)."""
    message = err.detail if err.status < 500 else str(err)
    if len(message) > MAX_ERROR_MESSAGE:  # never echo a client's input at length
        message = message[: MAX_ERROR_MESSAGE - 3] + "..."
    return {
        "error": {
            "message": message,
            "type": err.error_type,
            "param": err.param,
            "code": err.code if err.code is not None else err.status,
        }
    }


@dataclass(frozen=True)
class ErrorDialect:
    """How one API writes an error: the JSON body of an error response (its status is the
    error's), and the bytes that end a server-sent-event stream failing mid-way."""

    body: Callable[[TokenwireError], dict[str, Any]]
    stream_end: Callable[[TokenwireError], bytes]
    #: What a silent stream is sent to keep proxies from closing it (``--sse-keep-alive-interval``):
    #: an SSE comment, which every SSE client ignores.
    keep_alive: bytes = b": keep-alive\n\n"


def _openai_stream_end(err: TokenwireError) -> bytes:
    return b"data: " + msgspec.json.encode(error_body(err)) + b"\n\ndata: [DONE]\n\n"


#: OpenAI's: the error object, and in a stream an event carrying it, then ``[DONE]``.
OPENAI_ERRORS = ErrorDialect(error_body, _openai_stream_end)


class NotFound(TokenwireError):
    """No such route (404), or not with this method (405)."""

    error_type = "not_found_error"
    prefix = "not found"

    def __init__(self, detail: str, status: int) -> None:
        super().__init__(detail)
        self.status = status  # type: ignore[misc]
