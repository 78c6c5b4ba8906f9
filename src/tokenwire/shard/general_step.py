"""Any step, request by request (several tokens each, logprob or hidden-state extras, and the
requests the columnar step hands over): per token in order, a token-level stop's text trimmed,
stop token sequences, stop strings past ``min_new_tokens`` (the earliest-completing match that
includes new text wins, ties in list order), stop regexes (RE2) over the window their
``max_len`` needs, the hold-back, the engine's own finish with whatever is still held, and
``stream_interval``'s points."""

from __future__ import annotations

from typing import Any

from tokenwire.messages.egress import Done, Error, Frame
from tokenwire.messages.errors import DecodeError
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.messages.frames import Decoded
from tokenwire.shard.request import RequestState
from tokenwire.shard.stop_sequences import engine_sequence

__all__ = ["GeneralStep", "trims"]


class GeneralStep:
    """``DetokShard``'s request-by-request step."""

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
            decode_ids = tokens[:-1] if fin is not None and trims(st, fin, tokens) else tokens
            pieces: list[str] = []
            try:
                st.batch.push_into(st.slot, decode_ids, pieces)
            except DecodeError as exc:
                # Tokens before the bad one still count and their text is delivered.
                if pieces:
                    self._advance(st, pieces, tokens[: len(pieces)], None, prompt[j], None)
                if st.rid in reqs:
                    self._decode_failed(st, exc, fin)
            else:
                pieces += [""] * (len(tokens) - len(decode_ids))
                self._advance(
                    st, pieces, tokens, fin, prompt[j], decoded.extras_at(j), decoded.counts_at(j)
                )

    def _advance(
        self,
        st: RequestState,
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
        seqs = st.sequences
        taken: list[str] = [] if seqs is not None else out
        used = 0
        ntok = int(self._ntok[st.sid])
        stop: FinishReason | None = None  # a stop string or regex
        seq_stop: FinishReason | None = None  # a stop token sequence
        drop = -1  # tokens before the last whose text a matched sequence drops
        last = len(pieces) - 1
        if last and seqs is None and not st.regexes and (ntok >= st.min_new or not st.stops):
            # Several tokens and no stop string in their text: one hold-back over it all (the
            # hold-back's automata run character by character, so the held text is the one
            # token by token gives); a stop string in the window takes the exact way below.
            joined = "".join(pieces)
            held = st.held
            window = held + joined if held else joined
            if not any(s in window for s in st.stops):
                ntok += len(pieces)
                used = len(pieces)
                if joined:
                    taken.append(st.hold_back(window))
                pieces = []
        for k, piece in enumerate(pieces):
            ntok += 1
            used += 1
            if seqs is not None:
                seq = seqs.push(token_ids[k], len(piece), ntok > st.min_new)
                if seq is None and k == last and fin is not None:
                    seq = engine_sequence(fin)
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
            if seqs is not None:
                seqs.release(taken, out, len(st.held))
        if stop is None and (seq_stop is not None or fin is not None):
            if drop >= 0:
                # The sequence's text goes, with the decoder's incomplete bytes (theirs too).
                assert seqs is not None
                whole = seqs.text + "".join(taken) + st.hb.release()
                taken[:] = [whole[: max(len(whole) - seqs.chars(drop), 0)]]
                seqs.text = ""
            else:
                # The request is over: whatever the decoder still holds, then everything held.
                tail = st.batch.flush(st.slot)
                if tail:
                    stop = self._take(st, tail, taken, ntok)
                if stop is None:
                    taken.append(st.hb.release())
        final = stop or seq_stop or fin
        if seqs is not None and final is not None:
            out.append(seqs.text)
            out.extend(taken)
            seqs.text = ""
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

    def _take(self, st: RequestState, piece: str, out: list[str], ntok: int) -> FinishReason | None:
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

    def _decode_failed(self, st: RequestState, exc: DecodeError, fin: FinishReason | None) -> None:
        self._forget(st)
        st.sink.send_final(Error(exc))
        if fin is None:
            self._engine_abort(st.rid)


def trims(st: RequestState, fin: FinishReason, tokens: list[int]) -> bool:
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
