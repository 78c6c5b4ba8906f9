"""Errors as clients see them: OpenAI's error shape (``{"error": {"message", "type", "param",
"code"}}``), and the routing errors."""

from __future__ import annotations

from typing import Any

from tokenwire.messages.errors import TokenwireError

__all__ = ["MAX_ERROR_MESSAGE", "NotFound", "error_body"]


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


class NotFound(TokenwireError):
    """No such route (404), or not with this method (405)."""

    error_type = "not_found_error"
    prefix = "not found"

    def __init__(self, detail: str, status: int) -> None:
        super().__init__(detail)
        self.status = status  # type: ignore[misc]
