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
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.messages.regex import StopRegex, admit_stop_regex
from tokenwire.messages.sampling import SamplingParams

__all__ = [
    "ClientDisconnected",
    "CodecError",
    "DecodeError",
    "FinishReason",
    "InternalError",
    "OverloadedError",
    "QueueFullError",
    "SamplingParams",
    "StopRegex",
    "TokenizeError",
    "TokenwireError",
    "ValidationError",
    "admit_stop_regex",
]
