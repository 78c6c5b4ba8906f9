"""Whether a prompt can fit the model's context, found without the cost of tokenizing a text
that cannot: the number of characters past which a text cannot tokenize to fewer tokens than the
context length holds, and tokenization that counts a long text in bounded pieces first (refusing
it as soon as it is certainly past the context) or keeps only its end."""

from __future__ import annotations

import functools
import json
from typing import Any

from tokenwire.messages.errors import ValidationError
from tokenwire.tokenizer import Tokenizer

__all__ = [
    "CUT_SLACK",
    "PIECE_CHARS",
    "encode_truncated",
    "encode_within",
    "max_prompt_chars",
]


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


#: Texts longer than this many characters are tokenized in pieces of this size first, to count
#: their tokens in bounded memory (the tokenizer needs hundreds of bytes per token).
PIECE_CHARS = 1 << 16
#: Tokens a cut between two pieces may add to the count, at most (a token split in two, a word
#: or a run of digits grouped differently near the cut): a text is refused only when its pieces'
#: count is past the context by more than this per cut.
CUT_SLACK = 32


def _pieces(text: str) -> range:
    return range(0, len(text), PIECE_CHARS)


def encode_within(
    tok: Tokenizer, text: str, *, add_special_tokens: bool, where: str, field: str
) -> list[int]:
    """``text``'s token ids; ``ValidationError`` (naming ``field``) when they are more than the
    context length holds. A long text is first counted in pieces, and refused as soon as the count
    is certainly past the context, so a huge prompt costs memory in proportion to a piece, not to
    the whole text; one that may fit is tokenized whole, exactly."""
    limit = tok.max_model_len
    if limit is not None and len(text) > 2 * PIECE_CHARS:
        count = 0
        for cuts, start in enumerate(_pieces(text)):
            count += len(tok.encode(text[start : start + PIECE_CHARS], add_special_tokens=False))
            if count > limit + CUT_SLACK * cuts:
                raise ValidationError(
                    f"This model's maximum context length is {limit} tokens. However, {where} "
                    f"has more than {limit} tokens (at least {count - CUT_SLACK * cuts} in its "
                    f"first {start + PIECE_CHARS} characters).",
                    param=field,
                )
    return tok.encode(text, add_special_tokens=add_special_tokens)


def encode_truncated(
    tok: Tokenizer, text: str, keep: int, *, side: str = "left", add_special_tokens: bool
) -> list[int]:
    """``text``'s token ids truncated to ``keep``: its last ``keep`` (``side`` "left", vLLM's
    default: the left is cut) or its first (``side`` "right"), exactly as truncating
    ``encode(text)``. A long text is counted in pieces from the end it keeps, and tokenized up to
    a cut where the kept tokens do not depend on where the text is cut (cutting one character
    further gives the same), so only that much of the text is tokenized, unless the whole text
    is one such dependency (a single huge word, whose tokens depend on where it starts)."""
    right = side == "right"
    if len(text) > 2 * PIECE_CHARS:
        count = 0
        for start in _pieces(text):
            at = start if right else max(1, len(text) - start - PIECE_CHARS)
            piece = text[at : at + PIECE_CHARS] if right else text[at : len(text) - start]
            count += len(tok.encode(piece, add_special_tokens=False))
            if count < keep + 2 * CUT_SLACK or (right and at + PIECE_CHARS >= len(text)):
                continue
            if right:
                cut = at + PIECE_CHARS
                ids = tok.encode(text[:cut], add_special_tokens=add_special_tokens)[:keep]
                further = tok.encode(text[: cut + 1], add_special_tokens=add_special_tokens)
                if ids == further[:keep]:
                    return ids
            else:
                ids = tok.encode(text[at:], add_special_tokens=add_special_tokens)[-keep:]
                further = tok.encode(text[at - 1 :], add_special_tokens=add_special_tokens)
                if ids == further[-keep:]:
                    return ids
            if at <= 1 and not right:
                break
    ids = tok.encode(text, add_special_tokens=add_special_tokens)
    return ids[:keep] if right else ids[-keep:]
