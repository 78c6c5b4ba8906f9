"""Admission: a bounded waiting queue in front of the engines.

A request needs one place per choice (its engine requests); the server has
``--max-concurrent-requests`` places. A request that finds room (and nobody waiting) goes in at
once; otherwise it waits, and waiting requests are let in lowest ``priority`` first (vLLM's
sense: lower is sooner), then in arrival order, as places free up. At most
``--max-waiting-requests`` wait: past that a request gets 429, unless it is more urgent than the
least urgent request waiting, which it then displaces (that one gets the 429). A request that
waits longer than ``--queue-timeout`` gets 503 with ``Retry-After``; one whose client leaves
while it waits just leaves the queue. A place handed to a waiting request is held for it until it
is submitted (``entered``), so no newcomer takes it meanwhile.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenwire.messages.errors import (
    ClientDisconnected,
    OverloadedError,
    QueueTimeoutError,
    TokenwireError,
)

__all__ = ["Admission"]


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    cost: int = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)
    since: float = field(compare=False)
    #: Left the queue (answered, timed out, gone): skipped when it comes up.
    done: bool = field(default=False, compare=False)


class Admission:
    """The queue; see the module docstring. ``in_flight()`` says how many places are taken by
    requests submitted already."""

    def __init__(
        self,
        capacity: int,
        in_flight: Callable[[], int],
        *,
        max_waiting: int = 0,
        timeout: float | None = None,
    ) -> None:
        self.capacity = capacity
        self.max_waiting = max_waiting
        self.timeout = timeout or None
        self._in_flight = in_flight
        #: Places handed to requests not submitted yet.
        self.reserved = 0
        self._heap: list[_Waiter] = []
        self._seq = itertools.count()
        #: Requests waiting now.
        self.waiting = 0
        #: Seconds each admitted request waited (observer, for metrics).
        self.on_wait: Callable[[float], None] | None = None
        #: Requests refused, by why (``queue_full``, ``queue_timeout``).
        self.refused: dict[str, int] = {"queue_full": 0, "queue_timeout": 0}

    def room(self) -> int:
        """Places free now."""
        return self.capacity - self._in_flight() - self.reserved

    async def enter(
        self, cost: int, priority: int = 0, gone: asyncio.Future[None] | None = None
    ) -> None:
        """Hold ``cost`` places for a request (waiting for them if need be); ``entered`` must
        follow, once it is submitted or given up. ``OverloadedError`` (429) when it cannot
        wait, ``QueueTimeoutError`` (503) when it waited too long, ``ClientDisconnected`` when
        ``gone`` (its client's disconnect) comes first."""
        if cost > self.capacity:
            raise OverloadedError(
                f"the request needs {cost} engine requests at once, more than this server runs "
                f"(--max-concurrent-requests {self.capacity})"
            )
        if not self.waiting and self.room() >= cost:
            self.reserved += cost
            self._observe(0.0)
            return
        if self.max_waiting <= 0:
            self.refused["queue_full"] += 1
            raise OverloadedError(
                f"too many requests in flight (limit {self.capacity}, no waiting queue)"
            )
        seq = next(self._seq)
        if self.waiting >= self.max_waiting:
            self._displace(priority, seq)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(priority, seq, cost, loop.create_future(), time.monotonic())
        heapq.heappush(self._heap, waiter)
        self.waiting += 1
        try:
            await self._wait(waiter, gone)
        except BaseException:
            if not waiter.done:
                waiter.done = True
                self.waiting -= 1
            elif (
                waiter.future.done()
                and not waiter.future.cancelled()
                and waiter.future.exception() is None
            ):
                self.reserved -= cost  # (granted, then given up)
            self.poke()
            raise
        self._observe(time.monotonic() - waiter.since)

    async def _wait(self, waiter: _Waiter, gone: asyncio.Future[None] | None) -> None:
        waits: set[asyncio.Future[None]] = {waiter.future}
        if gone is not None:
            waits.add(gone)
        done, _ = await asyncio.wait(
            waits, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter.future in done:
            waiter.future.result()  # (raises what displaced it)
            if gone is not None and gone in done:
                raise ClientDisconnected("the client went away while its request waited")
            return
        if gone is not None and gone in done:
            raise ClientDisconnected("the client went away while its request waited")
        self.refused["queue_timeout"] += 1
        assert self.timeout is not None
        raise QueueTimeoutError(
            f"the request waited {self.timeout:g} s for a place (--queue-timeout) and was not "
            "served: try again later",
            retry_after=self.timeout,
        )

    def entered(self, cost: int) -> None:
        """A request holding ``cost`` places was submitted (its places now count in flight), or
        gave up without being submitted."""
        self.reserved -= cost
        self.poke()

    def poke(self) -> None:
        """Let waiting requests in while there is room (call when places may have freed)."""
        heap = self._heap
        while heap:
            top = heap[0]
            if top.done:
                heapq.heappop(heap)
                continue
            if self.room() < top.cost:
                return
            heapq.heappop(heap)
            top.done = True
            self.waiting -= 1
            self.reserved += top.cost
            top.future.set_result(None)

    def fail_all(self, error: TokenwireError) -> None:
        """Every waiting request ends with ``error`` (no engine left, shutting down)."""
        for waiter in self._heap:
            if not waiter.done:
                waiter.done = True
                self.waiting -= 1
                waiter.future.set_exception(error)
        self._heap.clear()

    def _displace(self, priority: int, seq: int) -> None:
        """The queue is full: the least urgent waiter (the latest of the lowest priority) makes
        room if the newcomer is more urgent, else the newcomer is refused."""
        worst = max((w for w in self._heap if not w.done), default=None)
        self.refused["queue_full"] += 1
        if worst is None or (priority, seq) >= (worst.priority, worst.seq):
            raise OverloadedError(
                f"the server is busy: {self.waiting} requests are waiting already "
                "(--max-waiting-requests)"
            )
        worst.done = True
        self.waiting -= 1
        worst.future.set_exception(
            OverloadedError(
                "the server is busy: a more urgent request took this request's place in the "
                "waiting queue (--max-waiting-requests)"
            )
        )

    def _observe(self, seconds: float) -> None:
        if self.on_wait is not None:
            self.on_wait(seconds)
