"""``DecodeBatch``: many decode streams over one tokenizer, stepped together, one engine step at a
time.

On the fast path a step is a handful of numpy operations over the whole batch: token ids index the
precomputed per-token strings, and only the few streams in an irregular state (a partial character
pending, a leading-space strip still to do, an unseeded prompt, an id the tokenizer cannot map) go
through their own ``DecodeStream``. Tokenizers without a fast table step each stream in turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from tokenwire.detok.stream import DecodeStream
from tokenwire.detok.tables import decode_table
from tokenwire.messages.errors import DecodeError
from tokenwire.tokenizer import Tokenizer

__all__ = ["DecodeBatch"]

_EMPTY_ERRORS: dict[int, DecodeError] = {}


def _as_ids(token_ids: Sequence[int] | np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids as an integer array, and their positions in the lookup arrays, which end with a
    sentinel entry at ``size``: every id outside ``[0, size)`` is sent there."""
    ids = np.asarray(token_ids)
    if ids.dtype == np.int32:
        return ids, ids.view(np.uint32)  # negative ids become huge; the caller clamps on error
    if ids.dtype != np.int64:
        ids = ids.astype(np.int64)
    return ids, np.minimum(ids.view(np.uint64), size)


class DecodeBatch:
    """A set of slots, each one request's decode stream; ``step`` advances many at once.

    Slots are small integers handed out by ``add`` and reused after ``remove``. Text emitted through
    the batch is returned, not kept: a slot's stream does not track ``output``.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        skip_special_tokens: bool = True,
        fast: bool | None = None,
        padding: str = "error",
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        #: What a generated padding id does in each stream (``DecodeStream``'s ``padding``).
        self.padding = padding
        table = decode_table(tokenizer, skip_special_tokens) if fast is not False else None
        self._table = table
        self._streams: list[DecodeStream | None] = []
        self._free: list[int] = []
        self._irregular = np.ones(0, dtype=bool)
        if table is not None:
            # Lookup arrays end with an irregular sentinel entry for ids outside the table.
            self._nonsimple = np.append(~table.simple, True)
            self._strs = np.append(table.strs, np.array([""], dtype=object))
            self._size = table.size

    @property
    def fast(self) -> bool:
        """Whether steps use the precomputed tables."""
        return self._table is not None

    def __len__(self) -> int:
        return len(self._streams) - len(self._free)

    def add(self, prompt_token_ids: Iterable[int] = ()) -> int:
        """Open a stream with ``prompt_token_ids`` as left context; return its slot."""
        stream = DecodeStream(
            self.tokenizer,
            prompt_token_ids,
            skip_special_tokens=self.skip_special_tokens,
            fast=self._table is not None,
            padding=self.padding,
        )
        if self._free:
            slot = self._free.pop()
            self._streams[slot] = stream
        else:
            slot = len(self._streams)
            self._streams.append(stream)
            if slot >= len(self._irregular):
                grown = np.ones(max(16, 2 * len(self._irregular)), dtype=bool)
                grown[: len(self._irregular)] = self._irregular
                self._irregular = grown
        self._irregular[slot] = True
        return slot

    def remove(self, slot: int) -> None:
        """Close a slot (its held text is dropped; call ``flush`` first to get it)."""
        if self._streams[slot] is None:
            raise KeyError(slot)
        self._streams[slot] = None
        self._irregular[slot] = True
        self._free.append(slot)

    def stream(self, slot: int) -> DecodeStream:
        """The decode stream of ``slot``."""
        stream = self._streams[slot]
        if stream is None:
            raise KeyError(slot)
        return stream

    def push(self, slot: int, token_id: int) -> str:
        """One token for one slot (``DecodeError`` if the tokenizer cannot map it)."""
        stream = self.stream(slot)
        try:
            return stream.push_token(token_id)
        finally:
            self._irregular[slot] = stream._irregular or self._table is None

    def push_into(self, slot: int, token_ids: Iterable[int], out: list[str]) -> None:
        """Several tokens for one slot, in order: each one's text appended to ``out``. On a token
        the tokenizer cannot map, ``DecodeError`` with ``out`` holding the texts before it."""
        stream = self.stream(slot)
        push = stream.push_token
        try:
            for token_id in token_ids:
                out.append(push(token_id))
        finally:
            self._irregular[slot] = stream._irregular or self._table is None

    def flush(self, slot: int) -> str:
        """End of ``slot``'s stream: whatever it still holds."""
        text = self.stream(slot).flush()
        self._irregular[slot] = True
        return text

    def step(
        self, slots: Sequence[int] | np.ndarray, token_ids: Sequence[int] | np.ndarray
    ) -> tuple[list[str], dict[int, DecodeError]]:
        """One token for each of ``slots`` (distinct): ``(texts, errors)``, ``texts[j]`` the text
        slot ``slots[j]`` emits. A token the tokenizer cannot map leaves ``texts[j] == ""`` and puts
        ``errors[j]``; the other streams are unaffected."""
        if self._table is None:
            return self._step_each(slots, token_ids, None)
        ids, pos = _as_ids(token_ids, self._size)
        slot_arr = np.asarray(slots, dtype=np.intp)
        try:
            bad = self._nonsimple[pos]
        except IndexError:
            pos = np.minimum(pos, self._size)
            bad = self._nonsimple[pos]
        bad |= self._irregular[slot_arr]
        texts: list[str] = self._strs[pos].tolist()
        todo = np.flatnonzero(bad)
        if not len(todo):
            return texts, _EMPTY_ERRORS
        errors: dict[int, DecodeError] = {}
        streams = self._streams
        irregular = self._irregular
        for j, slot, token_id in zip(todo.tolist(), slot_arr[todo].tolist(), ids[todo].tolist()):
            stream = streams[slot]
            if stream is None:
                raise KeyError(slot)
            try:
                texts[j] = stream.push_token(token_id)
            except DecodeError as exc:
                texts[j] = ""
                errors[j] = exc
            irregular[slot] = stream._irregular
        return texts, errors

    def step_ragged(
        self,
        slots: Sequence[int] | np.ndarray,
        token_ids: Sequence[int] | np.ndarray,
        lengths: Sequence[int] | np.ndarray,
    ) -> tuple[list[str], dict[int, DecodeError]]:
        """Several tokens per slot: slot ``slots[j]`` takes the next ``lengths[j]`` ids of
        ``token_ids``. Returns ``(texts, errors)`` as ``step`` does; a stream stops at its first
        id the tokenizer cannot map."""
        lens = np.asarray(lengths, dtype=np.intp)
        ids = np.asarray(token_ids, dtype=np.int64)
        if int(lens.sum()) != len(ids):
            raise ValueError("sum(lengths) must equal len(token_ids)")
        if self._table is None:
            return self._step_each(slots, ids, lens)
        if len(lens) and lens.min() == 1 and lens.max() == 1:
            return self.step(slots, ids)
        slot_arr = np.asarray(slots, dtype=np.intp)
        ids, pos = _as_ids(ids, self._size)
        pos = np.minimum(pos, self._size)
        starts = np.cumsum(lens) - lens
        # A request is regular when its stream is and all its tokens are (empty ones are too).
        bad_tokens = np.concatenate(([0], np.cumsum(self._nonsimple[pos])))
        regular = (bad_tokens[starts + lens] == bad_tokens[starts]) & ~self._irregular[slot_arr]
        strs = self._strs[pos].tolist()
        bounds = np.stack((starts, starts + lens), axis=1).tolist()
        texts = ["".join(strs[a:b]) for a, b in bounds]
        if regular.all():
            return texts, _EMPTY_ERRORS
        errors: dict[int, DecodeError] = {}
        for j in np.flatnonzero(~regular).tolist():
            slot = int(slot_arr[j])
            stream = self.stream(slot)
            a, b = bounds[j]
            parts = []
            try:
                for k in range(a, b):
                    parts.append(stream.push_token(int(ids[k])))
            except DecodeError as exc:
                errors[j] = exc
            texts[j] = "".join(parts)
            self._irregular[slot] = stream._irregular
        return texts, errors

    def _step_each(
        self,
        slots: Sequence[int] | np.ndarray,
        token_ids: Sequence[int] | np.ndarray,
        lens: np.ndarray | None,
    ) -> tuple[list[str], dict[int, DecodeError]]:
        ids = np.asarray(token_ids, dtype=np.int64).tolist()
        slot_list = np.asarray(slots, dtype=np.intp).tolist()
        counts = [1] * len(slot_list) if lens is None else lens.tolist()
        texts: list[str] = []
        errors: dict[int, DecodeError] = {}
        pos = 0
        for j, (slot, count) in enumerate(zip(slot_list, counts)):
            stream = self.stream(slot)
            parts = []
            try:
                for k in range(pos, pos + count):
                    parts.append(stream.push_token(ids[k]))
            except DecodeError as exc:
                errors[j] = exc
            texts.append("".join(parts))
            pos += count
        return texts, errors
