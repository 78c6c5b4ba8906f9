"""Byte-level BPE tokenization with tiktoken, where it gives exactly what the tokenizer gives.

Hugging Face's ``tokenizers`` spends most of a long prompt's tokenization in its general machinery
(normalized-string alignments, offsets, its regex engine); tiktoken, made for exactly this
model family (byte-level BPE over one pre-tokenizing regex), tokenizes the same text several
times faster. ``FastBpe.build`` makes one from a tokenizer only when its shape allows it (a
byte-level BPE model without dropout, byte fallback or word affixes; one ``Split`` regex then
``ByteLevel``, or ``ByteLevel`` with its own regex; no normalizer, or NFC/NFKC; added tokens that
match as plain text), and only keeps it when it reproduces the tokenizer's own ``encode`` on a
sample of texts in a dozen languages and on edge cases; otherwise the tokenizer's own path is
used. Added tokens are split out of the text first, as the tokenizer splits them (leftmost, then
longest), and the special tokens the tokenizer's post-processor adds are added around the ids.
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tokenizers

__all__ = ["FastBpe"]

log = logging.getLogger(__name__)

#: ``ByteLevel``'s own pre-tokenizing regex (GPT-2's), for ``ByteLevel(use_regex=true)``.
_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _line_by_line(form: str) -> Callable[[str], str]:
    """``unicodedata.normalize(form, ...)``, a line at a time.

    A line feed is a starter that no normalization decomposes, composes or reorders across, so
    normalizing each line gives the same text; and the standard library, once a string holds one
    character that may need composing, normalizes all of it: a prompt of many lines with a few
    combining marks costs a few lines' work, not the whole prompt's. ASCII is left as it is."""
    normalize = unicodedata.normalize

    def by_line(text: str) -> str:
        if text.isascii():
            return text
        if "\n" not in text:
            return normalize(form, text)
        return "\n".join(
            [line if line.isascii() else normalize(form, line) for line in text.split("\n")]
        )

    return by_line


_NORMALIZERS: dict[str, Callable[[str], str] | None] = {
    "NFC": _line_by_line("NFC"),
    "NFKC": _line_by_line("NFKC"),
}
#: Texts the check runs on besides the packaged passages: what tokenizes oddly.
_EDGE_CASES = (
    "",
    " ",
    "  hello   world  ",
    "\n\n\n\t \r\n x \n",
    "1234567890 12 123 1234 3.14159 1e10",
    "I'm here, it's fine, we've, they'll, you'd, I'M, IT'S",
    "don't DON'T 'S 's 'Ss",
    "e\u0301 caf\u00e9 \u212b \ufb01 \u2460 \uff21",  # decomposed, composed, compatibility
    "🙂👍🏽 🇫🇷 \u200d \u00a0 \u3000",
    "x" * 300 + " " + "ab" * 200,
    "def f(x):\n    return x ** 2  # comment\n\n\nclass A:\n\tpass\n",
    "<html><body>&amp; &lt;tag&gt;</body></html>",
    "混合 text 中文 日本語 한국어 العربية हिन्दी русский",
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to the characters byte-level vocabularies spell them with."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += list(range(ord("®"), ord("ÿ") + 1))
    out = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


def _pattern(pre: dict[str, Any] | None) -> str | None:
    """The one pre-tokenizing regex, when the pre-tokenizer is of a shape tiktoken reproduces."""
    if pre is None:
        return None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel":
        return None
    last = steps[-1]
    if last.get("add_prefix_space"):
        return None
    if len(steps) == 1:
        return _GPT2_PATTERN if last.get("use_regex", True) else None
    split = steps[0]
    if (
        len(steps) != 2
        or split.get("type") != "Split"
        or last.get("use_regex", True)
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or "Regex" not in (split.get("pattern") or {})
    ):
        return None
    return split["pattern"]["Regex"]


class FastBpe:
    """A tokenizer's ``encode`` through tiktoken (see the module docstring)."""

    def __init__(
        self,
        encoding: Any,
        normalize: Callable[[str], str] | None,
        added: dict[str, int],
        prefix: list[int],
        suffix: list[int],
    ) -> None:
        self._encode = encoding.encode_ordinary
        self._normalize = normalize
        self._added = added
        # Leftmost, then longest: alternatives longest first.
        names = sorted(added, key=len, reverse=True)
        self._split = re.compile("|".join(map(re.escape, names))) if names else None
        self._prefix = prefix
        self._suffix = suffix

    @classmethod
    def build(cls, hf: tokenizers.Tokenizer, name: str = "") -> FastBpe | None:
        """The fast path for ``hf``, or None when its shape does not allow one or it does not
        reproduce ``hf``'s own encode on the sample (logged)."""
        try:
            import tiktoken
        except ImportError:  # pragma: no cover - a dependency
            return None
        spec = json.loads(hf.to_str())
        model = spec.get("model") or {}
        norm = spec.get("normalizer")
        pattern = _pattern(spec.get("pre_tokenizer"))
        added_specs = spec.get("added_tokens") or []
        if (
            model.get("type") != "BPE"
            or model.get("dropout")
            or model.get("byte_fallback")
            or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix")
            or pattern is None
            or (norm is not None and norm.get("type") not in _NORMALIZERS)
            or any(a.get("lstrip") or a.get("rstrip") or a.get("single_word") for a in added_specs)
            or (norm is not None and any(a.get("normalized") for a in added_specs))
        ):
            return None
        to_byte = {c: b for b, c in _bytes_to_unicode().items()}
        try:
            ranks = {bytes(to_byte[ch] for ch in t): i for t, i in model["vocab"].items()}
        except KeyError:  # a token spelled with characters byte-level vocabularies do not use
            return None
        added = {a["content"]: a["id"] for a in added_specs if a.get("content")}
        try:
            encoding = tiktoken.Encoding(
                name=f"tokenwire-{len(ranks)}",
                pat_str=pattern,
                mergeable_ranks=ranks,
                special_tokens={},
            )
        except Exception as exc:  # a regex tiktoken's engine cannot take, duplicate ranks...
            log.info("no fast tokenization for %s: %s", name, exc)
            return None
        # The ids the post-processor adds around one sequence: found around a known one.
        plain = hf.encode("a", add_special_tokens=False).ids
        full = hf.encode("a", add_special_tokens=True).ids
        at = next(
            (k for k in range(len(full) - len(plain) + 1) if full[k : k + len(plain)] == plain),
            None,
        )
        if at is None:
            return None
        fast = cls(
            encoding,
            _NORMALIZERS[norm["type"]] if norm is not None else None,
            added,
            full[:at],
            full[at + len(plain) :],
        )
        problem = fast._check(hf, added)
        if problem is not None:
            log.warning("fast tokenization disabled for %s: %s", name, problem)
            return None
        return fast

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """``text``'s token ids, as the tokenizer's own ``encode`` gives them."""
        ids: list[int] = []
        normalize = self._normalize
        pos = 0
        if self._split is not None:
            for m in self._split.finditer(text):
                if m.start() > pos:
                    piece = text[pos : m.start()]
                    ids += self._encode(normalize(piece) if normalize else piece)
                ids.append(self._added[m.group()])
                pos = m.end()
        if pos < len(text):
            piece = text[pos:] if pos else text
            ids += self._encode(normalize(piece) if normalize else piece)
        if add_special_tokens and (self._prefix or self._suffix):
            return [*self._prefix, *ids, *self._suffix]
        return ids

    def _check(self, hf: tokenizers.Tokenizer, added: dict[str, int]) -> str | None:
        """The first text of the sample on which this and ``hf`` differ, described, or None."""
        texts = list(_EDGE_CASES)
        replay = resources.files("tokenwire") / "_data" / "replay"
        for item in sorted(replay.iterdir(), key=lambda p: p.name):
            if item.name.endswith(".txt"):
                texts.append(item.read_text(encoding="utf-8")[:20000])
        specials = sorted(added)[:8]
        texts += [f"{s}x {s}{s} y{s}\n{s}" for s in specials]
        if specials:
            texts.append(specials[0].join(texts[:6]))
        for text in texts:
            for special in (False, True):
                want = hf.encode(text, add_special_tokens=special).ids
                if self.encode(text, special) != want:
                    return f"they differ on {text[:40]!r}..."
        return None
