"""Errors in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``, the error
type the HTTP status has in Anthropic's API; a stream failing mid-way ends with an ``error``
event."""

from __future__ import annotations

from typing import Any

import msgspec

from tokenwire.messages.errors import TokenwireError
from tokenwire.server.errors import MAX_ERROR_MESSAGE, ErrorDialect

__all__ = ["ANTHROPIC_ERRORS", "anthropic_error", "error_type"]

#: Anthropic's error type for each HTTP status it answers with.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    return _TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


def anthropic_error(err: TokenwireError) -> dict[str, Any]:
    """Anthropic's error body. A client's error (4xx) reads as its bare detail (which names the
    field); a server error keeps its kind in the message (where it failed)."""
    message = err.detail if err.status < 500 else str(err)
    if len(message) > MAX_ERROR_MESSAGE:
        message = message[: MAX_ERROR_MESSAGE - 3] + "..."
    return {
        "type": "error",
        "error": {"type": error_type(err.status), "message": message},
        "request_id": None,  # (required by Anthropic's reference; null: none to give)
    }


def _stream_end(err: TokenwireError) -> bytes:
    return b"event: error\ndata: " + msgspec.json.encode(anthropic_error(err)) + b"\n\n"


#: Anthropic's: the error body, and in a stream an ``error`` event carrying it.
#: (a silent stream gets Anthropic's ``ping`` event, which its clients expect and skip)
ANTHROPIC_ERRORS = ErrorDialect(
    anthropic_error, _stream_end, b'event: ping\ndata: {"type": "ping"}\n\n'
)
