"""The math on pooled outputs and their encodings, on whole arrays (no per-float Python).

Vectors arrive as numpy views of the engine's buffers (float32 by default). ``base64_vector``
encodes one straight from its buffer when it is already what the client asked for (float32 in
the machine's byte order: vLLM's default), ``float_rows`` turns a batch into JSON numbers in one
call, and the scores (cosine for embeddings, MaxSim for token embeddings) are computed as vLLM
computes them, in float32.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from tokenwire.messages.errors import ValidationError

__all__ = [
    "EMBED_DTYPES",
    "ENDIANNESS",
    "base64_vector",
    "cosine_rows",
    "float_rows",
    "maxsim",
    "pack_bits",
    "to_dtype_bytes",
]

#: The dtypes base64 and binary embeddings may be written in (vLLM's ``embed_dtype``).
EMBED_DTYPES = ("float32", "float16", "bfloat16")
#: Byte orders (vLLM's ``endianness``; ``native``: this machine's).
ENDIANNESS = ("native", "little", "big")
_NATIVE = sys.byteorder


def _bfloat16_bits(arr: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns (uint16), rounded to nearest even as torch rounds
    them (NaN stays NaN)."""
    bits = np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    out = rounded.astype(np.uint16)
    nan = np.isnan(arr)
    if nan.any():
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def to_dtype_bytes(
    arr: np.ndarray, embed_dtype: str = "float32", endianness: str = "native"
) -> Any:
    """A vector's values as ``embed_dtype`` in ``endianness`` byte order: a buffer (the array
    itself when it already is that, no copy)."""
    if embed_dtype == "float32":
        out = np.ascontiguousarray(arr, dtype=np.float32)
    elif embed_dtype == "float16":
        out = np.ascontiguousarray(arr, dtype=np.float16)
    elif embed_dtype == "bfloat16":
        out = _bfloat16_bits(arr)
    else:
        raise ValidationError(
            f"embed_dtype must be one of {', '.join(EMBED_DTYPES)}, got {embed_dtype!r:.40}",
            param="embed_dtype",
        )
    if endianness not in ENDIANNESS:
        raise ValidationError(
            f"endianness must be one of {', '.join(ENDIANNESS)}, got {endianness!r:.40}",
            param="endianness",
        )
    native_order = out.dtype.byteorder in ("=", "|") or (
        out.dtype.byteorder == "<" and _NATIVE == "little"
    )
    if endianness != "native" and endianness != _NATIVE and native_order:
        out = out.byteswap()
    return out.reshape(-1)


def base64_vector(arr: np.ndarray, embed_dtype: str = "float32", endianness: str = "native") -> str:
    """One vector as base64 of its bytes (float32 native by default: what the OpenAI client
    decodes), encoded from the array's own buffer when no conversion is needed."""
    return base64.b64encode(to_dtype_bytes(arr, embed_dtype, endianness)).decode("ascii")


def float_rows(rows: Sequence[np.ndarray]) -> list[Any]:
    """Each vector (or matrix, for token outputs) as JSON numbers: one ``tolist`` over the
    stacked batch when the rows share a shape (float32 values as the doubles vLLM writes)."""
    if not rows:
        return []
    first = rows[0].shape
    if len(rows) > 1 and all(r.shape == first for r in rows):
        return np.stack(rows).tolist()
    return [r.tolist() for r in rows]


def cosine_rows(queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """The cosine similarity of each query row with the document row beside it (``queries``
    of one row is compared with every document), in float32 as vLLM's ``cosine_similarity``
    (its norms clamped at 1e-8)."""
    q = np.asarray(queries, dtype=np.float32)
    d = np.asarray(docs, dtype=np.float32)
    if q.ndim == 1:
        q = q[None, :]
    if d.ndim == 1:
        d = d[None, :]
    eps = np.float32(1e-8)
    qn = np.maximum(np.linalg.norm(q, axis=-1), eps)
    dn = np.maximum(np.linalg.norm(d, axis=-1), eps)
    dots = (q * d).sum(axis=-1)  # (one query row broadcasts over every document)
    return (dots / (qn * dn)).astype(np.float32)


def maxsim(query: np.ndarray, doc: np.ndarray) -> float:
    """ColBERT's MaxSim: for each query token the best dot product with a document token,
    summed (vLLM's ``compute_maxsim_score``, float32)."""
    q = np.asarray(query, dtype=np.float32)
    d = np.asarray(doc, dtype=np.float32)
    return float((q @ d.T).max(axis=-1).sum())


def pack_bits(rows: np.ndarray, *, signed: bool) -> list[list[int]]:
    """Cohere's ``binary`` / ``ubinary`` embeddings: one bit per dimension (1 where the value is
    at least 0), eight to a byte, most significant first; ``signed`` bytes are offset by 128."""
    arr = np.asarray(rows)
    if arr.ndim != 2 or arr.shape[1] % 8:
        raise ValidationError(
            "binary embedding types need a dimension that is a multiple of 8, got "
            f"{arr.shape[-1] if arr.ndim else 0}",
            param="embedding_types",
        )
    packed = np.packbits(arr >= 0, axis=-1)
    if signed:
        return (packed.astype(np.int16) - 128).tolist()
    return packed.tolist()
