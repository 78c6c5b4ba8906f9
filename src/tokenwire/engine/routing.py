"""Which of several engines takes a request (no I/O).

Policies (``--routing``):

- ``fewest``: the engine with the fewest requests in flight (vLLM's rule for data parallelism);
- ``round-robin``: each engine in turn;
- ``prefix``: the engine that holds the longest cached prefix of the request's prompt among those
  whose load (requests in flight) exceeds the least loaded engine's by at most
  ``balance_threshold``: the engine with the longest prefix takes it unless it is past the bound,
  when the best of the others does (smg's cache-aware policy, whose load check is global; ties
  go to the less loaded engine, then to the one holding fewer blocks: it has room). A prompt no
  engine holds any of goes to the least loaded engine.

What each engine holds is ``PrefixIndex``'s: block keys (the engine's own block hashes, as its
KV-cache events name them) stored and removed as the engine reports them (exact), and, for an
engine that reports nothing, the blocks of the prompts sent to it, forgotten least recently used
first past the engine's capacity (approximate). An engine with events also counts the blocks of
prompts just sent to it for a few seconds, until its events say what it stored: a burst of
requests with a new shared prefix goes to one engine, not to all of them.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["ROUTING_POLICIES", "PrefixIndex", "Router", "RoutingConfig"]

ROUTING_POLICIES = ("prefix", "fewest", "round-robin")
#: Seconds the blocks of a prompt just sent to an engine with events count as held there.
SPECULATIVE_TTL = 10.0
#: Approximate entries kept per engine when it did not say its capacity.
DEFAULT_CAPACITY = 1 << 16


@dataclass(frozen=True)
class RoutingConfig:
    """``--routing``, ``--routing-balance-threshold`` and how the engines hash blocks."""

    policy: str = "prefix"
    balance_threshold: int = 32
    hash_algo: str = "sha256"

    def __post_init__(self) -> None:
        if self.policy not in ROUTING_POLICIES:
            raise ValueError(f"routing must be one of {', '.join(ROUTING_POLICIES)}")
        if self.balance_threshold < 0:
            raise ValueError("the routing balance threshold must be 0 or more")


class _Engine:
    __slots__ = ("approx", "capacity", "exact", "recent")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        #: Blocks the engine said it stored (None: it does not publish events).
        self.exact: set[int] | None = None
        #: Approximate: blocks sent to it, least recently used first.
        self.approx: OrderedDict[int, None] = OrderedDict()
        #: With events: blocks just sent to it -> until when they count.
        self.recent: dict[int, float] = {}


class PrefixIndex:
    """Which block keys each engine holds; see the module docstring."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._engines: dict[int, _Engine] = {}
        self._clock = clock

    def _engine(self, rank: int) -> _Engine:
        e = self._engines.get(rank)
        if e is None:
            e = self._engines[rank] = _Engine(DEFAULT_CAPACITY)
        return e

    def set_capacity(self, rank: int, blocks: int | None) -> None:
        """The engine's KV cache size in blocks (bounds its approximate entries)."""
        e = self._engine(rank)
        e.capacity = max(1, blocks) if blocks else DEFAULT_CAPACITY
        while len(e.approx) > e.capacity:
            e.approx.popitem(last=False)

    def exact(self, rank: int) -> bool:
        """Whether the engine's blocks are known from its events."""
        return self._engine(rank).exact is not None

    def use_events(self, rank: int) -> None:
        """From now on the engine's events say what it holds (what was guessed is dropped)."""
        e = self._engine(rank)
        if e.exact is None:
            e.exact = set()
            e.approx.clear()

    def drop_events(self, rank: int) -> None:
        """The engine's events can no longer be trusted: back to guessing, from nothing."""
        e = self._engine(rank)
        e.exact = None
        e.recent.clear()

    def stored(self, rank: int, keys: Sequence[int]) -> None:
        e = self._engine(rank)
        if e.exact is None:
            return
        e.exact.update(keys)
        if e.recent:
            for k in keys:
                e.recent.pop(k, None)

    def removed(self, rank: int, keys: Sequence[int]) -> None:
        e = self._engine(rank)
        if e.exact is not None:
            e.exact.difference_update(keys)
            for k in keys:
                e.recent.pop(k, None)

    def cleared(self, rank: int) -> None:
        """The engine's cache is empty (it was reset, or it restarted)."""
        e = self._engine(rank)
        if e.exact is not None:
            e.exact.clear()
        e.recent.clear()
        e.approx.clear()

    def forget(self, rank: int) -> None:
        self._engines.pop(rank, None)

    def sent(self, rank: int, keys: Sequence[int]) -> None:
        """A prompt with these blocks went to the engine."""
        if not keys:
            return
        e = self._engine(rank)
        if e.exact is not None:
            until = self._clock() + SPECULATIVE_TTL
            recent = e.recent
            for k in keys:
                if k not in e.exact:
                    recent[k] = until
            if len(recent) > e.capacity:
                self._expire(e, force=True)
            return
        approx = e.approx
        for k in keys:
            if k in approx:
                approx.move_to_end(k)
            else:
                approx[k] = None
        while len(approx) > e.capacity:
            approx.popitem(last=False)

    def match(self, rank: int, keys: Sequence[int]) -> int:
        """How many leading blocks of ``keys`` the engine holds."""
        e = self._engines.get(rank)
        if e is None:
            return 0
        n = 0
        if e.exact is not None:
            exact, recent = e.exact, e.recent
            if recent:
                self._expire(e)
            for k in keys:
                if k not in exact and k not in recent:
                    break
                n += 1
            return n
        approx = e.approx
        for k in keys:
            if k not in approx:
                break
            n += 1
        return n

    def size(self, rank: int) -> int:
        """Blocks the engine is taken to hold."""
        e = self._engines.get(rank)
        if e is None:
            return 0
        return len(e.exact) + len(e.recent) if e.exact is not None else len(e.approx)

    def _expire(self, e: _Engine, *, force: bool = False) -> None:
        now = self._clock()
        stale = [k for k, until in e.recent.items() if until <= now]
        for k in stale:
            del e.recent[k]
        if force and len(e.recent) > e.capacity:
            for k in list(e.recent)[: len(e.recent) - e.capacity]:
                del e.recent[k]


class Router:
    """Picks an engine for each request under one policy (``RoutingConfig``)."""

    def __init__(self, config: RoutingConfig, index: PrefixIndex | None = None) -> None:
        self.config = config
        self.index = index or PrefixIndex()
        self._turn = itertools.count()
        #: Requests routed by cache affinity, to the least loaded engine for balance, and with
        #: no engine holding any of their prompt (for tests and /metrics).
        self.decisions = {"cache": 0, "balance": 0, "cold": 0}

    @property
    def uses_prefixes(self) -> bool:
        return self.config.policy == "prefix"

    def pick(self, loads: Sequence[tuple[int, int]], keys: Sequence[int] | None = None) -> int:
        """The rank to send a request to, among ``loads`` (``(rank, requests in flight)``
        each, at least one), given its prompt's block ``keys`` (prefix routing)."""
        if len(loads) == 1:
            rank = loads[0][0]
        elif self.config.policy == "round-robin":
            rank = loads[next(self._turn) % len(loads)][0]
        elif self.config.policy == "fewest" or not keys:
            rank = min(loads, key=lambda rl: rl[1])[0]
        else:
            rank = self._by_prefix(loads, keys)
        if keys and self.uses_prefixes:
            self.index.sent(rank, keys)
        return rank

    def _by_prefix(self, loads: Sequence[tuple[int, int]], keys: Sequence[int]) -> int:
        index = self.index
        bound = min(load for _, load in loads) + self.config.balance_threshold
        best_rank, best_score = -1, (-1, 0, 0)
        overloaded_match = 0  # the longest match of an engine past the bound
        for rank, load in loads:
            matched = index.match(rank, keys)
            if load > bound:
                overloaded_match = max(overloaded_match, matched)
                continue
            # more cached blocks, then less load, then fewer blocks held (room for more)
            score = (matched, -load, -index.size(rank))
            if score > best_score:
                best_rank, best_score = rank, score
        if overloaded_match > best_score[0]:
            self.decisions["balance"] += 1
        elif best_score[0] == 0:
            self.decisions["cold"] += 1
        else:
            self.decisions["cache"] += 1
        return best_rank
