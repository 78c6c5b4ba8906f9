"""Stop token *sequences* (lists inside ``stop_token_ids``), matched by the frontend for engines
that do not match them: one request's recent ids and the lengths of their texts, which sequence
the newest token completes, and the text held back while the recent ids may begin one (a matched
sequence's whole text is dropped unless ``no_stop_trim``; its ids still count)."""

from __future__ import annotations

from tokenwire.messages.finish_reason import FinishReason
from tokenwire.messages.sampling import MAX_STOP_TOKEN_SEQUENCE_LEN

__all__ = ["StopTokenSequences", "engine_sequence"]


class StopTokenSequences:
    """One request's stop token sequences and the recent tokens that may complete one."""

    __slots__ = ("ids", "lens", "seqs", "text")

    def __init__(self, seqs: list[list[int]]) -> None:
        self.seqs = seqs
        self.ids: list[int] = []  # the recent ids ...
        self.lens: list[int] = []  # ... and their texts' lengths
        #: Text held back: the recent ids may begin a sequence.
        self.text = ""

    def push(self, tid: int, chars: int, may_stop: bool) -> list[int] | None:
        """Record a generated token (and its text's length); return the first stop token sequence
        it completes, if it may stop the request."""
        ids = self.ids
        ids.append(tid)
        self.lens.append(chars)
        if len(ids) > MAX_STOP_TOKEN_SEQUENCE_LEN:
            del ids[0], self.lens[0]
        if may_stop:
            for seq in self.seqs:
                if ids[-len(seq) :] == seq:
                    return seq
        return None

    def hold(self) -> int:
        """Characters of recent text that may belong to a stop token sequence not yet complete:
        the text of the longest run of recent ids that is a proper prefix of one."""
        ids = self.ids
        longest = 0
        for seq in self.seqs:
            for k in range(min(len(seq) - 1, len(ids)), longest, -1):
                if ids[-k:] == seq[:k]:
                    longest = k
                    break
        return sum(self.lens[-longest:]) if longest else 0

    def chars(self, count: int) -> int:
        """Characters of text of the ``count`` recent tokens before the last one."""
        return sum(self.lens[-1 - count : -1]) if count > 0 else 0

    def release(self, taken: list[str], out: list[str], held: int) -> None:
        """Move the text that cannot belong to a stop token sequence from ``taken`` to ``out``
        (``held``: characters the stop strings' hold-back keeps already)."""
        text = self.text + "".join(taken) if taken else self.text
        taken.clear()
        keep = self.hold() - held
        if keep <= 0:
            out.append(text)
            self.text = ""
        else:
            cut = max(len(text) - keep, 0)
            out.append(text[:cut])
            self.text = text[cut:]


def engine_sequence(fin: FinishReason) -> list[int] | None:
    """The stop token sequence an engine reports having matched, if any."""
    matched = fin.matched()
    return matched if isinstance(matched, list) and matched else None
