"""Whether a prompt can fit the model's context, known before it is tokenized: the number of
characters past which a text cannot tokenize to fewer tokens than the context length holds."""

from __future__ import annotations

import functools
import json
from typing import Any

from tokenwire.tokenizer import Tokenizer

__all__ = ["max_prompt_chars"]


# Pre-tokenizer and normalizer steps that never drop input characters (so every token covers at
# most its own length of the input), and normalizers that shrink text by at most 4x (Unicode
# composition, at most a few code points into one).
_LOSSLESS_PRE = {"ByteLevel", "Metaspace", "Digits", "Punctuation", "Split"}
_SHRINKING_NORMALIZERS = {"NFC", "NFKC", "NFD", "NFKD", "Lowercase", "Prepend"}


def _steps(node: dict | None, key: str) -> list[dict]:
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [s for child in node.get(key, []) for s in _steps(child, key)]
    return [node]


def _spec(component: Any) -> dict | None:
    return None if component is None else json.loads(component.__getstate__())


@functools.lru_cache(maxsize=16)
def _chars_per_token(tok: Tokenizer) -> int | None:
    """(Scans the vocabulary: a fraction of a second, once; ``Runtime.start`` warms it.)"""
    hf = tok.hf
    pre = _steps(_spec(hf.pre_tokenizer), "pretokenizers")
    if any(
        p.get("type") not in _LOSSLESS_PRE
        or (p.get("type") == "Split" and p.get("behavior") == "Removed")
        for p in pre
    ):
        return None
    norms = _steps(_spec(hf.normalizer), "normalizers")
    if any(n.get("type") not in _SHRINKING_NORMALIZERS for n in norms):
        return None
    longest = max(len(t) for t in hf.get_vocab(with_added_tokens=True))
    return longest * (4 if norms else 1)


def max_prompt_chars(tok: Tokenizer) -> int | None:
    """Characters past which a text cannot tokenize to fewer tokens than the context length
    (None when the context length is unknown, or the tokenizer may drop input characters)."""
    limit = tok.max_model_len
    if not limit:
        return None
    per = _chars_per_token(tok)
    return None if per is None else limit * per
