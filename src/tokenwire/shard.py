"""``DetokShard``: the per-request egress state machine.

For every decode step the engine sends one batch frame. The shard detokenizes every request's new
tokens together (``DecodeBatch``), then, per request and per token in order:

1. A token-level stop (EOS, ``stop_token_ids``: the engine's ``stop`` finish with a token
   ``matched``) is not emitted as text unless ``no_stop_trim``; it still counts as a token. A stop
   token *sequence* (a list in ``stop_token_ids``) is matched here too, for engines that do not
   match sequences: the text of the tokens that may begin one is held back, and a matched
   sequence's whole text is dropped unless ``no_stop_trim`` (its ids still count and are sent).
2. Its text comes from the request's decode stream; an id the tokenizer cannot map ends only this
   request (``Error`` item, engine abort).
3. Past ``min_new_tokens``, stop strings: the earliest-completing match that includes new text wins
   (ties in list order); the text ends at the match start (through the stop with
   ``no_stop_trim``); later tokens of the step are dropped; the engine request is aborted.
4. Stop regexes (RE2), over the window their ``max_len`` needs: a match stops the same way, with
   the matched text kept and ``matched`` the pattern.
5. While streaming, the longest suffix that is a prefix of some stop string is held back, so no
   partial stop string ever reaches the client.
6. The engine's own finish (``length``, EOS, abort) passes through on a final ``Done`` with the
   held text and whatever the decoder still holds.
7. With ``stream_interval`` N > 1, a request's text and ids go out when its token count reaches
   1, N + 1, 2N + 1... (SGLang's points; a step of several tokens goes out if it reaches one)
   and when it ends; in between they wait in the request's state.

On the one-token-per-request path, steps 3 and 5 are step-wide: every request's held text and new
text are joined into one string, searched once for the stop strings and for ends that may start
one, and only the requests whose held text changes (or that may stop) take a Python path of their
own; the held text lives in a shard column, and a request's own automaton catches up when it takes
the exact path.

Delivery goes through each request's ``EgressSink``. On the one-token-per-request path, the step's
intermediate chunks are one ``StepChunks`` (columns for the whole step) that every sink queues;
each consumer gets its own ``Frame`` when it takes the item. When a sink is full, the delta is
merged into the newest undelivered item (bounded by ``max_pending`` characters and token ids
together, past which the request ends; so is a request whose client has not taken anything for
``max_stall`` seconds, and its sink is abandoned); when it is closed, the request ends. Both
abort the request in the engine. Not thread-safe: call it from one thread (the sinks' consumers
may live elsewhere).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tokenwire.detok.batch import DecodeBatch
from tokenwire.holdback import HoldBack
from tokenwire.messages.egress import Done, EgressSink, Error, Frame, StepChunks
from tokenwire.messages.errors import (
    DecodeError,
    InternalError,
    OverloadedError,
    TokenwireError,
)
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.messages.frames import MALFORMED_FRAME, Decoded
from tokenwire.messages.regex import UNBOUNDED
from tokenwire.messages.sampling import MAX_STOP_TOKEN_SEQUENCE_LEN, SamplingParams

if TYPE_CHECKING:
    from tokenwire.tokenizer import Tokenizer

__all__ = ["DEFAULT_MAX_PENDING", "DEFAULT_MAX_STALL", "DetokShard"]

#: Characters plus token ids a request may have waiting for a slow client before it is ended.
DEFAULT_MAX_PENDING = 1 << 20
#: Seconds a client may take nothing from its full sink before its request is ended.
DEFAULT_MAX_STALL = 30.0


class _Req:
    """One request's egress state (its token count lives in the shard's ``_ntok`` column)."""

    __slots__ = (
        "batch",
        "hb",
        "interval",
        "min_new",
        "no_trim",
        "regexes",
        "rid",
        "rtail",
        "rtail_cut",
        "rtail_keep",
        "seq_ids",
        "seq_lens",
        "seq_text",
        "seqs",
        "sid",
        "sink",
        "slot",
        "stops",
        "waiting",
    )

    def __init__(
        self,
        rid: str,
        sid: int,
        sink: EgressSink,
        batch: DecodeBatch,
        slot: int,
        params: SamplingParams,
    ) -> None:
        self.rid = rid
        self.sid = sid
        self.sink = sink
        self.batch = batch
        self.slot = slot
        self.min_new = params.min_new_tokens
        self.no_trim = params.no_stop_trim
        stops = params.stop_strs if params.stop_strs is not None else _as_list(params.stop)
        self.stops: tuple[str, ...] = tuple(stops)
        self.hb = HoldBack(self.stops)  # text held back: it may start a stop string
        self.regexes = tuple(params.stop_regexes)
        keep = max((r.max_len + r.needs_next for r in self.regexes), default=0)
        # Recent text, for regexes whose matches start in delivered text: as much as the longest
        # match spans (one more if it may end where new text begins), and one more character,
        # for what comes before a match (\b, ^, \A).
        self.rtail_keep = None if keep >= UNBOUNDED else max(keep, 1)
        self.rtail = ""
        self.rtail_cut = False  # whether rtail has lost the start of the text
        # Stop token sequences: the recent ids and their texts' lengths, and the text held back
        # while the recent ids may begin a sequence.
        self.seqs = params.stop_token_sequences
        self.seq_ids: list[int] = []
        self.seq_lens: list[int] = []
        self.seq_text = ""
        # stream_interval: the text, ids and extras waiting for the next point to go out at.
        self.interval = params.stream_interval or 1
        self.waiting: tuple[str, list[int], Any] | None = None

    @property
    def held(self) -> str:
        """Text held back: it may be the start of a stop string."""
        return self.hb.held

    def hold_back(self, window: str) -> str:
        """Keep the longest suffix of ``window`` (the held text, then new text) that is a proper
        prefix of a stop string as the held text; return the rest, which may be delivered."""
        return self.hb.push(window)

    @property
    def mode(self) -> int:
        """How the next token is handled: 0 as is, 1 with held text, 2 the exact path."""
        return 2 if self.regexes or self.seqs or self.interval > 1 else 1 if self.held else 0

    def push_token(self, tid: int, chars: int, may_stop: bool) -> list[int] | None:
        """Record a generated token (and its text's length); return the first stop token sequence
        it completes, if it may stop the request."""
        ids = self.seq_ids
        ids.append(tid)
        self.seq_lens.append(chars)
        if len(ids) > MAX_STOP_TOKEN_SEQUENCE_LEN:
            del ids[0], self.seq_lens[0]
        if may_stop:
            for seq in self.seqs:
                if ids[-len(seq) :] == seq:
                    return seq
        return None

    def seq_hold(self) -> int:
        """Characters of recent text that may belong to a stop token sequence not yet complete:
        the text of the longest run of recent ids that is a proper prefix of one."""
        ids = self.seq_ids
        longest = 0
        for seq in self.seqs:
            for k in range(min(len(seq) - 1, len(ids)), longest, -1):
                if ids[-k:] == seq[:k]:
                    longest = k
                    break
        return sum(self.seq_lens[-longest:]) if longest else 0

    def seq_chars(self, count: int) -> int:
        """Characters of text of the ``count`` recent tokens before the last one."""
        return sum(self.seq_lens[-1 - count : -1]) if count > 0 else 0


def _as_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


@lru_cache(maxsize=4096)
def _hold_keys(stops: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """For the step-wide pre-check: the stop strings' one-character prefixes, and the last two
    characters of their longer proper prefixes."""
    firsts = frozenset(s[0] for s in stops if len(s) > 1)
    pairs = frozenset(s[k - 2 : k] for s in stops for k in range(2, len(s)))
    return firsts, pairs


_SEP = "\x00"
#: Steps of fewer requests than this find their hold-back candidates without numpy (with one
#: regex, when the stop strings' ends make at most ``_MAX_END_PATTERNS`` alternatives).
_SMALL_STEP = 160
_MAX_END_PATTERNS = 64
_NO_ENDS = re.compile("(?!)")  # for stop strings of one character: no end to hold back
#: Past this many different stop strings among the live requests, each request checks its own.
_MAX_SHARED_STOPS = 64
#: Past this many proper prefixes of the live stop strings, or with a stop string longer than
#: ``_MAX_TABLE_STOP_LEN``, each request holding text back runs its own automaton instead of
#: looking its text's ends up (the table's memory is quadratic in a stop string's length).
_MAX_SHARED_PREFIXES = 256
_MAX_TABLE_STOP_LEN = 64


class _Prefixes(NamedTuple):
    """The proper prefixes of each live list of stop strings, by the list's id (0: none)."""

    own: list[frozenset[str]]
    #: By a prefix's last character: the lengths of the prefixes that end with it, longest first.
    lengths: list[dict[str, tuple[int, ...]]]


def _prefixes(groups: dict[tuple[str, ...], int]) -> _Prefixes | None:
    """The prefixes of ``groups`` (stop lists by id), or None when there are too many."""
    size = max(groups.values(), default=0) + 1
    own: list[frozenset[str]] = [frozenset()] * size
    lengths: list[dict[str, tuple[int, ...]]] = [{}] * size
    total = 0
    for group, gid in groups.items():
        total += sum(len(s) - 1 for s in group if s)
        if total > _MAX_SHARED_PREFIXES or max(map(len, group)) > _MAX_TABLE_STOP_LEN:
            return None
        own[gid] = frozenset(s[:k] for s in group for k in range(1, len(s)))
        by_last: dict[str, set[int]] = {}
        for p in own[gid]:
            by_last.setdefault(p[-1], set()).add(len(p))
        lengths[gid] = {c: tuple(sorted(ks, reverse=True)) for c, ks in by_last.items()}
    return _Prefixes(own, lengths)


class _Prechecks(NamedTuple):
    """What the step-wide stop check needs to know of the live requests' stop strings."""

    stops: tuple[str, ...]  # every one, once
    #: Whether to check each request on its own instead (a stop string holding the separator,
    #: or so many different stop strings that checking each request's own is cheaper).
    per_request: bool
    #: A window ending with the start of a stop string ends with a stop string's first character
    #: or with the last two characters of a longer proper prefix: those followed by the
    #: separator (None when they make too many alternatives for one regex) ...
    ends: re.Pattern[str] | None
    #: ... and as a lookup by code point of the first characters (its last entry False, for every
    #: larger code point) and the sorted keys ``code << 21 | code`` of the pairs.
    first_codes: np.ndarray
    pair_keys: np.ndarray
    prefixes: _Prefixes | None  # None: each request holds back its own text


class DetokShard:
    """Turns decoded batch frames into per-request text deltas and final items."""

    def __init__(
        self,
        abort: Callable[[str], None] | None = None,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_stall: float | None = DEFAULT_MAX_STALL,
    ) -> None:
        self._abort_cb = abort
        self.max_pending = max_pending
        self.max_stall = max_stall
        self._reqs: dict[str, _Req] = {}
        self._sid: dict[str, int] = {}  # rid -> shard slot
        self._batches: dict[tuple[int, bool], DecodeBatch] = {}
        self._batch_list: list[DecodeBatch] = []
        # Per shard slot: the request, its sink's try_send, and numpy columns.
        self._by_sid: list[_Req | None] = []
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

    # ---- lifecycle -------------------------------------------------------------------------------

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
            batch = self._batches[key] = DecodeBatch(tokenizer, skip_special_tokens=skip)
            self._batch_list.append(batch)
        slot = batch.add(prompt_ids)
        sid = self._free.pop() if self._free else self._grow()
        st = _Req(rid, sid, sink, batch, slot, params)
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

    def _count(self, st: _Req, delta: int) -> None:
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

    def _forget(self, st: _Req) -> None:
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

    # ---- one decode step -------------------------------------------------------------------------

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

    def _fast_step(
        self,
        rids: list[str],
        sids: list[int],
        ids: np.ndarray,
        prompt: list[int],
        finishes: list[FinishReason | None],
        counts: list[tuple[int, int]] | None = None,
        sid_arr: np.ndarray | None = None,
        rows: list[int] | None = None,
    ) -> None:
        """One token per request: columnar all the way to the items, except for the few requests
        that finish, or that a stop string or the hold-back concerns. (``sid_arr``: ``sids`` as
        an array; ``rows``: the row of each slot, as ``StepChunks`` maps them.)"""
        n = len(sids)
        if sid_arr is None or rows is None:
            sid_arr = np.array(sids, dtype=np.intp)
            rows_arr = np.zeros(len(self._by_sid), dtype=np.intp)
            rows_arr[sid_arr] = np.arange(n)
            rows = rows_arr.tolist()
            self._last = (rids, self._layout, sids, sid_arr, rows)
        texts, errors = self._decode(sid_arr, ids)
        ntok = self._ntok[sid_arr] + 1
        self._ntok[sid_arr] = ntok
        # Per request: 0 deliver as is; 1 held text or the hold-back to look at; 2 the exact path.
        flags = self._mode[sid_arr]
        if errors:
            flags[list(errors)] = 2
        if finishes.count(None) != n:
            flags[[j for j, fin in enumerate(finishes) if fin is not None]] = 2
        checks = self._precheck()
        if checks.per_request:
            flags[:] = 2
        elif checks.stops:
            self._check_stops(sid_arr, texts, flags, checks)
        exact = np.flatnonzero(flags > 1).tolist()
        by_sid = self._by_sid
        # The rest share one columnar result: each sink queues the step, not an item of its own.
        # (Lists, not arrays: a consumer reads its row with plain indexing.)
        step = StepChunks(rids, ids.tolist(), prompt, texts, ntok.tolist(), rows)
        out = sids if not exact else sid_arr[flags < 2].tolist()
        blocked = self._deliver(step, out)
        if exact:
            id_list = ids.tolist()
        for j in exact:
            st = self._by_sid[sids[j]]
            assert st is not None
            self._ntok[st.sid] -= 1  # the exact path counts it again
            fin = finishes[j]
            row = counts[j] if counts is not None else (0, 0)
            if fin is not None and _trims(st, fin, id_list[j : j + 1]):
                self._advance(st, [""], [id_list[j]], fin, prompt[j], None, row)  # a stop token
            elif j in errors:
                self._decode_failed(st, errors[j], fin)
            else:
                self._advance(st, [texts[j]], [id_list[j]], fin, prompt[j], None, row)
        for sid in blocked:
            st = by_sid[sid]
            if st is None:
                continue
            item = step.chunk(sid)
            if st.sink.try_send(item) is not None:
                self._blocked(st, item, None)

    def _deliver(self, step: StepChunks, out: list[int]) -> list[int]:
        """Queue ``step`` in the sinks of shard slots ``out``; return the slots whose sinks did
        not take it (full or closed)."""
        sinks = self._sinks
        blocked = []
        for sid in out:
            # EgressSink.try_send, inline (the shard is the sinks' one producer).
            sink = sinks[sid]
            dq = sink._dq  # type: ignore[union-attr]
            if len(dq) < sink.capacity and not sink._closed:  # type: ignore[union-attr]
                dq.append(step)
                if sink._waiter is not None:  # type: ignore[union-attr]
                    sink._wake()  # type: ignore[union-attr]
            else:
                blocked.append(sid)
        return blocked

    def _check_stops(
        self, sid_arr: np.ndarray, texts: list[str], flags: np.ndarray, checks: _Prechecks
    ) -> None:
        """The step-wide stop check: flag (2) every request whose held and new text may complete
        a stop string; of the others, replace ``texts[j]`` with what may be delivered, holding
        back the end that may start one of its stop strings. Columnar, but for the requests
        whose held text changes."""
        n = len(texts)
        held_col = self._held
        had = np.flatnonzero(flags == 1).tolist()  # held text to prepend
        if had:
            windows = texts.copy()
            for j, h in zip(had, held_col[sid_arr[had]].tolist()):
                windows[j] = h + windows[j]
        else:
            windows = texts
        # All windows in one string, a separator after each.
        big = _SEP.join(windows) + _SEP
        if checks.ends is not None and n < _SMALL_STEP and big.count(_SEP) == n:
            cand, gone = self._candidates_small(big, checks.ends, flags, had, checks.stops)
        else:
            cand, gone = self._candidates(windows, big, flags, had, checks)
        if gone:  # held text with nothing to hold now: it all goes
            for j in gone:
                texts[j] = windows[j]
            sids = sid_arr[gone]
            held_col[sids] = ""
            self._mode[sids] = 0
        if not cand:
            return
        prefixes = checks.prefixes
        sids = sid_arr[cand]
        if prefixes is None:  # each runs its own automaton
            by_sid = self._by_sid
            for j, sid in zip(cand, sids.tolist()):
                st = by_sid[sid]
                assert st is not None
                hb = st.hb
                hb.restore(held_col[sid])
                texts[j] = hb.push(windows[j])
                held_col[sid] = hb.held
                self._mode[sid] = 1 if hb.held else 0
            return
        # The longest end of each window that is a proper prefix of one of its stop strings.
        own, lengths = prefixes
        held = []
        modes = []
        for j, g in zip(cand, self._gid[sids].tolist()):
            w = windows[j]  # (``windows`` may be ``texts``)
            for k in lengths[g].get(w[-1:], ()):
                if w[-k:] in own[g]:  # (k past the start: all of w, which may be one)
                    texts[j] = w[:-k]
                    held.append(w[-k:])
                    modes.append(1)
                    break
            else:
                texts[j] = w
                held.append("")
                modes.append(0)
        held_col[sids] = held
        self._mode[sids] = modes

    @staticmethod
    def _candidates(
        windows: list[str], big: str, flags: np.ndarray, had: list[int], checks: _Prechecks
    ) -> tuple[list[int], list[int]]:
        """Flag the windows in which a stop string completes; return the others that may end
        with the start of one (candidates to hold text back) and those that held text and need
        not now (columnar)."""
        n = len(windows)
        codes = np.frombuffer(big.encode("utf-32-le"), dtype=np.uint32)
        if big.count(_SEP) == n:
            ends = np.flatnonzero(codes == 0)  # window j ends at ends[j]
        else:  # some text holds the separator character itself
            ends = np.cumsum(np.fromiter(map(len, windows), dtype=np.int64, count=n) + 1) - 1
        for s in checks.stops:
            p = big.find(s)
            while p != -1:
                flags[int(np.searchsorted(ends, p))] = 2
                p = big.find(s, p + 1)
        lens = np.empty(n, dtype=np.int64)
        lens[0] = ends[0]
        np.subtract(ends[1:], ends[:-1] + 1, out=lens[1:])
        last = codes[np.maximum(ends - 1, 0)]
        hold = np.take(checks.first_codes, last, mode="clip") & (lens > 0)
        pairs = checks.pair_keys
        if len(pairs):
            keys = (codes[np.maximum(ends - 2, 0)].astype(np.int64) << 21) | last
            at = np.minimum(np.searchsorted(pairs, keys), len(pairs) - 1)
            hold |= (pairs[at] == keys) & (lens > 1)
        hold &= flags < 2
        gone = [j for j in had if flags[j] == 1 and not hold[j]] if had else []
        return np.flatnonzero(hold).tolist(), gone

    @staticmethod
    def _candidates_small(
        big: str, ends: re.Pattern[str], flags: np.ndarray, had: list[int], stops: Sequence[str]
    ) -> tuple[list[int], list[int]]:
        """``_candidates`` for a few requests (``ends``: the regex of the windows' ends that may
        start a stop string): plain Python costs less than numpy's calls."""
        for s in stops:
            p = big.find(s)
            while p != -1:
                # Window j ends at the (j + 1)-th separator.
                flags[big.count(_SEP, 0, p)] = 2
                p = big.find(s, p + 1)
        exact = flags.tolist()
        cand = []
        j = prev = 0
        for m in ends.finditer(big):
            sep = m.end() - 1  # window j ends here: count the separators before it
            j += big.count(_SEP, prev, sep)
            prev = sep
            if exact[j] < 2:
                cand.append(j)
        if not had:
            return cand, []
        hold = set(cand)
        return cand, [j for j in had if exact[j] == 1 and j not in hold]

    def _decode(
        self, sid_arr: np.ndarray, ids: np.ndarray
    ) -> tuple[list[str], dict[int, DecodeError]]:
        """One token per request: every request's text, batch-decoded."""
        bidx = self._bidx[sid_arr]
        dslot = self._dslot[sid_arr]
        if len(self._batch_list) == 1 or bidx.min() == bidx.max():
            return self._batch_list[int(bidx[0])].step(dslot, ids)
        texts: list[str] = [""] * len(sid_arr)
        errors: dict[int, DecodeError] = {}
        for b in np.unique(bidx).tolist():
            sel = np.flatnonzero(bidx == b)
            got, errs = self._batch_list[b].step(dslot[sel], ids[sel])
            for k, j in enumerate(sel.tolist()):
                texts[j] = got[k]
            for k, e in errs.items():
                errors[int(sel[k])] = e
        return texts, errors

    def _precheck(self) -> _Prechecks:
        """The step-wide stop check's tables for the live requests' stop strings."""
        if self._prechecks is None:
            stops = tuple(dict.fromkeys(s for group in self._stop_refs for s in group))
            first_set: set[str] = set()
            pair_set: set[str] = set()
            for group in self._stop_refs:
                group_firsts, group_pairs = _hold_keys(group)
                first_set |= group_firsts
                pair_set |= group_pairs
            codes = [ord(c) for c in first_set]
            first_codes = np.zeros(max(codes, default=-1) + 2, dtype=bool)
            first_codes[codes] = True
            keys = sorted((ord(p[0]) << 21) | ord(p[1]) for p in pair_set)
            per_request = len(stops) > _MAX_SHARED_STOPS or any(_SEP in s for s in stops)
            tails = sorted(first_set | pair_set, key=len, reverse=True)
            if not tails:
                ends = _NO_ENDS
            elif len(tails) <= _MAX_END_PATTERNS:
                ends = re.compile("(?:" + "|".join(map(re.escape, tails)) + ")" + _SEP)
            else:
                ends = None
            self._prechecks = _Prechecks(
                stops,
                per_request,
                ends,
                first_codes,
                np.array(keys, dtype=np.int64),
                None if per_request else _prefixes(self._gids),
            )
        return self._prechecks

    def _general_step(self, decoded: Decoded) -> None:
        """Any step, request by request: several tokens each, logprob/hidden-state extras."""
        reqs = self._reqs
        finishes = decoded.finish_reasons
        prompt = decoded.prompt_tokens
        ids = decoded.token_ids.tolist()
        pos = 0
        for j, (rid, n) in enumerate(zip(decoded.rids, decoded.tok_lens)):
            tokens = ids[pos : pos + n]
            pos += n
            st = reqs.get(rid)
            if st is None:
                continue  # a late chunk for a request already gone: dropped
            fin = finishes[j]
            decode_ids = tokens[:-1] if fin is not None and _trims(st, fin, tokens) else tokens
            pieces: list[str] = []
            for tid in decode_ids:
                try:
                    pieces.append(st.batch.push(st.slot, tid))
                except DecodeError as exc:
                    # Tokens before the bad one still count and their text is delivered.
                    if pieces:
                        self._advance(st, pieces, tokens[: len(pieces)], None, prompt[j], None)
                    if st.rid in reqs:
                        self._decode_failed(st, exc, fin)
                    break
            else:
                pieces += [""] * (len(tokens) - len(decode_ids))
                self._advance(
                    st, pieces, tokens, fin, prompt[j], decoded.extras_at(j), decoded.counts_at(j)
                )

    # ---- per-request logic -----------------------------------------------------------------------

    def _advance(
        self,
        st: _Req,
        pieces: list[str],
        token_ids: list[int],
        fin: FinishReason | None,
        prompt_tokens: int,
        extras: Any,
        counts: tuple[int, int] = (0, 0),
    ) -> None:
        """Take this step's per-token texts; deliver what is safe; finish when it is over.
        ``counts``: the engine's ``(cached_tokens, reasoning_tokens)`` for the request."""
        st.hb.restore(self._held[st.sid])  # the columnar path may have held text back
        out: list[str] = []
        # With stop token sequences, text passes one more hold-back (by tokens) on its way out.
        taken: list[str] = [] if st.seqs else out
        used = 0
        ntok = int(self._ntok[st.sid])
        stop: FinishReason | None = None  # a stop string or regex
        seq_stop: FinishReason | None = None  # a stop token sequence
        drop = -1  # tokens before the last whose text a matched sequence drops
        last = len(pieces) - 1
        for k, piece in enumerate(pieces):
            ntok += 1
            used += 1
            if st.seqs:
                seq = st.push_token(token_ids[k], len(piece), ntok > st.min_new)
                if seq is None and k == last and fin is not None:
                    seq = _engine_sequence(fin)
                if seq is not None:
                    seq_stop = FinishReason.stop(list(seq))
                    if not st.no_trim:
                        drop = len(seq) - 1
                        break
            if piece:
                stop = self._take(st, piece, taken, ntok)
                if stop is not None:
                    break
            if seq_stop is not None:
                break
            if st.seqs:
                self._release(st, taken, out)
        if stop is None and (seq_stop is not None or fin is not None):
            if drop >= 0:
                # The sequence's text goes, with the decoder's incomplete bytes (theirs too).
                whole = st.seq_text + "".join(taken) + st.hb.release()
                taken[:] = [whole[: max(len(whole) - st.seq_chars(drop), 0)]]
                st.seq_text = ""
            else:
                # The request is over: whatever the decoder still holds, then everything held.
                tail = st.batch.flush(st.slot)
                if tail:
                    stop = self._take(st, tail, taken, ntok)
                if stop is None:
                    taken.append(st.hb.release())
        final = stop or seq_stop or fin
        if st.seqs and final is not None:
            out.append(st.seq_text)
            out.extend(taken)
            st.seq_text = ""
        before = int(self._ntok[st.sid])
        self._ntok[st.sid] = ntok
        self._mode[st.sid] = st.mode
        self._held[st.sid] = st.held
        text = "".join(out)
        ids = token_ids[:used]
        if st.interval > 1:
            if st.waiting is not None:
                w_text, w_ids, w_extras = st.waiting
                text, ids, extras = w_text + text, w_ids + ids, _merge_extras(w_extras, extras)
                st.waiting = None
            # Out at tokens 1, N + 1, 2N + 1...: when this step reaches the next such point.
            if final is None and (ntok - 1) // st.interval == (before - 1) // st.interval:
                st.waiting = (text, ids, extras)
                return
        fields = (st.rid, ids, final, prompt_tokens, text, ntok, extras, *counts)
        if final is None:
            item = Frame(*fields)
            if st.sink.try_send(item) is not None:
                self._blocked(st, item, None)
            return
        done = Done(*fields)
        self._forget(st)
        if st.sink.try_send(done) is not None:
            self._blocked(st, done, final, forgotten=True)
        if fin is None:
            self._engine_abort(st.rid)  # the engine did not stop it: a stop it does not know

    @staticmethod
    def _release(st: _Req, taken: list[str], out: list[str]) -> None:
        """Move the text that cannot belong to a stop token sequence from ``taken`` to ``out``."""
        text = st.seq_text + "".join(taken) if taken else st.seq_text
        taken.clear()
        keep = st.seq_hold() - len(st.held)
        if keep <= 0:
            out.append(text)
            st.seq_text = ""
        else:
            cut = max(len(text) - keep, 0)
            out.append(text[:cut])
            st.seq_text = text[cut:]

    def _take(self, st: _Req, piece: str, out: list[str], ntok: int) -> FinishReason | None:
        """Add one token's text: check stops, append what may be delivered to ``out``."""
        held = st.held
        window = held + piece if held else piece
        new_from = len(held)
        if ntok > st.min_new:
            best: tuple[int, int, int, str] | None = None  # (end, rank, cut, matched)
            for rank, s in enumerate(st.stops):
                if s in window:
                    p = window.find(s, max(0, new_from - len(s) + 1))
                    if p >= 0:
                        end = p + len(s)
                        cut = end if st.no_trim else p
                        if best is None or end < best[0]:
                            best = (end, rank, cut, s)
            if st.regexes:
                # Regex matches may start in text already delivered: search the recent text.
                rwindow = st.rtail + piece
                offset = len(st.rtail)  # rwindow[offset:] is the new text
                first = 1 if st.rtail_cut else 0  # rwindow[0] is context only, once cut
                for k, rx in enumerate(st.regexes):
                    m = _search_new(rx, rwindow, offset, first)
                    if m is not None:
                        # Positions relative to window: rwindow[offset] is window[new_from].
                        end = m[1] - offset + new_from
                        if best is None or end < best[0]:
                            best = (end, len(st.stops) + k, end, rx.pattern)
            if best is not None:
                out.append(window[: best[2]])
                st.hb.release()
                return FinishReason.stop(best[3])
        if st.regexes:
            joined = st.rtail + piece
            keep = st.rtail_keep
            if keep is not None and len(joined) > keep:
                joined = joined[-keep:]
                st.rtail_cut = True
            st.rtail = joined
        out.append(st.hold_back(window))
        return None

    def _decode_failed(self, st: _Req, exc: DecodeError, fin: FinishReason | None) -> None:
        self._forget(st)
        st.sink.send_final(Error(exc))
        if fin is None:
            self._engine_abort(st.rid)

    def _blocked(
        self,
        st: _Req,
        item: Frame | Done,
        fin: FinishReason | None,
        *,
        forgotten: bool = False,
    ) -> None:
        """``try_send`` did not deliver: merge into the pending item, or end the request."""
        sink = st.sink
        stall = self.max_stall
        if sink.closed:
            pass
        elif stall is not None and sink.idle_for(time.monotonic()) > stall:
            sink.abandon(
                Error(OverloadedError(f"the client has not read its stream for {stall:g} s"))
            )
        elif sink.merge_into_last(item, self.max_pending):
            return
        else:
            sink.send_final(
                Error(
                    OverloadedError(
                        f"more than {self.max_pending} characters and token ids are waiting for "
                        "this client: it reads slower than the engine writes"
                    )
                )
            )
        if not forgotten:
            self._forget(st)
            if fin is None:
                self._engine_abort(st.rid)


def _trims(st: _Req, fin: FinishReason, tokens: list[int]) -> bool:
    """Whether the step's last token is a stop token whose text is not delivered."""
    if st.no_trim or fin.kind != "stop" or not tokens:
        return False
    matched = fin.matched()
    if isinstance(matched, int) and not isinstance(matched, bool):
        return tokens[-1] == matched
    if isinstance(matched, list) and matched:
        return tokens[-1] == matched[-1]
    return False


def _merge_extras(old: Any, new: Any) -> Any:
    """Logprob/hidden-state extras of consecutive steps, as one item carries them."""
    if old is None:
        return new
    if new is None:
        return old
    return [*old, new] if isinstance(old, list) else [old, new]


def _engine_sequence(fin: FinishReason) -> list[int] | None:
    """The stop token sequence an engine reports having matched, if any."""
    matched = fin.matched()
    return matched if isinstance(matched, list) and matched else None


def _search_new(rx: Any, text: str, new_from: int, first: int = 0) -> tuple[int, int] | None:
    """The leftmost match of ``rx`` in ``text`` (starting at ``first`` or later: the text before
    is context) that ends inside ``text[new_from:]``, or right where it begins when the match is
    empty or needs the character after it (which only the new text has)."""
    pos = first
    edge = rx.needs_next
    while pos <= len(text):
        m = rx.search(text, pos)
        if m is None:
            return None
        if m[1] > new_from or (m[1] == new_from < len(text) and (edge or m[0] == m[1])):
            return m
        pos = m[0] + 1
    return None
