"""vLLM's prefix-cache block hashes, computed as its engine computes them.

A vLLM engine caches a prompt's KV in blocks of ``block_size`` tokens; each full block is keyed by
a hash chained over the prompt so far: ``hash((parent, tuple(block token ids), extra keys))``,
``parent`` being the previous block's hash (``NONE_HASH`` for the first block), the extra keys the
request's LoRA adapter (``("lora", name, path)``, every block) and ``cache_salt``
(``("cache_salt", salt)``, the first block only), or None. The hash function is the engine's
``--prefix-caching-hash-algo`` (``sha256``, the default: SHA-256 of the pickled tuple;
``sha256_cbor``: of its canonical CBOR), and ``NONE_HASH`` is that function of a seed
(``PYTHONHASHSEED`` when set, else ``"vllm-none-hash"``). KV-cache events name a block by the low
64 bits of its hash (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default): ``external``.

(vLLM 0.32's ``vllm/v1/core/kv_cache_utils.py``: ``hash_block_tokens``,
``generate_block_hash_extra_keys``, ``init_none_hash``; checked against a real engine's events
in the tests.) Multimodal features and prompt embeddings also enter vLLM's extra keys; text
prompts have neither.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "HASH_ALGOS",
    "BlockHasher",
    "external",
    "hash_function",
]

#: vLLM's seed of the first block's parent when ``PYTHONHASHSEED`` is not set.
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
#: vLLM's ``--prefix-caching-hash-algo`` values reproduced here (the xxhash ones need the
#: ``xxhash`` package and, to be reproducible across processes, ``PYTHONHASHSEED``).
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
_MASK64 = (1 << 64) - 1
#: Blocks whose hashes are remembered (about 300 bytes each).
_MEMO_SIZE = 1 << 15
#: The pickle protocol vLLM hashes with (``pickle.HIGHEST_PROTOCOL`` of the Python versions it
#: runs on).
_PICKLE_PROTOCOL = 5


def _pickled(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)


def _cbor(obj: Any) -> bytes:
    try:
        import cbor2
    except ImportError:  # pragma: no cover - depends on the environment
        raise ValueError(
            "--prefix-caching-hash-algo sha256_cbor/xxhash_cbor needs the cbor2 package"
        ) from None
    return cbor2.dumps(obj, canonical=True)


def _xxh128(data: bytes) -> bytes:
    try:
        import xxhash
    except ImportError:  # pragma: no cover - depends on the environment
        raise ValueError("--prefix-caching-hash-algo xxhash needs the xxhash package") from None
    return xxhash.xxh3_128_digest(data)


def hash_function(algo: str) -> Callable[[Any], bytes]:
    """vLLM's hash function of that name (``ValueError`` for one it does not have)."""
    if algo == "sha256":
        return lambda obj: hashlib.sha256(_pickled(obj)).digest()
    if algo == "sha256_cbor":
        return lambda obj: hashlib.sha256(_cbor(obj)).digest()
    if algo == "xxhash":
        return lambda obj: _xxh128(_pickled(obj))
    if algo == "xxhash_cbor":
        return lambda obj: _xxh128(_cbor(obj))
    raise ValueError(f"unknown prefix caching hash algorithm {algo!r} (one of {HASH_ALGOS})")


def external(block_hash: bytes) -> int:
    """A block hash as vLLM's KV-cache events name it: its low 64 bits."""
    return int.from_bytes(block_hash, "big") & _MASK64


class BlockHasher:
    """Block hashes of prompts for engines that cache blocks of ``block_size`` tokens and hash
    them with ``algo`` (``seed``: the engine's ``PYTHONHASHSEED``; None: this process's, as a
    child spawned from it inherits it)."""

    def __init__(self, block_size: int, algo: str = "sha256", seed: str | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.block_size = block_size
        self.algo = algo
        self._hash = hash_function(algo)
        if seed is None:
            seed = os.environ.get("PYTHONHASHSEED")
        if seed is None and algo.startswith("xxhash"):
            raise ValueError(
                "an engine hashing with xxhash seeds its hashes at random unless PYTHONHASHSEED "
                "is set: its blocks cannot be named from outside it"
            )
        self.none_hash = self._hash(seed if seed is not None else DEFAULT_NONE_HASH_SEED)
        #: (parent, block tokens, extra keys) -> hash, for the blocks of recent prompts: shared
        #: prefixes (system prompts) are hashed once, not per request.
        self._memo: dict[tuple[Any, ...], bytes] = {}

    def extra_keys(
        self, index: int, lora: tuple[str, str] | None, cache_salt: str | None
    ) -> tuple[Any, ...] | None:
        """The extra keys of block ``index`` (0-based) of a request."""
        keys: list[Any] = []
        if lora is not None:
            keys.append(("lora", lora[0], lora[1]))
        if index == 0 and cache_salt:
            keys.append(("cache_salt", cache_salt))
        return tuple(keys) if keys else None

    def block(
        self, parent: bytes | None, tokens: Sequence[int], extra: tuple[Any, ...] | None
    ) -> bytes:
        """One block's hash (``parent`` None: the first block)."""
        return self._hash((parent or self.none_hash, tuple(tokens), extra))

    def hashes(
        self,
        token_ids: Sequence[int],
        *,
        lora: tuple[str, str] | None = None,
        cache_salt: str | None = None,
        limit: int | None = None,
    ) -> list[bytes]:
        """The hashes of every full block of ``token_ids`` (at most ``limit`` blocks), in order.
        ``lora`` is the adapter's ``(name, path)`` as the engine was given them."""
        size = self.block_size
        count = len(token_ids) // size
        if limit is not None:
            count = min(count, limit)
        out: list[bytes] = []
        parent = self.none_hash
        hash_fn = self._hash
        memo = self._memo
        lora_key = None if lora is None else ("lora", lora[0], lora[1])
        for i in range(count):
            if lora_key is None and not (i == 0 and cache_salt):
                extra = None
            else:
                extra = self.extra_keys(i, lora, cache_salt)
            key = (parent, tuple(token_ids[i * size : (i + 1) * size]), extra)
            h = memo.get(key)
            if h is None:
                h = hash_fn(key)
                if len(memo) >= _MEMO_SIZE:
                    memo.clear()
                memo[key] = h
            parent = h
            out.append(h)
        return out

    def external_hashes(
        self,
        token_ids: Sequence[int],
        *,
        lora: tuple[str, str] | None = None,
        cache_salt: str | None = None,
        limit: int | None = None,
    ) -> list[int]:
        """``hashes`` as KV-cache events name them (``external``)."""
        return [
            external(h)
            for h in self.hashes(token_ids, lora=lora, cache_salt=cache_salt, limit=limit)
        ]
