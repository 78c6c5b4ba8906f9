"""The multimodal content hashes vLLM's engine keys its encoder cache and prefix cache on,
computed as vLLM 0.32's frontend computes them (``vllm.multimodal.hasher``): a digest (blake3 by
default; sha256 or sha512) over a uniquely decodable stream of framed chunks, the request's
``model_id``, the item (its original bytes) and the options that change how it is processed.

Only the values tokenwire hashes are covered: bytes, strings, ints, floats, ``None``, lists,
tuples, dicts and numpy arrays."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["HASH_ALGORITHMS", "ImageBytes", "mm_hash"]

#: ``--mm-hasher-algorithm`` choices (vLLM's ``MMHasherAlgorithm``).
HASH_ALGORITHMS = ("blake3", "sha256", "sha512")

_LEN = 8
_NONE, _SEQ, _MAP, _LEAF = b"\x00", b"\x01", b"\x02", b"\x03"


class ImageBytes:
    """An image as vLLM hashes one it loaded from bytes (its ``MediaWithBytes``): the bytes as
    sent, and the mode conversion applied on load (``io_config``, None when there was none)."""

    __slots__ = ("data", "io_config")

    def __init__(self, data: bytes, io_config: Mapping[str, Any] | None = None) -> None:
        self.data = data
        self.io_config = io_config


def _length(n: int) -> bytes:
    return n.to_bytes(_LEN, "little")


def _framed(chunk: bytes | memoryview) -> Iterator[bytes | memoryview]:
    yield _length(chunk.nbytes if isinstance(chunk, memoryview) else len(chunk))
    yield chunk


def _leaf(obj: Any) -> Iterator[bytes | memoryview]:
    if isinstance(obj, (bytes, memoryview)):
        yield from _framed(obj)
    elif isinstance(obj, str):
        yield from _framed(obj.encode("utf-8"))
    elif isinstance(obj, (bool, int, float)):
        yield from _framed(np.array(obj).tobytes())
    elif isinstance(obj, ImageBytes):
        if obj.io_config:
            yield from _keyed("image", {"io_config": dict(obj.io_config), "data": obj.data})
        else:
            yield from _keyed("image", obj.data)
    elif isinstance(obj, np.ndarray):
        if obj.ndim == 0:
            data: Any = obj.item()
        elif obj.flags.c_contiguous:
            data = obj.view(np.uint8).data
        else:
            data = obj.tobytes()
        yield from _keyed("ndarray", {"dtype": obj.dtype.str, "shape": obj.shape, "data": data})
    else:
        raise TypeError(f"cannot hash a {type(obj).__name__}")


def _value(obj: Any) -> Iterator[bytes | memoryview]:
    if obj is None:
        yield _NONE
    elif isinstance(obj, (list, tuple)):
        yield _SEQ
        yield _length(len(obj))
        for elem in obj:
            yield from _value(elem)
    elif isinstance(obj, dict):
        yield _MAP
        yield _length(len(obj))
        for k, v in obj.items():
            yield from _framed(str(k).encode("utf-8"))
            yield from _value(v)
    else:
        yield _LEAF
        yield from _leaf(obj)


def _keyed(key: str, obj: Any) -> Iterator[bytes | memoryview]:
    yield from _framed(key.encode("utf-8"))
    yield from _value(obj)


def _hasher(algorithm: str) -> Callable[[], Any]:
    if algorithm == "blake3":
        from blake3 import blake3

        return blake3
    if algorithm == "sha256":
        return hashlib.sha256
    if algorithm == "sha512":
        return hashlib.sha512
    raise ValueError(f"unknown hash algorithm {algorithm!r} (one of {', '.join(HASH_ALGORITHMS)})")


def mm_hash(algorithm: str, /, **kwargs: Any) -> str:
    """The hex digest of ``kwargs`` (sorted by name), as vLLM's ``MultiModalHasher.hash_kwargs``
    computes it: for an item, ``model_id=..., image=ImageBytes(...)`` and, when set,
    ``media_io_kwargs`` and ``mm_processor_kwargs``."""
    h = _hasher(algorithm)()
    for key, value in sorted(kwargs.items(), key=lambda kv: kv[0]):
        for chunk in _keyed(key, value):
            h.update(chunk)
    return h.hexdigest()
