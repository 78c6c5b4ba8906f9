"""Choosing tokens inside a grammar: how the synthetic engine writes constrained output.

A ``ConstrainedDecoder`` holds one request's matcher (``tokenwire.engine.grammar``) and picks
each next token among those the grammar allows, so that the output is always a sentence of the
grammar and reads like the engine's other output:

- it follows the engine's own text (the replay passage, the echoed prompt) for as long as the
  grammar allows it from the start: an echoed prompt that already satisfies the constraint comes
  back unchanged;
- bytes the grammar forces (JSON keys, separators) come as llguidance tokenizes them;
- where text is free (a JSON string, a free regex), it writes runs of the engine's text, a few
  words each, then closes the string; numbers are drawn plausibly (counts, years, decimals);
  containers get a few items, optional properties are kept or left out, by the request's seed;
- it ends within ``max_tokens`` for a grammar whose sentences can: from time to time it measures
  the shortest finish from where it is (the deterministic closing policy, run on a copy of the
  matcher); once the budget left comes near it, it takes a free token only if that policy still
  finishes in time after it, and otherwise follows the policy, which closes everything open and
  emits EOS. A budget smaller than any finish ends with ``length``, as a model's would.

Every choice draws from the request's seeded stream, so a seed gives the same output.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    import llguidance

    from tokenwire.engine.grammar import Grammar
    from tokenwire.tokenizer import Tokenizer

__all__ = ["ConstrainedDecoder", "TextSource", "TokenTables", "finish_length"]

#: Source tokens skipped, in free text, looking for one the grammar allows.
_SKIP = 8
#: Tokens of the engine's text per run in a free string: drawn in [_RUN_MIN, _RUN_MAX).
_RUN_MIN, _RUN_MAX = 2, 12
#: The budget left over the shortest finish under which each free token is checked (a
#: rollout after it) before it is taken.
_NEAR = 48
#: Longest finish the closing policy is run for (a pattern it cannot walk costs no more).
ROLLOUT_LIMIT = 512


class TextSource(Protocol):
    """The engine's own output for a request, and its seeded random stream."""

    def peek(self) -> int | None:
        """The next token of the engine's text (None: it has none)."""

    def skip(self) -> None:
        """Move past the next token."""

    def uniform(self) -> float:
        """The next number in [0, 1) of the request's seeded stream."""


@dataclass(frozen=True)
class TokenTables:
    """The served vocabulary's tokens the decoder reaches for, by role."""

    vocab_words: int
    eos: tuple[int, ...]
    #: Closing a string (``"``, ``"}``...), EOS first.
    str_close: tuple[int, ...]
    #: Closing containers (``}``, ``]}``...), EOS first.
    close: tuple[int, ...]
    #: Opening a value or container (``"``, ``{``, ``[{``...).
    open: tuple[int, ...]
    #: Item separators (``,``, ``, "``...).
    sep: tuple[int, ...]
    #: Whole literals (``true``, ``null``, ``0``), and empty ones (``""``, ``[]``, ``{}``).
    lit: tuple[int, ...]
    empty: tuple[int, ...]
    #: Digits and the minus sign.
    num: tuple[int, ...]
    #: The closing policy's order of preference (see ``closing_token``), outside free text
    #: and in it.
    closing_order: tuple[int, ...]
    text_closing_order: tuple[int, ...]
    #: Single-character tokens of ``0-9 . -``, and the space.
    chars: dict[str, int]
    space: int | None
    #: Common words: one the grammar allows means free text.
    probes: tuple[int, ...]
    #: ``decode([id])`` of every id.
    texts: list[str]
    #: Tokens that open a container or a string (the ones after which closing at once is rare).
    openers: frozenset[int]
    #: Tokens that close something (EOS included).
    closers: frozenset[int]
    #: Per id (model vocabulary): whether its text is printable ASCII.
    ascii: np.ndarray
    #: The tokenizer's ``encode`` (no special tokens).
    encode: Callable[[str], list[int]]

    @classmethod
    def build(cls, tokenizer: Tokenizer) -> TokenTables:
        """The tables of ``tokenizer`` (a pass over its vocabulary)."""
        texts = tokenizer.single_token_texts(skip_special_tokens=False)
        special = tokenizer.special_ids
        groups: dict[str, list[int]] = {k: [] for k in ("str_close", "close", "open", "sep")}
        patterns = {
            "str_close": re.compile(r'"[\]}]{0,3}'),
            "close": re.compile(r"[\]}]{1,4}"),
            "open": re.compile(r' ?[\[{]{0,3}"?'),
            "sep": re.compile(r',\s?"?'),
        }
        for i, text in enumerate(texts):
            if not text.strip() or len(text) > 4 or i in special:
                continue
            for name, pat in patterns.items():
                if pat.fullmatch(text):
                    groups[name].append(i)
                    break

        def ids(words: list[str]) -> list[int]:
            out = []
            for w in words:
                got = tokenizer.encode(w, add_special_tokens=False)
                if len(got) == 1:
                    out.append(got[0])
            return out

        eos = tuple(tokenizer.eos_token_ids)
        longest = sorted(groups["close"], key=lambda i: -len(texts[i]))
        str_longest = sorted(groups["str_close"], key=lambda i: -len(texts[i]))
        lit = ids([p + w for w in ("0", "null", "false", "true") for p in ("", " ")])
        empty = ids([p + w for w in ('""', "[]", "{}") for p in ("", " ")])
        opens = sorted(groups["open"], key=lambda i: -len(texts[i]))
        chars = {c: got[0] for c in "0123456789.-" if len(got := ids([c])) == 1}
        return cls(
            vocab_words=(tokenizer.model_vocab_size + 31) // 32,
            eos=eos,
            str_close=(*eos, *groups["str_close"]),
            close=(*eos, *groups["close"]),
            open=tuple(groups["open"]),
            sep=tuple(groups["sep"]),
            lit=tuple(lit),
            empty=tuple(empty),
            num=tuple(chars[c] for c in "0123456789-" if c in chars),
            closing_order=(*eos, *longest, *str_longest, *groups["sep"], *lit, *empty, *opens),
            text_closing_order=(*eos, *str_longest),
            chars=chars,
            space=next(iter(ids([" "])), None),
            probes=tuple(ids(["the", " the", "a", " a"])),
            texts=texts,
            openers=frozenset(i for i in groups["open"] if texts[i][-1:] in '{["'),
            closers=frozenset((*eos, *groups["close"], *groups["str_close"])),
            ascii=np.array(
                [t.isascii() and t.isprintable() and bool(t) for t in texts]
                + [False] * (tokenizer.model_vocab_size - len(texts)),
                dtype=bool,
            ),
            encode=functools.partial(tokenizer.encode, add_special_tokens=False),
        )


def _allowed_ids(m: llguidance.LLMatcher, buf: np.ndarray) -> np.ndarray:
    """Every token the grammar allows next (computes the mask)."""
    m.unsafe_compute_mask_ptr(buf.ctypes.data, buf.nbytes)
    return np.flatnonzero(np.unpackbits(buf.view(np.uint8), bitorder="little"))


class ClosingState:
    """What the closing policy remembers between tokens: the last mask it computed, the tokens
    its fallback took."""

    __slots__ = ("previous", "used")

    def __init__(self) -> None:
        self.previous: np.ndarray | None = None
        self.used: set[int] = set()


def closing_token(
    m: llguidance.LLMatcher, t: TokenTables, buf: np.ndarray, state: ClosingState
) -> int:
    """The closing policy's next token (deterministic): what the grammar forces; else EOS, the
    longest token closing the string being written, or else the containers open, a separator
    toward required fields, the shortest literal, an opener; else a token the last one made
    possible, or one it has not taken yet (``state``), so that a pattern is walked through."""
    ff = m.compute_ff_tokens()
    used = state.used
    if ff:
        used.clear()
        state.previous = None
        return ff[0]
    in_text = any(m.validate_tokens([p]) for p in t.probes)
    for tok in t.text_closing_order if in_text else t.closing_order:
        if m.validate_tokens([tok]):
            if tok in t.closers:  # progress: the structure closes
                used.clear()
                state.previous = None
                return tok
            if tok not in used:  # a literal or separator, once until something closes
                used.add(tok)
                return tok
    m.unsafe_compute_mask_ptr(buf.ctypes.data, buf.nbytes)
    prev = state.previous
    state.previous = buf.copy()
    allowed = np.flatnonzero(np.unpackbits(buf.view(np.uint8), bitorder="little"))
    if not len(allowed):
        return t.eos[0] if t.eos else 0
    # Progress through a pattern: a token just made possible (the "@" of an e-mail address),
    # else one not yet taken; the lowest such id (the ASCII ones come first).
    if prev is not None:
        new = np.flatnonzero(np.unpackbits((buf & ~prev).view(np.uint8), bitorder="little"))
        for cand in new[:64].tolist():
            if cand not in used:
                used.add(cand)
                return cand
    for cand in allowed[:256].tolist():
        if cand not in used:
            used.add(cand)
            return cand
    return int(allowed[0])


def finish_length(
    m: llguidance.LLMatcher, t: TokenTables, limit: int, deadline: float | None = None
) -> int | None:
    """Tokens the closing policy takes to finish from ``m``'s state (EOS included), or None when
    it takes more than ``limit`` (or is not done by ``deadline``, ``time.monotonic()``). ``m``
    is not changed."""
    return rollout(m, t, limit, deadline)[0]


def rollout(
    m: llguidance.LLMatcher, t: TokenTables, limit: int, deadline: float | None = None
) -> tuple[int | None, int]:
    """``finish_length``, and how many tokens the policy walked (``limit`` when it found no
    finish within it; fewer when the deadline came first)."""
    m = m.deep_copy()
    buf = np.zeros(t.vocab_words, dtype=np.int32)
    state = ClosingState()
    eos = t.eos
    for n in range(1, limit + 1):
        if m.is_stopped():
            return n, n
        if deadline is not None and n % 8 == 0 and time.monotonic() > deadline:
            return None, n - 1
        tok = closing_token(m, t, buf, state)
        if tok in eos:
            return n, n
        if not m.consume_token(tok):
            return None, limit
    return None, limit


def prepare_grammar(grammar: Grammar, tables: TokenTables, limit: int = ROLLOUT_LIMIT) -> None:
    """Record the tables a grammar decodes with and its shortest finish from its start (for
    the compiler's worker, by the grammar's deadline): ``finish`` (None: none found), and
    ``searched``, the finishes ruled out (a grammar has none of ``searched`` tokens or fewer
    when ``finish`` is None)."""
    grammar.facts["tables"] = tables
    finish, searched = rollout(grammar.template, tables, limit, grammar.deadline)
    grammar.facts["finish"] = finish
    grammar.facts["searched"] = searched


class ConstrainedDecoder:
    """One request's constrained decoding (see the module docstring)."""

    __slots__ = (
        "_buf",
        "_check_at",
        "_closing",
        "_closing_state",
        "_follow",
        "_forced",
        "_last",
        "_near",
        "_plan",
        "_progress",
        "_run",
        "_want_close",
        "_wait",
        "cpu",
        "cpu_budget",
        "gen",
        "grammar",
        "m",
        "t",
    )

    def __init__(
        self,
        grammar: Grammar,
        tables: TokenTables,
        buf: np.ndarray | None = None,
        cpu_budget: float | None = None,
    ) -> None:
        self.grammar = grammar
        self.m = grammar.matcher()
        self.t = tables
        self._buf = buf if buf is not None else np.zeros(tables.vocab_words, dtype=np.int32)
        self.gen = 0
        #: Seconds of CPU this request's decoding may take (None: no bound); spent so far.
        self.cpu_budget = cpu_budget
        self.cpu = 0.0
        self._wait = 64  # tokens until a finish not found is looked for again (doubling)
        self._forced: list[int] = []  # the rest of a forced run, last first
        self._plan: list[int] = []  # a number being written, last first
        self._run = 0  # tokens of the engine's text still to write in this run
        self._want_close = False
        self._closing = False
        self._closing_state = ClosingState()
        self._progress = ClosingState()
        self._follow = True  # still following the engine's text from the start
        self._check_at = 0
        self._near = False
        self._last = -1

    @property
    def done(self) -> bool:
        """Whether the grammar is complete and only EOS may follow."""
        return self.m.is_stopped()

    @property
    def exhausted(self) -> bool:
        """Whether the CPU budget is spent (from then on the decoder only closes)."""
        return self.cpu_budget is not None and self.cpu > self.cpu_budget

    def next_tokens(self, src: TextSource, limit: float, count: int) -> list[int]:
        """Up to ``count`` next tokens (fewer when the grammar ends), the output having
        ``limit`` tokens at most; the CPU they took is counted against the budget. Once the
        budget is spent the decoder closes what is open, and no further rollouts are run."""
        start = time.thread_time()
        out = []
        eos = self.t.eos
        for _ in range(count):
            if self.gen >= limit:
                break
            if self.exhausted and not self._closing:
                self._closing = True
                self._forced.clear()
            tok = self.next_token(src, limit - self.gen)
            out.append(tok)
            if tok in eos:
                break
        self.cpu += time.thread_time() - start
        return out

    def next_token(self, src: TextSource, budget: float) -> int:
        """The next token, given ``budget`` tokens left (this one included); the matcher takes
        it."""
        tok = self._choose(src, budget)
        self.m.consume_token(tok)
        self._last = tok
        self.gen += 1
        return tok

    # ---- the policy ------------------------------------------------------------------------------

    def _ok(self, tok: int) -> bool:
        return bool(self.m.validate_tokens([tok]))

    def _choose(self, src: TextSource, budget: float) -> int:
        m, t = self.m, self.t
        if m.is_stopped():
            return t.eos[0] if t.eos else 0
        bounded = budget != float("inf")
        if not self._closing and bounded and self.gen >= self._check_at:
            self._check_budget(int(budget))
        tok = None
        if self._follow and not self._closing:
            nxt = src.peek()
            if nxt is not None and self._ok(nxt):
                src.skip()
                tok = nxt
            else:
                self._follow = False
        if tok is None:
            if self._closing:
                return closing_token(m, t, self._buf, self._closing_state)
            if self._forced:
                return self._forced.pop()
            ff = m.compute_ff_tokens()
            if ff:
                self._forced = ff[:0:-1]
                self._want_close = False
                return ff[0]
            tok = self._free(src, budget)
        if self._near and bounded and not self._room_after(tok, int(budget) - 1):
            self._closing = True  # that token would leave no way to finish in time
            return closing_token(m, t, self._buf, self._closing_state)
        return tok

    def _room_after(self, tok: int, left: int) -> bool:
        """Whether the closing policy still finishes within ``left`` tokens after ``tok``."""
        if tok in self.t.eos:
            return True
        after = self.m.deep_copy()
        after.consume_token(tok)
        return finish_length(after, self.t, left) is not None

    def _free(self, src: TextSource, budget: float) -> int:
        """A token where the grammar leaves a choice (see the module docstring)."""
        m, t = self.m, self.t
        pressure = self.gen / (self.gen + budget)
        if self._run > 0:  # a run of the engine's text goes on while the grammar allows it
            nxt = src.peek()
            if nxt is not None and self._ok(nxt):
                src.skip()
                self._run -= 1
                self._want_close = self._run <= 0
                return nxt
        if self._plan:
            tok = self._plan.pop()
            if self._ok(tok):
                if not self._plan:
                    self._want_close = True
                return tok
            self._plan.clear()
            self._want_close = True
        in_text = any(self._ok(p) for p in t.probes)
        if in_text:
            if self._want_close and self._run <= 0:
                closers = [c for c in t.str_close if self._ok(c)]
                if closers:
                    self._want_close = False
                    return closers[int(src.uniform() * len(closers))]
                self._run = 1  # not closable yet (a minimum length, a character half-written)
            tok = self._text(src, pressure)
            if tok is not None:
                return tok
        tok = self._structure(src, in_text, pressure)
        if tok is not None:
            return tok
        if in_text:  # text the engine's cannot be (a pattern, a format): walk through it
            return closing_token(m, t, self._buf, self._progress)
        return self._fallback(src)

    def _check_budget(self, budget: int) -> None:
        """Measure the shortest finish; close from now on when the budget nears it."""
        facts = self.grammar.facts
        if (
            self.gen == 0
            and "finish" in facts
            and (
                facts["finish"] is not None or facts.get("searched", ROLLOUT_LIMIT) >= ROLLOUT_LIMIT
            )
        ):
            finish = facts["finish"]
        else:
            finish = finish_length(self.m, self.t, min(budget, ROLLOUT_LIMIT))
        if finish is None and budget > ROLLOUT_LIMIT:
            # No finish within reach: look again later, less and less often (each look walks
            # ROLLOUT_LIMIT tokens of the grammar).
            self._check_at = self.gen + self._wait
            self._wait *= 2
            return
        slack = -1 if finish is None else budget - finish
        if slack < 0:
            self._closing = True
            self._forced.clear()
        elif slack < _NEAR:
            self._near = True  # from now on each free token is checked before it is taken
            self._check_at = 1 << 62
        else:
            self._check_at = self.gen + max(1, slack // 8)

    def _text(self, src: TextSource, pressure: float) -> int | None:
        """The engine's next text token in free text (a new run starts when none is going
        on); None when none of the next few is allowed."""
        texts = self.t.texts
        start = self._run <= 0
        if start:
            span = _RUN_MIN + int(src.uniform() * (_RUN_MAX - _RUN_MIN))
            self._run = max(1, round(span * (1.0 - pressure)))
        for k in range(2 * _SKIP):
            tok = src.peek()
            if tok is None:
                break
            src.skip()
            if start:
                text = texts[tok]
                if text.startswith("\ufffd"):  # the rest of a character: not a start
                    continue
                if k < _SKIP and not text[:1].isspace():  # a string starts with a word
                    continue
                if texts[self._last].endswith('"'):
                    tok = self._stripped(tok)
            if self._ok(tok):
                self._run -= 1
                if self._run <= 0:
                    self._want_close = True
                return tok
        self._run = 0
        self._want_close = True
        return None

    def _stripped(self, tok: int) -> int:
        """``tok`` without its leading space, when that is one token (a string's first word).
        A token that ends inside a character is kept as it is: its decoded text stands in
        U+FFFD for the bytes that are missing, and that text is not the token's rest."""
        text = self.t.texts[tok]
        if len(text) > 1 and text[0] == " " and "\ufffd" not in text:
            got = self.t.encode(text[1:])
            if len(got) == 1:
                return got[0]
        return tok

    def _structure(self, src: TextSource, in_text: bool, pressure: float) -> int | None:
        """A structural choice: close, separate, open, a literal or a number, weighted by the
        seed, leaning to close as the budget goes."""
        t = self.t
        if in_text:
            closers = [c for c in t.str_close if self._ok(c)]
            return closers[int(src.uniform() * len(closers))] if closers else None
        after_open = self._last in t.openers
        ended = self._want_close  # a value was just written: no number or literal goes on
        groups = (
            ((0.3 if after_open else 1.0) + 3.0 * pressure, t.close),
            (1.0 + 3.0 * pressure if ended else 0.0, t.str_close),  # a pattern's string
            (1.0, t.sep),
            (0.0 if ended else 1.0 - 0.5 * pressure, t.open),
            (0.0 if ended else 0.5, t.lit),
            (0.0 if ended else 0.1, t.empty),
            (0.0 if ended else 1.0, t.num),
        )
        options = []
        total = 0.0
        for weight, members in groups:
            if members is t.num:
                start = None if ended else self._number_start()
                allowed = [] if start is None else [start]
            else:
                allowed = [c for c in members if self._ok(c)] if weight > 0 else []
            if allowed:
                options.append((weight, allowed, members))
                total += weight
        if not options:
            if ended:  # nothing but more of the value (a pattern's digits): go on
                self._want_close = False
                return self._structure(src, in_text, pressure)
            return None
        x = src.uniform() * total
        k = 0
        while k < len(options) - 1 and x >= options[k][0]:
            x -= options[k][0]
            k += 1
        _, allowed, members = options[k]
        # After a literal or a closed container, the value is over.
        self._want_close = members in (t.lit, t.empty, t.close, t.str_close)
        if members is t.num:
            return self._start_number(src, allowed[0])
        return allowed[int(src.uniform() * len(allowed))]

    def _number_start(self) -> list[int] | None:
        """What goes before a number here (nothing, or the space after ``": "``), or None when
        no number may start."""
        t = self.t
        one = t.chars.get("1")
        if one is None:
            return None
        for prefix in ([], [t.space] if t.space is not None else None):
            if prefix is not None and self.m.validate_tokens([*prefix, one]) == len(prefix) + 1:
                return prefix
        return None

    def _start_number(self, src: TextSource, prefix: list[int]) -> int:
        """Begin writing a plausible number (as much of it as the grammar allows)."""
        plan = [*prefix, *self._number(src)]
        n = self.m.validate_tokens(plan)
        if n <= len(prefix):
            plan = [*prefix, self.t.chars["1"]]
        else:
            plan = plan[:n]
        self._plan = plan[:0:-1]
        self._want_close = not self._plan
        return plan[0]

    def _number(self, src: TextSource) -> list[int]:
        """A plausible number's tokens: a count, a year or a decimal."""
        u, v = src.uniform(), src.uniform()
        if u < 0.55:
            text = str(1 + int(v * 99))
        elif u < 0.75:
            text = str(1950 + int(v * 75))
        elif u < 0.9:
            text = f"{int(v * 100)}.{10 + int(src.uniform() * 90)}"
        else:
            text = str(int(v * 1000))
        chars = self.t.chars
        return [chars[c] for c in text if c in chars]

    def _fallback(self, src: TextSource) -> int:
        """Any allowed token, drawn from the mask (a plain ASCII one when it can)."""
        self._want_close = False
        allowed = _allowed_ids(self.m, self._buf)
        if not len(allowed):
            return self.t.eos[0] if self.t.eos else 0
        plain = allowed[self.t.ascii[allowed]]
        pool = plain if len(plain) else allowed
        return int(pool[int(src.uniform() * len(pool))])
