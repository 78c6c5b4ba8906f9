"""Delivery of a request's items to its ``EgressSink``: a step's shared chunk queued in every
sink that has room; a sink that is full has the delta merged into its newest undelivered item
(bounded by ``max_pending`` characters and token ids together, past which the request ends; so
does a request whose client has taken nothing for ``max_stall`` seconds, and its sink is
abandoned); a closed sink ends the request. Both abort the request in the engine."""

from __future__ import annotations

import time

from tokenwire.messages.egress import Done, Error, Frame, StepChunks
from tokenwire.messages.errors import OverloadedError
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.shard.request import RequestState

__all__ = ["DEFAULT_MAX_PENDING", "DEFAULT_MAX_STALL", "Delivery"]

#: Characters plus token ids a request may have waiting for a slow client before it is ended.
DEFAULT_MAX_PENDING = 1 << 20
#: Seconds a client may take nothing from its full sink before its request is ended.
DEFAULT_MAX_STALL = 30.0


class Delivery:
    """``DetokShard``'s delivery to the sinks (its ``_sinks`` column, ``max_pending``,
    ``max_stall``)."""

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

    def _blocked(
        self,
        st: RequestState,
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
