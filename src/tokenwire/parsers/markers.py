"""Finding markup in streamed text: the earliest marker, or how much text is safe to pass on.

A parser that sees text piece by piece must not let a marker slip out as plain text because the
marker arrived split across pieces. ``find_marker`` answers, for the text buffered so far, either
where the earliest marker starts, or how long a prefix certainly holds none (the rest may be the
start of one and waits for more text, or for the end of the output).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["find_marker", "safe_length"]


def safe_length(text: str, markers: Sequence[str]) -> int:
    """The length of the longest prefix of ``text`` after which no marker can still begin: the
    text minus its longest suffix that is a proper prefix of some marker."""
    tail = text[1 - max(len(m) for m in markers) :] if len(markers) else ""
    if not any(m[0] in tail for m in markers):
        return len(text)  # no marker's first character near the end: nothing to hold
    keep = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), keep, -1):
            if text.endswith(m[:k]):
                keep = k
                break
    return len(text) - keep


def find_marker(
    text: str, markers: Sequence[str], *, final: bool = False
) -> tuple[int, str | None]:
    """``(start, marker)`` of the earliest marker in ``text`` (the longest one on a tie); or, when
    more text may still complete a marker that would start earlier, ``(safe, None)`` with
    ``text[:safe]`` certainly free of markers. ``final``: no more text comes."""
    best = -1
    found: str | None = None
    for m in markers:
        p = text.find(m)
        if p != -1 and (best == -1 or p < best or (p == best and len(m) > len(found or ""))):
            best, found = p, m
    if final:
        return (best, found) if found is not None else (len(text), None)
    safe = safe_length(text, markers)
    if found is not None and best < safe:
        return best, found
    return safe if found is None else min(safe, best), None
