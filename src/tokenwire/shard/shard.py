"""``DetokShard``: the per-request egress state machine, over its columns.

For every decode step the engine sends one batch frame. The shard detokenizes every request's new
tokens and turns them into per-request text deltas and final items: the one-token-per-request
step is columnar (``fast_step``), any other step goes request by request (``general_step``);
what a request keeps between steps is its ``RequestState`` (``request``), stop token sequences are
``stop_sequences``', the held text ``holdback``'s, and the items reach the sinks by ``delivery``.
Here: the columns, registering and forgetting requests, and the ways a request ends from outside
(failure, abort). Not thread-safe: call it from one thread (the sinks' consumers may live
elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tokenwire.detok.batch import DecodeBatch
from tokenwire.messages.egress import Done, EgressSink, Error
from tokenwire.messages.errors import InternalError, TokenwireError
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.messages.frames import MALFORMED_FRAME, Decoded
from tokenwire.messages.sampling import SamplingParams
from tokenwire.shard.delivery import DEFAULT_MAX_PENDING, DEFAULT_MAX_STALL, Delivery
from tokenwire.shard.fast_step import FastStep
from tokenwire.shard.general_step import GeneralStep
from tokenwire.shard.request import RequestState

if TYPE_CHECKING:
    from tokenwire.shard.fast_step import _Prechecks
    from tokenwire.tokenizer import Tokenizer

__all__ = ["DEFAULT_MAX_PENDING", "DEFAULT_MAX_STALL", "DetokShard"]


class DetokShard(FastStep, GeneralStep, Delivery):
    """Turns decoded batch frames into per-request text deltas and final items."""

    def __init__(
        self,
        abort: Callable[[str], None] | None = None,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_stall: float | None = DEFAULT_MAX_STALL,
        padding: str = "error",
    ) -> None:
        self._abort_cb = abort
        #: What a generated padding id does (``DecodeStream``'s ``padding``; the server: "empty").
        self.padding = padding
        self.max_pending = max_pending
        self.max_stall = max_stall
        self._reqs: dict[str, RequestState] = {}
        self._sid: dict[str, int] = {}  # rid -> shard slot
        self._batches: dict[tuple[int, bool], DecodeBatch] = {}
        self._batch_list: list[DecodeBatch] = []
        # Per shard slot: the request, its sink's try_send, and numpy columns.
        self._by_sid: list[RequestState | None] = []
        self._sinks: list[EgressSink | None] = []
        self._free: list[int] = []
        self._ntok = np.zeros(0, dtype=np.int64)  # tokens so far
        # 0: deliver as is, 1: held text to look at, 2: the exact path (stop regexes).
        self._mode = np.full(0, 2, dtype=np.int8)
        self._dslot = np.zeros(0, dtype=np.intp)  # slot in its DecodeBatch
        self._bidx = np.zeros(0, dtype=np.intp)  # index of its DecodeBatch
        # The text held back (it may start a stop string), kept here on the columnar path; the
        # request's own HoldBack catches up when it takes the exact path.
        self._held = np.full(0, "", dtype=object)
        self._gid = np.zeros(0, dtype=np.intp)  # the id of its list of stop strings (0: none)
        # The live requests' lists of stop strings (with counts and ids), for the step-wide
        # pre-check and hold-back.
        self._stop_refs: dict[tuple[str, ...], int] = {}
        self._gids: dict[tuple[str, ...], int] = {}
        self._free_gids: list[int] = []
        self._prechecks: _Prechecks | None = None
        # The last step's requests, their slots and rows (engines step the same batch again and
        # again); valid while no request has come or gone since (``_layout`` counts those).
        self._layout = 0
        self._last: tuple[list[str], int, list[int], np.ndarray, list[int]] | None = None

    def __len__(self) -> int:
        return len(self._reqs)

    def __contains__(self, rid: object) -> bool:
        return rid in self._reqs

    def live_rids(self) -> list[str]:
        """The request ids being tracked."""
        return list(self._reqs)

    @property
    def live_slots(self) -> int:
        """Decode slots in use over all batches (for leak checks)."""
        return sum(len(b) for b in self._batch_list)

    def register(
        self,
        rid: str,
        sink: EgressSink,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        params: SamplingParams,
    ) -> None:
        """Start tracking ``rid``: its text goes to ``sink``. ``params`` should be normalized."""
        if rid in self._reqs:
            raise InternalError(f"request id {rid!r} is already registered")
        skip = params.skip_special_tokens
        key = (id(tokenizer), skip)
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = DecodeBatch(
                tokenizer, skip_special_tokens=skip, padding=self.padding
            )
            self._batch_list.append(batch)
        slot = batch.add(prompt_ids)
        sid = self._free.pop() if self._free else self._grow()
        st = RequestState(rid, sid, sink, batch, slot, params)
        self._reqs[rid] = st
        self._sid[rid] = sid
        self._by_sid[sid] = st
        self._sinks[sid] = sink
        sink.row = sid
        self._ntok[sid] = 0
        self._mode[sid] = st.mode
        self._dslot[sid] = slot
        self._bidx[sid] = self._batch_list.index(batch)
        self._held[sid] = ""
        self._layout += 1
        self._count(st, +1)

    def _grow(self) -> int:
        sid = len(self._by_sid)
        self._by_sid.append(None)
        self._sinks.append(None)
        if sid >= len(self._ntok):
            size = max(64, 2 * len(self._ntok))
            fills = (("_ntok", 0), ("_mode", 2), ("_dslot", 0), ("_bidx", 0), ("_held", ""))
            for name, fill in (*fills, ("_gid", 0)):
                old = getattr(self, name)
                new = np.full(size, fill, dtype=old.dtype)
                new[: len(old)] = old
                setattr(self, name, new)
        return sid

    def _count(self, st: RequestState, delta: int) -> None:
        stops = st.stops
        if not stops:
            self._gid[st.sid] = 0
            return
        refs = self._stop_refs
        n = refs.get(stops, 0) + delta
        if n:
            refs[stops] = n
        else:
            del refs[stops]
            self._free_gids.append(self._gids.pop(stops))
        if n == delta:
            gids = self._gids
            gids[stops] = self._free_gids.pop() if self._free_gids else len(gids) + 1
        if delta > 0:
            self._gid[st.sid] = self._gids[stops]
        if n == delta or not n:
            self._prechecks = None  # a list came or went: recomputed on the next step

    def fail(self, rid: str, error: TokenwireError) -> None:
        """The request failed (an engine error): deliver ``Error``, forget it."""
        st = self._reqs.get(rid)
        if st is not None:
            st.sink.send_final(Error(error))
            self._forget(st)

    def abort(self, rid: str) -> bool:
        """The frontend gives the request up (client gone, timeout): forget it, abort it in the
        engine. Returns whether it was live."""
        st = self._reqs.get(rid)
        if st is None:
            return False
        self._forget(st)
        self._engine_abort(rid)
        return True

    def end_aborted(self, rid: str, reason: FinishReason) -> bool:
        """End a live request now with an abort ``reason`` (an operator's abort): its sink gets
        a final ``Done`` (text still held back for a possible stop match is dropped), the engine
        an abort. Returns whether it was live."""
        st = self._reqs.get(rid)
        if st is None:
            return False
        ntok = int(self._ntok[st.sid])
        self._forget(st)
        self._engine_abort(rid)
        st.sink.send_final(Done(rid, [], reason, 0, "", ntok))
        return True

    def _forget(self, st: RequestState) -> None:
        if self._reqs.pop(st.rid, None) is None:
            return
        del self._sid[st.rid]
        st.batch.remove(st.slot)
        self._by_sid[st.sid] = None
        self._sinks[st.sid] = None
        self._mode[st.sid] = 2
        self._held[st.sid] = ""
        self._layout += 1
        self._free.append(st.sid)
        self._count(st, -1)

    def _engine_abort(self, rid: str) -> None:
        if self._abort_cb is not None:
            self._abort_cb(rid)

    def on_frame(self, decoded: Decoded) -> None:
        """Process one decoded batch frame."""
        if not decoded.ok:
            # The engine still runs these requests: end them there as well as here.
            for rid in decoded.rids:
                if rid in self._reqs:
                    self.fail(rid, InternalError(MALFORMED_FRAME))
                    self._engine_abort(rid)
            return
        rids = decoded.rids
        n = len(rids)
        if not n:
            return
        tok_lens = decoded.tok_lens
        if min(tok_lens) != 1 or max(tok_lens) != 1 or decoded.has_extras:
            self._general_step(decoded)
            return
        ids = decoded.token_ids
        prompt = decoded.prompt_tokens
        finishes = decoded.finish_reasons
        # (cached_tokens, reasoning_tokens) per request, when the frame carries them.
        counts = (
            list(map(decoded.counts_at, range(n)))
            if decoded.cached_tokens or decoded.reasoning_tokens
            else None
        )
        last = self._last
        if last is not None and last[1] == self._layout and last[0] == rids:
            self._fast_step(rids, last[2], ids, prompt, finishes, counts, last[3], last[4])
            return
        try:
            sids = list(map(self._sid.__getitem__, rids))
        except KeyError:
            # Late chunks for requests already gone are dropped.
            sid_get = self._sid.get
            keep = [j for j, rid in enumerate(rids) if sid_get(rid) is not None]
            if not keep:
                return
            rids = [rids[j] for j in keep]
            sids = [self._sid[rid] for rid in rids]
            ids = ids[np.asarray(keep, dtype=np.intp)]
            prompt = [prompt[j] for j in keep]
            finishes = [finishes[j] for j in keep]
            if counts is not None:
                counts = [counts[j] for j in keep]
        self._fast_step(rids, sids, ids, prompt, finishes, counts)
