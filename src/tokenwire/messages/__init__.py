"""The message layer: what a request carries in (sampling parameters, stop regexes) and what flows
back out (finish reasons, errors, batch frames, per-request sinks)."""

from tokenwire.messages.errors import (
    ClientDisconnected,
    CodecError,
    DecodeError,
    InternalError,
    OverloadedError,
    QueueFullError,
    TokenizeError,
    TokenwireError,
    ValidationError,
)

__all__ = [
    "ClientDisconnected",
    "CodecError",
    "DecodeError",
    "InternalError",
    "OverloadedError",
    "QueueFullError",
    "TokenizeError",
    "TokenwireError",
    "ValidationError",
]
