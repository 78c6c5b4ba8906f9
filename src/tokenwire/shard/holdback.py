"""``HoldBack``: which end of a stream's text may still become a stop string.

While a request streams, text that could be the start of one of its stop strings must not reach
the client yet: the next tokens may complete the stop string, and then that text is trimmed. The
held text is the longest suffix of everything seen so far that is a proper prefix of some stop
string.

It is kept with one Knuth-Morris-Pratt automaton per stop string: memory is linear in the stop
strings' lengths (their prefix functions, shared between requests), and each new character costs
amortized constant work per stop string, whatever the lengths. (Keeping every prefix of every
stop string, as a lookup table would, is quadratic in memory: one long stop string is enough to
exhaust the server.)
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from mypy_extensions import mypyc_attr

__all__ = ["HoldBack", "prefix_function"]


@lru_cache(maxsize=4096)
def prefix_function(s: str) -> tuple[int, ...]:
    """``pi[k]``: the length of the longest proper prefix of ``s[: k + 1]`` that is also its
    suffix."""
    pi = [0] * len(s)
    q = 0
    for k in range(1, len(s)):
        c = s[k]
        while q and s[q] != c:
            q = pi[q - 1]
        if s[q] == c:
            q += 1
        pi[k] = q
    return tuple(pi)


@lru_cache(maxsize=4096)
def _automata(stops: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """The stop strings worth holding text back for, and their prefix functions (shared by every
    stream with the same stop strings)."""
    # A one-character stop string has no proper non-empty prefix: nothing to hold for it.
    kept = tuple(s for s in stops if len(s) > 1)
    return kept, tuple(prefix_function(s) for s in kept)


@mypyc_attr(allow_interpreted_subclasses=True)
class HoldBack:
    """The hold-back state of one stream over its stop strings (plain, synchronous)."""

    __slots__ = ("_pis", "_states", "_stops", "held")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops, self._pis = _automata(tuple(stops))
        #: Per stop string: the length of its longest prefix that ends the text seen so far.
        self._states = [0] * len(self._stops)
        #: The text held back: the longest suffix of the text that is a proper prefix of a stop.
        self.held = ""

    def push(self, window: str) -> str:
        """Take ``window``, the held text followed by new text; keep the new held text and return
        the rest of ``window``, which may be delivered."""
        held = self.held
        new = window[len(held) :] if held else window
        if not self._stops or not new:
            return self._split(window)
        states = self._states
        for i, s in enumerate(self._stops):
            q = states[i]
            pi = self._pis[i]
            last = len(s)
            first = s[0]
            pos = 0
            end = len(new)
            while pos < end:
                if not q:
                    # Nothing matched: skip straight to the next character that starts the stop.
                    pos = new.find(first, pos)
                    if pos < 0:
                        break
                    q = 1  # (stops are at least two characters long: not yet a whole one)
                    pos += 1
                    continue
                c = new[pos]
                while q and s[q] != c:
                    q = pi[q - 1]
                if s[q] == c:
                    q += 1
                    if q == last:  # a whole stop string: keep only its longest proper border
                        q = pi[last - 1]
                pos += 1
            states[i] = q
        return self._split(window)

    def _split(self, window: str) -> str:
        keep = max(self._states, default=0)
        if keep:
            self.held = window[-keep:]
            return window[:-keep]
        self.held = ""
        return window

    def restore(self, held: str) -> None:
        """Take ``held`` as the held text, as computed elsewhere for the same stop strings (the
        longest suffix of the text so far that is a proper prefix of one of them); nothing to do
        when it is the held text already (the automata's states follow from it)."""
        if held == self.held:
            return
        self.held = ""
        self._states = [0] * len(self._stops)
        if held:
            self.push(held)

    def release(self) -> str:
        """Give up the held text (the stream is over): return it and start afresh."""
        held = self.held
        self.held = ""
        self._states = [0] * len(self._stops)
        return held
