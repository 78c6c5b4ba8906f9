"""Stop-regex admission: client patterns checked once at the door, then matched in linear time.

Stop regexes run on every decode step, so a slow one is a denial of service. SGLang matches them
with Python's backtracking ``re`` and guards with heuristics; tokenwire matches with RE2, whose
running time is linear in the text for every pattern. A pattern is parsed with Python's own
regex parser (the syntax clients write) and rewritten into RE2 syntax, with the meaning SGLang's
Rust port gives it: ``\\d``, ``\\w`` and ``\\s`` are the exact Unicode sets Python matches;
``$`` (outside multiline mode) is the end of the text and ``^`` its start, as in RE2 and Rust's
``regex``; ``\\b`` and ``\\B`` are Unicode-aware (the boundary between ``\\w`` and the rest), where
the kind of character on the pattern's side is fixed: at the pattern's start or end, or between two
characters. The empty pattern matches at once. Constructs no linear-time matcher can run
(backreferences, lookaround, atomic groups...) are rejected with a message that names them.

``max_len`` bounds the text a match can span (``1 << 30`` when unbounded), as SGLang's
``get_max_seq_length`` computes it (anchors count 0: ``^abc$`` is 3, the empty pattern 0); the
stop matcher searches only that far back.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import re2

from tokenwire.messages.errors import ValidationError

if sys.version_info >= (3, 11):
    import re._constants as _c
    import re._parser as _p
else:  # pragma: no cover - Python 3.10
    import sre_constants as _c
    import sre_parse as _p

__all__ = [
    "CACHE_SIZE",
    "MAX_STOP_REGEX_LEN",
    "UNBOUNDED",
    "StopRegex",
    "admit_stop_regex",
    "cache_info",
    "clear_cache",
]

#: Longest pattern admitted, in UTF-8 bytes.
MAX_STOP_REGEX_LEN = 256
#: ``max_len`` of a pattern whose matches have no length bound.
UNBOUNDED = 1 << 30
#: Admitted patterns kept in the cache (least recently used evicted first).
CACHE_SIZE = 512
#: RE2's own limit on a counted repetition.
_RE2_MAX_REPEAT = 1000

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a rejected pattern is an answer to the client, not a log line


@dataclass(frozen=True, eq=True)
class StopRegex:
    """An admitted stop pattern: the client's ``pattern``, its RE2 form, and ``max_len``.

    A ``\\b`` or ``\\B`` at the pattern's start or end becomes a character consumed around the
    match (group 1 is the match): ``_inner`` is the form for searches that start past the text's
    start, where the character before ``pos`` is context."""

    pattern: str
    max_len: int
    re2_pattern: str
    _compiled: Any = field(compare=False, repr=False, hash=False)
    _inner: Any = field(default=None, compare=False, repr=False, hash=False)
    _consumes_before: bool = field(default=False, compare=False, repr=False, hash=False)
    #: Whether a match needs the character after it (a boundary at the end that the end of the
    #: text does not satisfy): a match ending where new text begins may be new.
    needs_next: bool = field(default=False, compare=False, repr=False, hash=False)

    def search(self, text: str, pos: int = 0) -> tuple[int, int] | None:
        """``(start, end)`` of the leftmost match in ``text`` at or after ``pos``, or None (the
        text before ``pos`` is context, as for Python's ``search``)."""
        if self._inner is None:
            m = self._compiled.search(text, pos)
            return None if m is None else m.span()
        if pos > 0:
            m = self._inner.search(text, pos - 1 if self._consumes_before else pos)
        else:
            m = self._compiled.search(text, 0)
        return None if m is None else m.span(1)


# ---- Python's character categories, as explicit code-point ranges --------------------------------

_ranges_cache: dict[tuple[str, bool], list[tuple[int, int]]] = {}
_ranges_lock = threading.Lock()
_CATEGORY_RE = {"digit": r"\d+", "space": r"\s+", "word": r"\w+"}


def _category_ranges(name: str, ascii_only: bool) -> list[tuple[int, int]]:
    """Code points Python's ``\\d``, ``\\s``, ``\\w`` (or their negations, ``not_...``) match,
    found by running Python's own ``re`` over every code point once."""
    key = (name, ascii_only)
    with _ranges_lock:
        if key not in _ranges_cache:
            import re

            base = name.removeprefix("not_")
            everything = "".join(map(chr, range(sys.maxunicode + 1)))
            flags = re.ASCII if ascii_only else 0
            ranges = [
                (m.start(), m.end() - 1) for m in re.finditer(_CATEGORY_RE[base], everything, flags)
            ]
            _ranges_cache[(base, ascii_only)] = ranges
            _ranges_cache[("not_" + base, ascii_only)] = _complement(ranges)
        return _ranges_cache[key]


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= sys.maxunicode:
        out.append((nxt, sys.maxunicode))
    return out


_CATEGORIES = {
    _c.CATEGORY_DIGIT: "digit",
    _c.CATEGORY_NOT_DIGIT: "not_digit",
    _c.CATEGORY_SPACE: "space",
    _c.CATEGORY_NOT_SPACE: "not_space",
    _c.CATEGORY_WORD: "word",
    _c.CATEGORY_NOT_WORD: "not_word",
}


# ---- rewriting a Python parse tree into RE2 syntax -----------------------------------------------


#: Parse-tree operators RE2 cannot run, by the name a client knows them by.
_UNSUPPORTED = {
    _c.GROUPREF: "a backreference",
    _c.GROUPREF_EXISTS: "a conditional group (?(...)...)",
}
if hasattr(_c, "ATOMIC_GROUP"):  # Python 3.11+
    _UNSUPPORTED[_c.ATOMIC_GROUP] = "an atomic group (?>...)"
    _UNSUPPORTED[_c.POSSESSIVE_REPEAT] = "a possessive quantifier (*+, ++, ?+)"


class _Reject(Exception):
    """A construct the pattern cannot be admitted with."""


_BOUNDARIES = (_c.AT_BOUNDARY, _c.AT_NON_BOUNDARY)
#: Matches nothing (a boundary that can never hold).
_NEVER = "[^\\x00-\\x{10ffff}]"
_masks: dict[bool, bytearray] = {}


def _word_mask(ascii_only: bool) -> bytearray:
    with _ranges_lock:
        mask = _masks.get(ascii_only)
    if mask is None:
        mask = bytearray(sys.maxunicode + 1)
        for lo, hi in _category_ranges("word", ascii_only):
            mask[lo : hi + 1] = b"\x01" * (hi - lo + 1)
        with _ranges_lock:
            _masks[ascii_only] = mask
    return mask


def _char(cp: int) -> str:
    return f"\\x{{{cp:x}}}"


def _render_ranges(ranges: list[tuple[int, int]]) -> str:
    return "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in ranges)


class _Rewriter:
    def __init__(self, flags: int) -> None:
        self.ascii = bool(flags & _c.SRE_FLAG_ASCII)
        if flags & _c.SRE_FLAG_LOCALE:
            raise _Reject("the LOCALE flag (?L)")

    def category(self, code: Any) -> list[tuple[int, int]]:
        name = _CATEGORIES.get(code)
        if name is None:
            raise _Reject(f"the character category {code}")
        return _category_ranges(name, self.ascii)

    def klass(self, items: list) -> str:
        negate = False
        parts: list[str] = []
        for op, av in items:
            if op is _c.NEGATE:
                negate = True
            elif op is _c.LITERAL:
                parts.append(_char(av))
            elif op is _c.RANGE:
                parts.append(f"{_char(av[0])}-{_char(av[1])}")
            elif op is _c.CATEGORY:
                parts.append(_render_ranges(self.category(av)))
            else:
                raise _Reject(f"{op} inside a character class")
        body = "".join(parts)
        if not body:
            # Python allows no empty class; an empty negated one cannot arise either.
            raise _Reject("an empty character class")
        return f"[{'^' if negate else ''}{body}]"

    def seq(self, sub: Any, multiline: bool) -> str:
        return "".join(self.node(op, av, multiline) for op, av in sub)

    def node(self, op: Any, av: Any, multiline: bool) -> str:
        if op is _c.LITERAL:
            return _char(av)
        if op is _c.NOT_LITERAL:
            return f"[^{_char(av)}]"
        if op is _c.ANY:
            return "."
        if op is _c.IN:
            return self.klass(av)
        if op is _c.BRANCH:
            return "(?:" + "|".join(self.seq(b, multiline) for b in av[1]) + ")"
        if op is _c.SUBPATTERN:
            _group, add, delete, sub = av
            if (add | delete) & (_c.SRE_FLAG_ASCII | _c.SRE_FLAG_LOCALE):
                raise _Reject("a scoped ASCII or LOCALE flag")
            on = self._flag_letters(add)
            off = self._flag_letters(delete)
            inner_ml = (multiline or bool(add & _c.SRE_FLAG_MULTILINE)) and not (
                delete & _c.SRE_FLAG_MULTILINE
            )
            flags = on + (f"-{off}" if off else "")
            return f"(?{flags}:{self.seq(sub, inner_ml)})"
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            lo, hi, sub = av
            if lo > _RE2_MAX_REPEAT or (hi is not _c.MAXREPEAT and hi > _RE2_MAX_REPEAT):
                raise _Reject(f"a repetition count above {_RE2_MAX_REPEAT}")
            if hi is _c.MAXREPEAT:
                q = "*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"
            elif lo == hi:
                q = f"{{{lo}}}"
            elif lo == 0 and hi == 1:
                q = "?"
            else:
                q = f"{{{lo},{hi}}}"
            lazy = "?" if op is _c.MIN_REPEAT else ""
            return f"(?:{self.seq(sub, multiline)}){q}{lazy}"
        if op is _c.AT:
            return self.anchor(av, multiline)
        if op is _c.ASSERT or op is _c.ASSERT_NOT:
            direction = "lookbehind" if av[0] < 0 else "lookahead"
            neg = "negative " if op is _c.ASSERT_NOT else ""
            raise _Reject(f"a {neg}{direction} assertion")
        raise _Reject(_UNSUPPORTED.get(op, f"the construct {op}"))

    def anchor(self, at: Any, multiline: bool) -> str:
        if at is _c.AT_BEGINNING:
            return "(?m:^)" if multiline else "\\A"
        if at is _c.AT_BEGINNING_STRING:
            return "\\A"
        if at is _c.AT_END_STRING:
            return "\\z"
        if at is _c.AT_END:
            # RE2's (and Rust's) meaning: the end of the text (of the line in multiline mode).
            return "(?m:$)" if multiline else "\\z"
        if at in (_c.AT_BOUNDARY, _c.AT_NON_BOUNDARY):
            raise _Reject(
                "the word boundary \\b or \\B next to something that may or may not be a "
                "word character (it is supported at the pattern's start or end, or between "
                "characters whose kind is fixed)"
            )
        raise _Reject(f"the anchor {at}")

    # ---- word boundaries (Unicode-aware, emulated: RE2's \\b is ASCII-only) ---------------------

    def word_mask(self) -> bytearray:
        """One byte per code point: 1 for a word character (``\\w`` under the pattern's flags)."""
        return _word_mask(self.ascii)

    def kind(self, op: Any, av: Any, last: bool) -> str | None:
        """``"w"`` if every character ``(op, av)`` can match first (``last``: last) is a word
        character, ``"n"`` if none is, None if it depends or it may match nothing."""
        if op is _c.LITERAL:
            return "w" if self.word_mask()[av] else "n"
        if op is _c.IN:
            ranges = self.class_ranges(av)
            if ranges is None:
                return None
            mask = self.word_mask()
            words = sum(mask[lo : hi + 1].count(1) for lo, hi in ranges)
            size = sum(hi - lo + 1 for lo, hi in ranges)
            return "w" if words == size else "n" if words == 0 else None
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            lo, _hi, sub = av
            return self.seq_kind(sub, last) if lo >= 1 else None
        if op is _c.SUBPATTERN:
            return self.seq_kind(av[3], last)
        if op is _c.BRANCH:
            kinds = {self.seq_kind(b, last) for b in av[1]}
            return kinds.pop() if len(kinds) == 1 else None
        return None

    def seq_kind(self, sub: Any, last: bool) -> str | None:
        items = list(sub)
        if not items:
            return None
        op, av = items[-1] if last else items[0]
        return self.kind(op, av, last)

    def class_ranges(self, items: list) -> list[tuple[int, int]] | None:
        """The code points a character class matches, as ranges (None: not worked out)."""
        negate = False
        ranges: list[tuple[int, int]] = []
        for op, av in items:
            if op is _c.NEGATE:
                negate = True
            elif op is _c.LITERAL:
                ranges.append((av, av))
            elif op is _c.RANGE:
                ranges.append((av[0], av[1]))
            elif op is _c.CATEGORY:
                ranges.extend(self.category(av))
            else:
                return None
        ranges.sort()
        merged: list[tuple[int, int]] = []
        for lo, hi in ranges:
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        return _complement(merged) if negate else merged

    def top(self, parsed: Any, multiline: bool) -> tuple[str, str, str, bool]:
        """The whole pattern: ``(before, body, after, may_start)``: characters consumed before and
        after the match for a boundary at its start or end (empty: none), its body, and whether
        ``before`` may also match at the start of the text."""
        items = list(parsed)
        before = after = ""
        may_start = False
        if items and items[0][0] is _c.AT and items[0][1] in _BOUNDARIES and len(items) > 1:
            nxt = self.kind(*items[1], False)
            if nxt is None:
                self.anchor(items[0][1], multiline)  # rejects, naming it
            # \b: the character before is of the other kind; \B: of the same one. The start of
            # the text counts as a non-word character.
            word_before = (nxt == "w") != (items[0][1] is _c.AT_BOUNDARY)
            before = self.word_class(word_before)
            may_start = not word_before
            items = items[1:]
        if items and items[-1][0] is _c.AT and items[-1][1] in _BOUNDARIES and len(items) > 1:
            prev = self.kind(*items[-2], True)
            if prev is None:
                self.anchor(items[-1][1], multiline)
            word_after = (prev == "w") != (items[-1][1] is _c.AT_BOUNDARY)
            after = self.word_class(word_after)
            if not word_after:
                after = f"(?:{after}|\\z)"
            items = items[:-1]
        parts = []
        for k, (op, av) in enumerate(items):
            if op is _c.AT and av in _BOUNDARIES:
                parts.append(self.inner_boundary(items, k, av is _c.AT_BOUNDARY, multiline))
            else:
                parts.append(self.node(op, av, multiline))
        return before, "".join(parts), after, may_start

    def inner_boundary(self, items: list, k: int, is_b: bool, multiline: bool) -> str:
        """A boundary between two characters of fixed kinds: always or never true."""
        prev = self.kind(*items[k - 1], True) if k > 0 else None
        nxt = self.kind(*items[k + 1], False) if k + 1 < len(items) else None
        if prev is None or nxt is None:
            self.anchor(_c.AT_BOUNDARY if is_b else _c.AT_NON_BOUNDARY, multiline)
        return "" if (prev != nxt) == is_b else _NEVER

    def word_class(self, word: bool) -> str:
        name = "word" if word else "not_word"
        return f"[{_render_ranges(_category_ranges(name, self.ascii))}]"

    @staticmethod
    def _flag_letters(flags: int) -> str:
        letters = ""
        if flags & _c.SRE_FLAG_IGNORECASE:
            letters += "i"
        if flags & _c.SRE_FLAG_MULTILINE:
            letters += "m"
        if flags & _c.SRE_FLAG_DOTALL:
            letters += "s"
        return letters


def _max_len(sub: Any) -> int:
    """The longest text a match of ``sub`` can span (SGLang's ``get_max_seq_length``)."""
    total = 0
    for op, av in sub:
        if op in (_c.LITERAL, _c.NOT_LITERAL, _c.IN, _c.ANY):
            total += 1
        elif op is _c.SUBPATTERN:
            total += _max_len(av[3])
        elif op is _c.BRANCH:
            total += max(_max_len(b) for b in av[1])
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            _lo, hi, inner = av
            total += UNBOUNDED if hi is _c.MAXREPEAT else hi * _max_len(inner)
        elif op is _c.AT:
            continue
        else:
            total += UNBOUNDED
    return min(total, UNBOUNDED)


def _admit(pattern: str) -> StopRegex:
    if not isinstance(pattern, str):
        raise ValidationError(
            f"stop_regex must be a string, got {type(pattern).__name__}", param="stop_regex"
        )
    size = len(pattern.encode("utf-8"))
    if size > MAX_STOP_REGEX_LEN:
        raise ValidationError(
            f"stop_regex pattern is {size} bytes, longer than the limit of {MAX_STOP_REGEX_LEN}",
            param="stop_regex",
        )
    try:
        parsed = _p.parse(pattern, 0)
    except (_c.error, RecursionError, OverflowError) as exc:
        raise ValidationError(
            f"stop_regex {pattern!r} is not a valid regular expression: {exc}", param="stop_regex"
        ) from None
    flags = parsed.state.flags
    try:
        rewriter = _Rewriter(flags)
        before, body, after, may_start = rewriter.top(parsed, bool(flags & _c.SRE_FLAG_MULTILINE))
        # (VERBOSE needs nothing: the parser already dropped the whitespace and comments.)
        prefix = _Rewriter._flag_letters(flags & ~_c.SRE_FLAG_MULTILINE)
        prefix = f"(?{prefix})" if prefix else ""
        inner = None
        if before or after:
            inner = f"{prefix}{before}({body}){after}"
            start = f"(?:\\A|{before})" if may_start else before
            re2_pattern = f"{prefix}{start}({body}){after}"
        else:
            re2_pattern = prefix + body
    except _Reject as why:
        raise ValidationError(
            f"stop_regex {pattern!r} uses {why}, which is not supported", param="stop_regex"
        ) from None
    except RecursionError:
        raise ValidationError(
            f"stop_regex {pattern!r} is nested too deeply", param="stop_regex"
        ) from None
    try:
        compiled = re2.compile(re2_pattern, _OPTIONS)
        inner_compiled = None if inner is None else re2.compile(inner, _OPTIONS)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValidationError(
            f"stop_regex {pattern!r} cannot be compiled: {detail}", param="stop_regex"
        ) from None
    needs_next = bool(after) and not after.endswith("|\\z)")
    return StopRegex(
        pattern, _max_len(parsed), re2_pattern, compiled, inner_compiled, bool(before), needs_next
    )


# ---- the admission cache -------------------------------------------------------------------------

_cache: OrderedDict[str, StopRegex] = OrderedDict()
_cache_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}


def admit_stop_regex(pattern: str) -> StopRegex:
    """Admit ``pattern`` (``ValidationError`` naming the problem otherwise). Successes are cached
    (least recently used evicted, at most ``CACHE_SIZE``); the work happens outside the lock."""
    if isinstance(pattern, str):
        with _cache_lock:
            hit = _cache.get(pattern)
            if hit is not None:
                _cache.move_to_end(pattern)
                _stats["hits"] += 1
                return hit
            _stats["misses"] += 1
    admitted = _admit(pattern)
    with _cache_lock:
        _cache[pattern] = admitted
        _cache.move_to_end(pattern)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return admitted


def cache_info() -> dict[str, int]:
    """Hits, misses and current size of the admission cache."""
    with _cache_lock:
        return {**_stats, "size": len(_cache)}


def clear_cache() -> None:
    """Empty the admission cache."""
    with _cache_lock:
        _cache.clear()
        _stats["hits"] = _stats["misses"] = 0
