"""tokenwire: the streaming frontend of LLM inference.

Token ids in; exact text, stop handling and OpenAI-compatible responses out."""

# (first: with TOKENWIRE_PURE_PYTHON=1 the compiled modules load from their sources)
import tokenwire._pure  # noqa: F401
from tokenwire.detok import DecodeBatch, DecodeStream
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
from tokenwire.messages.sampling import SamplingParams
from tokenwire.tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "ClientDisconnected",
    "CodecError",
    "DecodeBatch",
    "DecodeError",
    "DecodeStream",
    "FinishReason",
    "InternalError",
    "OverloadedError",
    "QueueFullError",
    "SamplingParams",
    "TokenizeError",
    "Tokenizer",
    "TokenwireError",
    "ValidationError",
    "__version__",
]
