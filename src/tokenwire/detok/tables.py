"""Per-token decode tables for context-independent decoders (the fast path).

Most LLM tokenizers decode token by token: a ByteLevel (GPT-2 style) decoder maps every token to
fixed bytes, and a SentencePiece-style chain (``Replace ▁``, ``ByteFallback``, ``Fuse``, optional
``Strip`` of leading spaces) maps every token to fixed text or to one byte of a byte-fallback run.
For those, ``build_decode_table`` precomputes each token's bytes and, where they stand alone, its
text, so that streaming needs no tokenizer call per token. A table is only returned after it
reproduced the tokenizer's own ``decode`` on every token and on random sequences; otherwise the
caller falls back to the generic window algorithm.
"""

from __future__ import annotations

import codecs
import json
import logging
import random
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tokenwire.tokenizer import Tokenizer

__all__ = [
    "BYTE",
    "BYTELEVEL",
    "EMPTY",
    "SENTENCEPIECE",
    "TEXT",
    "UNKNOWN",
    "DecodeTable",
    "build_decode_table",
    "decode_table",
    "build_decode_tables",
]

log = logging.getLogger(__name__)

BYTELEVEL = "bytelevel"
SENTENCEPIECE = "sentencepiece"

# Token classes (``DecodeTable.cls``).
UNKNOWN = 0  #: the tokenizer cannot map the id
EMPTY = 1  #: contributes nothing (a special token while skipping special tokens)
TEXT = 2  #: fixed bytes (ByteLevel: any token; SentencePiece: a text piece)
BYTE = 3  #: one byte of a SentencePiece byte-fallback run (``<0xNN>``)

_utf8_decode = codecs.utf_8_decode
_BYTE_PIECE = re.compile(r"<0x(?:\+[0-9A-Fa-f]|[0-9A-Fa-f]{2})>")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable character map, as ByteLevel uses it."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _bytelevel_translation() -> dict[int, str]:
    """``str.translate`` table turning ByteLevel characters into latin-1 characters of their bytes;
    any other character below 256 becomes U+10FFFF so that the latin-1 encode fails on it."""
    table: dict[int, str] = {}
    inverse = {ch: b for b, ch in _bytes_to_unicode().items()}
    for c in range(0x180):
        b = inverse.get(chr(c))
        table[c] = chr(b) if b is not None else "\U0010ffff"
    return table


class DecodeTable:
    """What each token contributes to decoded text, for one ``skip_special_tokens`` setting.

    ``cls[id]`` is one of ``UNKNOWN``, ``EMPTY``, ``TEXT``, ``BYTE``; ``tok_bytes[id]`` the token's
    bytes (one byte for ``BYTE``); ``tok_str[id]`` the text the token emits on its own in mid-stream
    (no pending partial character, not at the start of text), or None when that depends on its
    neighbours. ``simple`` and ``strs`` are the same as numpy arrays for batch lookups.
    """

    def __init__(
        self,
        kind: str,
        skip_special_tokens: bool,
        cls: np.ndarray,
        tok_bytes: list[bytes],
        *,
        strip_start: int = 0,
    ) -> None:
        self.kind = kind
        self.skip_special_tokens = skip_special_tokens
        self.cls = cls
        self.cls_list: list[int] = cls.tolist()
        self.tok_bytes = tok_bytes
        self.strip_start = strip_start
        tok_str: list[str | None] = []
        for c, b in zip(self.cls_list, tok_bytes):
            if c == EMPTY:
                tok_str.append("")
            elif c == UNKNOWN:
                tok_str.append(None)
            elif c == BYTE:
                tok_str.append(chr(b[0]) if b[0] < 0x80 else None)
            else:
                try:
                    tok_str.append(b.decode("utf-8"))
                except UnicodeDecodeError:
                    tok_str.append(None)
        self.tok_str = tok_str
        self.simple = np.fromiter((s is not None for s in tok_str), dtype=bool, count=len(tok_str))
        self.strs = np.empty(len(tok_str), dtype=object)
        self.strs[:] = [s if s is not None else "" for s in tok_str]
        self.size = len(tok_str)
        #: ``(pending bytes, token id)`` -> the outcome of that irregular step (``DecodeStream``).
        self.feed_memo: dict[tuple[bytes, int], tuple] = {}

    def decode(self, ids: Sequence[int]) -> str:
        """Whole-sequence decode from the table (reference semantics; unknown ids are dropped)."""
        return _strip_leading(self.decode_unstripped(ids), self.strip_start)

    def decode_unstripped(self, ids: Sequence[int]) -> str:
        """``decode`` before the decoder's leading-space strip."""
        cls = self.cls_list
        tb = self.tok_bytes
        n = self.size
        if self.kind == BYTELEVEL:
            data = b"".join(tb[i] for i in ids if 0 <= i < n and cls[i] == TEXT)
            text = data.decode("utf-8", "replace")
        else:
            parts: list[str] = []
            run = bytearray()
            for i in ids:
                if not 0 <= i < n:
                    continue
                c = cls[i]
                if c == BYTE:
                    run += tb[i]
                elif c == TEXT:
                    if run:
                        parts.append(_close_run(run))
                        run.clear()
                    parts.append(tb[i].decode("utf-8"))
            if run:
                parts.append(_close_run(run))
            text = "".join(parts)
        return text


def _close_run(run: bytes | bytearray) -> str:
    """A finished byte-fallback run: its text when valid UTF-8, else one U+FFFD per byte."""
    try:
        return bytes(run).decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(run)


def _strip_leading(text: str, count: int) -> str:
    """Remove up to ``count`` leading spaces (the ``Strip`` decoder's start)."""
    k = 0
    while k < count and k < len(text) and text[k] == " ":
        k += 1
    return text[k:]


def _parse_decoder(spec: dict[str, Any] | None) -> tuple[str, str | None, int] | None:
    """Recognise a context-independent decoder chain: ``(kind, replace_from, strip_start)``."""
    if not spec:
        return None
    steps = spec["decoders"] if spec.get("type") == "Sequence" else [spec]
    types = [s.get("type") for s in steps]
    if types == ["ByteLevel"]:
        return BYTELEVEL, None, 0
    replace_from: str | None = None
    strip_start = 0
    i = 0
    if i < len(steps) and types[i] == "Replace":
        pattern = steps[i].get("pattern") or {}
        if "String" not in pattern or steps[i].get("content") != " ":
            return None
        replace_from = pattern["String"]
        i += 1
    has_fallback = i < len(steps) and types[i] == "ByteFallback"
    i += has_fallback
    if i < len(steps) and types[i] == "Fuse":
        i += 1
    else:
        return None
    if i < len(steps) and types[i] == "Strip":
        s = steps[i]
        if s.get("content") != " " or s.get("stop", 0) != 0:
            return None
        strip_start = int(s.get("start", 0))
        i += 1
    if i != len(steps) or (replace_from is None and not has_fallback):
        return None
    return SENTENCEPIECE if has_fallback else "replace", replace_from, strip_start


def _table_for(tok: Tokenizer, skip_special_tokens: bool) -> DecodeTable | None:
    hf = tok.hf
    spec = json.loads(hf.decoder.__getstate__()) if hf.decoder is not None else None
    parsed = _parse_decoder(spec)
    if parsed is None:
        return None
    kind, replace_from, strip_start = parsed
    n = tok.vocab_size
    cls = np.full(n, UNKNOWN, dtype=np.int8)
    tok_bytes: list[bytes] = [b""] * n
    specials = tok.special_ids
    translation = _bytelevel_translation() if kind == BYTELEVEL else None
    for i in range(n):
        piece = tok.id_to_token(i)
        if piece is None:
            continue
        if skip_special_tokens and i in specials:
            cls[i] = EMPTY
            continue
        if translation is not None:
            try:
                tok_bytes[i] = piece.translate(translation).encode("latin-1")
            except UnicodeEncodeError:
                tok_bytes[i] = piece.encode("utf-8")
            cls[i] = TEXT
            continue
        if replace_from:
            piece = piece.replace(replace_from, " ")
        if (
            kind == SENTENCEPIECE
            and len(piece.encode("utf-8")) == 6
            and _BYTE_PIECE.fullmatch(piece)
        ):
            tok_bytes[i] = bytes([int(piece[3:5], 16)])
            cls[i] = BYTE
        else:
            tok_bytes[i] = piece.encode("utf-8")
            cls[i] = TEXT
    if kind == "replace":
        kind = SENTENCEPIECE  # a chain without ByteFallback: same table, no BYTE tokens
    return DecodeTable(kind, skip_special_tokens, cls, tok_bytes, strip_start=strip_start)


_SELF_CHECK_TEXT = (
    "Hello, world!  Tabs\tand\n\nnewlines; 你好，世界。こんにちは 안녕하세요 Привет "
    "👩‍👩‍👧‍👦 🇺🇳 naïve café def f(x):\n    return x**2  # ok\r\n"
)


def _self_check(
    tok: Tokenizer, table: DecodeTable, only: Sequence[int] | None = None
) -> str | None:
    """Compare the table with ``tokenizers``' decode; return a description of the first mismatch.

    Every known token is checked after an anchor token (``only``: just those ids, when the others
    were checked already), then random sequences of all kinds of tokens."""
    hf = tok.hf
    skip = table.skip_special_tokens
    known = [i for i in range(table.size) if table.cls_list[i] != UNKNOWN]
    anchor = next(
        (i for i in tok.encode("a", add_special_tokens=False) if table.cls_list[i] == TEXT), None
    )
    if anchor is None:
        return "no anchor token"
    checked = known if only is None else [i for i in only if table.cls_list[i] != UNKNOWN]
    pairs = [[anchor, i] for i in checked]
    got = hf.decode_batch(pairs, skip_special_tokens=skip)
    for ids, ref in zip(pairs, got):
        if table.decode(ids) != ref:
            return f"token {ids[1]}: table {table.decode(ids)!r} != decode {ref!r}"
    rng = random.Random(0x70C)
    text_ids = tok.encode(_SELF_CHECK_TEXT, add_special_tokens=False)
    specials = sorted(tok.special_ids)
    byte_ids = [i for i in known if table.cls_list[i] == BYTE]
    seqs: list[list[int]] = []
    for _ in range(64):
        seq: list[int] = []
        for _ in range(48):
            r = rng.random()
            if r < 0.5 and text_ids:
                seq.append(rng.choice(text_ids))
            elif r < 0.6 and specials:
                seq.append(rng.choice(specials))
            elif r < 0.75 and byte_ids:
                seq.append(rng.choice(byte_ids))
            else:
                seq.append(rng.choice(known))
        seqs.append(seq)
    seqs.append(text_ids)
    for seq, ref in zip(seqs, hf.decode_batch(seqs, skip_special_tokens=skip)):
        if table.decode(seq) != ref:
            return f"sequence {seq[:8]}...: table and decode differ"
    return None


def build_decode_tables(tok: Tokenizer) -> dict[bool, DecodeTable | None]:
    """Both fast-path tables of ``tok`` (keyed by ``skip_special_tokens``), for the price of about
    one: the table that skips special tokens differs from the other only on them, so it is
    derived from it and its self-check only redoes the special tokens (and random sequences)."""
    kept = _table_for(tok, False)
    if kept is None:
        return {False: None, True: None}
    problem = _self_check(tok, kept)
    if problem is not None:
        log.warning("fast decode table disabled for %s: %s", tok.name, problem)
    cls = kept.cls.copy()
    tok_bytes = list(kept.tok_bytes)
    specials = [i for i in sorted(tok.special_ids) if i < kept.size and cls[i] != UNKNOWN]
    for i in specials:
        cls[i] = EMPTY
        tok_bytes[i] = b""
    skipped = DecodeTable(kept.kind, True, cls, tok_bytes, strip_start=kept.strip_start)
    skip_problem = _self_check(tok, skipped, only=specials if problem is None else None)
    if skip_problem is not None:
        log.warning("fast decode table disabled for %s: %s", tok.name, skip_problem)
    return {
        False: kept if problem is None else None,
        True: skipped if skip_problem is None else None,
    }


def decode_table(tok: Tokenizer, skip_special_tokens: bool = True) -> DecodeTable | None:
    """``tok``'s precomputed per-token decode table, built once per tokenizer, or None when its
    decoder is not context-independent (or the table failed its self-check against ``decode``)."""
    return tok.derived("decode_tables", build_decode_tables)[bool(skip_special_tokens)]


def build_decode_table(tok: Tokenizer, *, skip_special_tokens: bool) -> DecodeTable | None:
    """The fast-path table for ``tok``, or None when its decoder is not context-independent or the
    table does not reproduce ``decode`` exactly."""
    table = _table_for(tok, skip_special_tokens)
    if table is None:
        return None
    problem = _self_check(tok, table)
    if problem is not None:
        log.warning("fast decode table disabled for %s: %s", tok.name, problem)
        return None
    return table


def utf8_feed(pending: bytes, data: bytes) -> tuple[str, bytes]:
    """Decode ``pending + data`` as far as whole characters go: ``(text, still_pending)``.

    Invalid bytes become U+FFFD exactly as a lossy decode of the whole stream would have them."""
    buf = pending + data
    text, used = _utf8_decode(buf, "replace", False)
    return text, buf[used:]
