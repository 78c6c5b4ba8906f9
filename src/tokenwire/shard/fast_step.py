"""The one-token-per-request step, columnar: every request's token is batch-decoded, and stop
strings and the hold-back are step-wide: every request's held text and new text are joined into
one string, searched once for the stop strings and for ends that may start one, and only the
requests whose held text changes (or that may stop, or finish) take a Python path of their own;
the held text lives in a shard column (``_held``), and a request's own automaton catches up when
it takes the exact path (``GeneralStep._advance``). The rest share one ``StepChunks`` that every
sink queues."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from tokenwire.messages.egress import StepChunks
from tokenwire.messages.errors import DecodeError
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.shard.general_step import trims

__all__ = ["FastStep"]


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


class FastStep:
    """``DetokShard``'s columnar step (its columns ``_ntok``, ``_mode``, ``_held``, ``_gid``,
    ``_dslot``, ``_bidx``, and the step-wide stop tables)."""

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
            if fin is not None and trims(st, fin, id_list[j : j + 1]):
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
