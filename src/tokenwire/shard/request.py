"""One request's egress state in the shard: its sink and decode slot, its stop strings with the
text held back for them, its stop regexes' recent text, its stop token sequences, and what waits
for its next ``stream_interval`` point (its token count lives in the shard's ``_ntok`` column)."""

from __future__ import annotations

from typing import Any

from tokenwire.detok.batch import DecodeBatch
from tokenwire.messages.egress import EgressSink
from tokenwire.messages.regex import UNBOUNDED
from tokenwire.messages.sampling import SamplingParams
from tokenwire.shard.holdback import HoldBack
from tokenwire.shard.stop_sequences import StopTokenSequences

__all__ = ["RequestState", "as_list"]


class RequestState:
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
        "sequences",
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
        stops = params.stop_strs if params.stop_strs is not None else as_list(params.stop)
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
        seqs = params.stop_token_sequences
        #: Stop token sequences matched here (None: the request has none).
        self.sequences = StopTokenSequences(seqs) if seqs else None
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
        return 2 if self.regexes or self.sequences or self.interval > 1 else 1 if self.held else 0


def as_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)
