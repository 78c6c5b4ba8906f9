"""Error kinds. Every error tokenwire reports is a value of this family and carries the HTTP status
the server answers with; ``str()`` of an error reads ``"<kind prefix>: <detail>"``."""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ClientDisconnected",
    "CodecError",
    "DecodeError",
    "InternalError",
    "ModelNotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "QueueFullError",
    "QueueTimeoutError",
    "RateLimitError",
    "RequestTimeoutError",
    "TokenizeError",
    "TokenwireError",
    "UnauthorizedError",
    "UnsupportedMediaTypeError",
    "ValidationError",
    "quote",
]

#: Most characters of client input an error message quotes.
QUOTE_LIMIT = 80


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters: error messages never echo a client's input
    at length."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class TokenwireError(Exception):
    """Base of every tokenwire error: ``status`` is the HTTP status, ``detail`` the bare message.

    ``param`` optionally names the request field the error is about (as the client spelled it)."""

    status: ClassVar[int] = 500
    prefix: ClassVar[str] = "error"
    error_type: ClassVar[str] = "internal_error"
    #: OpenAI's error ``code`` when it has a word for the error (``model_not_found``); None: the
    #: HTTP status is the code.
    code: ClassVar[str | None] = None
    #: Response headers the error's answer carries (``Retry-After``, ``x-ratelimit-*``).
    headers: tuple[tuple[bytes, bytes], ...] = ()

    def __init__(self, detail: str, *, param: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.param = param

    def __str__(self) -> str:
        return f"{self.prefix}: {self.detail}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.detail!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.detail == self.detail  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.detail))


class ValidationError(TokenwireError):
    """The request is invalid (400)."""

    status = 400
    prefix = "validation failed"
    error_type = "invalid_request_error"


class ModelNotFoundError(TokenwireError):
    """The request names a model this server does not serve (404, OpenAI's ``model_not_found``)."""

    status = 404
    prefix = "model not found"
    error_type = "invalid_request_error"
    code = "model_not_found"


class TokenizeError(TokenwireError):
    """The prompt could not be tokenized (500)."""

    status = 500
    prefix = "tokenize failed"
    error_type = "internal_error"


class DecodeError(TokenwireError):
    """A generated token id could not be turned into text (500)."""

    status = 500
    prefix = "detokenize failed"
    error_type = "internal_error"


class CodecError(TokenwireError):
    """A message between frontend and engine could not be encoded or decoded (500)."""

    status = 500
    prefix = "codec error"
    error_type = "internal_error"


class InternalError(TokenwireError):
    """Anything else that is the server's fault (500)."""

    status = 500
    prefix = "internal error"
    error_type = "internal_error"


class QueueFullError(TokenwireError):
    """The engine cannot take the request now, or is gone (503)."""

    status = 503
    prefix = "service unavailable"
    error_type = "service_unavailable"


class QueueTimeoutError(QueueFullError):
    """The request waited for a place longer than the server lets it (503, with
    ``Retry-After``)."""

    prefix = "queue timeout"

    def __init__(self, detail: str, *, retry_after: float) -> None:
        super().__init__(detail)
        self.headers = ((b"retry-after", str(max(1, int(-(-retry_after // 1)))).encode()),)


class OverloadedError(TokenwireError):
    """Too many requests in flight (429)."""

    status = 429
    prefix = "overloaded"
    error_type = "rate_limit_exceeded"


class RateLimitError(TokenwireError):
    """A key past one of its quotas (429, OpenAI's ``rate_limit_exceeded``; ``error_type`` the
    quota: ``requests``, ``tokens``, ``concurrent_requests``), with its ``x-ratelimit-*`` and
    ``retry-after`` headers."""

    status = 429
    prefix = "rate limit reached"
    code = "rate_limit_exceeded"

    def __init__(
        self, detail: str, *, kind: str, headers: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
        super().__init__(detail)
        self.error_type = kind  # type: ignore[misc]
        self.headers = headers


class ClientDisconnected(TokenwireError):
    """The client went away before the response was complete (499)."""

    status = 499
    prefix = "client disconnected"
    error_type = "client_closed_request"


class PayloadTooLargeError(TokenwireError):
    """The request body is over the server's size limit (413)."""

    status = 413
    prefix = "request too large"
    error_type = "invalid_request_error"


class RequestTimeoutError(TokenwireError):
    """The client did not send its request in time (408)."""

    status = 408
    prefix = "request timeout"
    error_type = "invalid_request_error"


class UnauthorizedError(TokenwireError):
    """A missing or wrong API key (401)."""

    status = 401
    prefix = "unauthorized"
    error_type = "invalid_request_error"


class ForbiddenError(TokenwireError):
    """A request the server refuses whoever sends it (403): a web page's cross-site request."""

    status = 403
    prefix = "forbidden"
    error_type = "invalid_request_error"


class UnsupportedMediaTypeError(TokenwireError):
    """A request body of a content type the server does not take (415)."""

    status = 415
    prefix = "unsupported media type"
    error_type = "invalid_request_error"
