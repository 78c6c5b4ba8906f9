"""What vLLM's frontend counts from its engines' outputs besides the requests' own numbers, kept
per engine rank for ``/metrics``: the tokens of each engine step (``vllm:iteration_tokens_total``),
preemptions (``vllm:num_preemptions``), and the prefix cache's queries and hits from the
scheduler stats (``vllm:prefix_cache_queries`` / ``_hits``, which each step's stats carry as that
step's increments). Plain counters, updated from the output reader; read at scrape time."""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import Any

__all__ = ["ITERATION_TOKENS_BUCKETS", "RankStats"]

#: vLLM 0.32's buckets for ``vllm:iteration_tokens_total`` (``ITERATION_TOKENS_BUCKETS``).
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_BOUNDS = [*ITERATION_TOKENS_BUCKETS, float("inf")]
#: Scheduler stats kept undecoded before they are folded in (at a scrape, or past this many).
_MAX_PENDING = 1024


class RankStats:
    """One engine rank's counters."""

    __slots__ = (
        "created",
        "iteration_counts",
        "iteration_sum",
        "pending",
        "preemptions",
        "prefix_hits",
        "prefix_queries",
    )

    def __init__(self) -> None:
        self.created = time.time()
        self.iteration_counts = [0] * len(_BOUNDS)
        self.iteration_sum = 0
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        #: Steps' scheduler stats not folded in yet (decoding each step's would cost each step).
        self.pending: list[Any] = []

    def step(self, tokens: int) -> None:
        """One engine step that computed ``tokens`` (prompt tokens prefilled, tokens made)."""
        self.iteration_counts[bisect_left(_BOUNDS, tokens)] += 1
        self.iteration_sum += tokens

    def scheduler_stats(self, raw: Any, increments: Any) -> None:
        """One step's scheduler stats (undecoded; ``increments`` reads their prefix cache
        ``(queries, hits)`` when they are folded)."""
        self.pending.append(raw)
        if len(self.pending) >= _MAX_PENDING:
            self.fold(increments)

    def fold(self, increments: Any) -> None:
        """Add the pending steps' prefix cache increments."""
        pending, self.pending = self.pending, []
        for raw in pending:
            q, h = increments(raw)
            self.prefix_queries += q
            self.prefix_hits += h

    def iteration_buckets(self) -> list[tuple[str, int]]:
        """Cumulative ``(le, count)`` pairs, Prometheus's histogram buckets."""
        out, total = [], 0
        for bound, n in zip(_BOUNDS, self.iteration_counts):
            total += n
            out.append(("+Inf" if bound == float("inf") else str(float(bound)), total))
        return out
