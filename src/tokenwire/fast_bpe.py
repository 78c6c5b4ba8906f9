r"""Byte-level BPE tokenization with tiktoken, where it gives exactly what the tokenizer gives.

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

The regexes of these tokenizers end in ``\s+(?!\S)|\s+``, a look-ahead that puts tiktoken's
regex engine on its slow backtracking path for the whole text. Where the rest of the regex has no
look-around, the same pieces come from the regex without that look-ahead run over the text cut
just before the last white-space character of each run the look-ahead would have shortened (a
run followed by more than white space), found by one plain regex; that is kept only when it gives
tiktoken's own ids with the look-ahead on a sample made to exercise every kind of run. A text that
would be cut more than once in 32 characters goes through the look-ahead regex itself.
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

#: What ``\s`` matches in tiktoken's regex engine: Unicode's White_Space characters.
_WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
_WHITE_SPACE += "\u2028\u2029\u202f\u205f\u3000"
#: The look-ahead ending (see the module docstring).
_LOOKAHEAD_TAIL = r"|\s+(?!\S)|\s+"
#: Anything in the rest of a regex that makes the text after a match count (look-around, anchors,
#: word boundaries; ``^`` anywhere but at a character class's start): where one may be, the
#: look-ahead stays.
_ASSERTION = re.compile(r"\(\?<?[=!]|\\[bBAzZG]|\$|(?<!\[)\^")


def _runs_before_a_non_space(chars: str) -> re.Pattern[str]:
    """Runs of two or more of ``chars`` followed by a character that is not white space."""
    one = f"[{re.escape(chars)}]"
    return re.compile(f"{one}{one}+(?=[^{re.escape(_WHITE_SPACE)}])")


#: Where the look-ahead ends a white-space run one character short, for the two shapes of regex
#: these tokenizers have. Where an earlier alternative takes a run's line breaks
#: (``\s*[\r\n]+``), it is the run's part after its last line break, when that is two or more
#: characters and a non-space follows; otherwise any run of two or more before a non-space. The
#: cut goes before the run's last character.
_SHORTENED_RUNS = (
    _runs_before_a_non_space(_WHITE_SPACE.replace("\n", "").replace("\r", "")),
    _runs_before_a_non_space(_WHITE_SPACE),
)
#: Runs of spaces alone, all an ASCII text without tabs holds (``_cut_before_shortened_runs``).
_SPACE_RUNS = _runs_before_a_non_space(" ")

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


def _ranks(vocab: dict[str, int]) -> dict[bytes, int] | None:
    """A byte-level vocabulary's tokens as bytes, as tiktoken takes them; None if one is spelled
    with characters byte-level vocabularies do not use."""
    to_byte = {c: b for b, c in _bytes_to_unicode().items()}
    try:
        return {bytes(to_byte[ch] for ch in t): i for t, i in vocab.items()}
    except KeyError:
        return None


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


#: A text with more cuts than one per this many characters goes through the look-ahead regex
#: itself: each cut is one more call into tiktoken (about 0.5 µs), and the look-ahead costs about
#: 0.02 µs a character.
_CHARS_PER_CUT = 32


def _cut_before_shortened_runs(
    plain: Callable[[str], list[int]],
    full: Callable[[str], list[int]],
    runs: re.Pattern[str],
    chars_per_cut: int = _CHARS_PER_CUT,
) -> Callable[[str], list[int]]:
    """``plain`` over the text cut before the last character of each of ``runs``' matches, or
    ``full`` where that would cut it more than once per ``chars_per_cut`` characters (0: never)."""
    # In an ASCII text without the others (tabs, say), a run is spaces: found by a faster search.
    others = [c for c in "\t\n\x0b\x0c\r" if runs.match(f"{c} x")]
    spaces = _SPACE_RUNS.finditer
    finditer = runs.finditer

    def encode(text: str) -> list[int]:
        if text.isascii() and not any(c in text for c in others):
            if "  " not in text:
                return plain(text)
            cuts = [m.end() - 1 for m in spaces(text)]
        else:
            cuts = [m.end() - 1 for m in finditer(text)]
        if not cuts:
            return plain(text)
        if len(cuts) * chars_per_cut > len(text):
            return full(text)
        ids: list[int] = []
        pos = 0
        for cut in cuts:
            ids += plain(text[pos:cut])
            pos = cut
        ids += plain(text[pos:])
        return ids

    return encode


def _white_space_sample() -> list[str]:
    """Texts with every kind of white-space run (one to three characters of nine kinds, line
    breaks among them) after and before every kind of character, plus the edge cases."""
    kinds = " \t\n\r\xa0\u3000\x0b\x85\u2028"
    runs = [a + b + c for a in kinds for b in ["", *kinds] for c in ["", *kinds] if b or not c]
    after = ["w", ".", "1", "\u0301"]
    before = ["x", "X", "1", ".", "'s", "/", "\u0301", "\u00e9"]
    texts = [pre + pre.join(run + post for run in runs) for pre in after for post in before]
    texts += ["".join(run for run in runs[:40]), *_EDGE_CASES]
    return texts


def _without_lookahead(
    pattern: str, ranks: dict[bytes, int], full: Any
) -> Callable[[str], list[int]] | None:
    """The encode that gives ``full``'s ids through ``pattern`` without its look-ahead ending
    (see the module docstring), or None where the pattern has no such ending, its rest may look
    around, or no way of cutting reproduces ``full`` on the sample."""
    import tiktoken

    if not pattern.endswith(_LOOKAHEAD_TAIL):
        return None
    head = pattern[: -len(_LOOKAHEAD_TAIL)]
    if _ASSERTION.search(head):
        return None
    try:
        plain = tiktoken.Encoding(
            name=f"tokenwire-{len(ranks)}-plain",
            pat_str=head + r"|\s+",
            mergeable_ranks=ranks,
            special_tokens={},
        )
    except Exception:  # pragma: no cover - the rest of a regex tiktoken took with the ending
        return None
    sample = _white_space_sample()
    want = [full.encode_ordinary(text) for text in sample]
    for runs in _SHORTENED_RUNS:
        # Checked with every text cut: the sample's texts are all runs.
        always = _cut_before_shortened_runs(plain.encode_ordinary, full.encode_ordinary, runs, 0)
        if all(always(text) == ids for text, ids in zip(sample, want)):
            return _cut_before_shortened_runs(plain.encode_ordinary, full.encode_ordinary, runs)
    return None


class FastBpe:
    """A tokenizer's ``encode`` through tiktoken (see the module docstring)."""

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        normalize: Callable[[str], str] | None,
        added: dict[str, int],
        prefix: list[int],
        suffix: list[int],
    ) -> None:
        self._encode = encode
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
        ranks = _ranks(model["vocab"])
        if ranks is None:
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
            _without_lookahead(pattern, ranks, encoding) or encoding.encode_ordinary,
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
            rest = self._encode(normalize(piece) if normalize else piece)
            if ids:
                ids += rest
            else:  # (most texts: their ids as tiktoken made them, not copied)
                ids = rest
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
