"""Per-request response channels: what the detok shard delivers and the HTTP handler drains.

``EgressSink`` is bounded and never blocks its producer: ``try_send`` answers at once with
``None`` (delivered), ``SinkError.FULL`` (the client reads slower than the engine writes) or
``SinkError.CLOSED`` (the client is gone). ``merge_into_last`` lets the producer fold a delta into
the newest undelivered item instead of queueing, so a slow client costs bounded memory. The
consumer side is awaitable; producer and consumer may run on different threads (the queue is a
``deque``, whose appends and pops are atomic, and wake-ups are handed to the consumer's event loop
in one batch per loop iteration).
"""

from __future__ import annotations

import asyncio
import enum
import threading
from collections import deque
from typing import Any

import msgspec

from tokenwire.messages.errors import ClientDisconnected, TokenwireError
from tokenwire.messages.finish_reason import FinishReason

__all__ = [
    "DEFAULT_SINK_CAPACITY",
    "ChunkEvent",
    "Control",
    "Done",
    "EgressItem",
    "EgressSink",
    "Error",
    "Frame",
    "SinkError",
]

#: Items a sink holds before ``try_send`` answers FULL.
DEFAULT_SINK_CAPACITY = 64


class ChunkEvent(msgspec.Struct, gc=False):
    """One delivery for one request: this step's ``text`` delta and ``token_ids``; the finish
    reason on the last one; ``completion_tokens`` so far; logprob/hidden-state ``extras`` if any;
    the engine's ``cached_tokens`` (prompt tokens from its prefix cache) and ``reasoning_tokens``
    (output tokens that are reasoning), when it reports them (on the last one at least)."""

    rid: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    prompt_tokens: int
    text: str
    completion_tokens: int
    extras: Any = None
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def event(self) -> ChunkEvent:
        """The chunk itself (``Frame`` and ``Done`` are chunk events that say which they are)."""
        return self


class Frame(ChunkEvent, gc=False):
    """An intermediate chunk: ``Frame(*fields)``, or ``Frame.of(event)``."""

    @classmethod
    def of(cls, event: ChunkEvent) -> Frame:
        return cls(*_fields(event))


class Done(ChunkEvent, gc=False):
    """The final chunk (it carries the finish reason): ``Done(*fields)``, or ``Done.of(event)``."""

    @classmethod
    def of(cls, event: ChunkEvent) -> Done:
        return cls(*_fields(event))


def _fields(event: ChunkEvent) -> tuple:
    return (
        event.rid,
        event.token_ids,
        event.finish_reason,
        event.prompt_tokens,
        event.text,
        event.completion_tokens,
        event.extras,
        event.cached_tokens,
        event.reasoning_tokens,
    )


class Control(msgspec.Struct, gc=False):
    """The passed-through result of a control request."""

    payload: bytes


class Error(msgspec.Struct, gc=False):
    """The request failed; nothing follows."""

    error: TokenwireError


EgressItem = Frame | Done | Control | Error


class SinkError(enum.Enum):
    """Why ``try_send`` did not deliver."""

    FULL = "full"
    CLOSED = "closed"

    def __str__(self) -> str:
        return self.value


class _Notifier:
    """Wakes waiting consumers of one event loop, in one loop callback per batch of wake-ups."""

    __slots__ = ("_pending", "_scheduled", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: list[asyncio.Future[None]] = []
        self._scheduled = False

    def notify(self, fut: asyncio.Future[None]) -> None:
        self._pending.append(fut)
        if not self._scheduled:
            self._scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._run)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                self._scheduled = False

    def _run(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        for fut in pending:
            if not fut.done():
                fut.set_result(None)


_notifiers: dict[asyncio.AbstractEventLoop, _Notifier] = {}
_notifiers_lock = threading.Lock()


def _notifier_for(loop: asyncio.AbstractEventLoop) -> _Notifier:
    notifier = _notifiers.get(loop)
    if notifier is None:
        with _notifiers_lock:
            notifier = _notifiers.get(loop)
            if notifier is None:
                for old in [lp for lp in _notifiers if lp.is_closed()]:
                    del _notifiers[old]
                notifier = _notifiers[loop] = _Notifier(loop)
    return notifier


class EgressSink:
    """A bounded, non-blocking channel of ``EgressItem``s for one request."""

    __slots__ = ("_closed", "_dq", "_ended", "_notifier", "_waiter", "capacity")

    def __init__(self, capacity: int = DEFAULT_SINK_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._dq: deque[Any] = deque()
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._notifier: _Notifier | None = None
        self._ended = False

    # ---- producer --------------------------------------------------------------------------------

    def try_send(self, item: Any) -> SinkError | None:
        """Deliver ``item`` now, or say why not (never blocks)."""
        if self._closed:
            return SinkError.CLOSED
        dq = self._dq
        if len(dq) >= self.capacity:
            return SinkError.FULL
        dq.append(item)
        if self._waiter is not None:
            self._wake()
        return None

    def send_final(self, item: Any) -> SinkError | None:
        """Deliver a terminal item even when the sink is full (one item past capacity)."""
        if self._closed:
            return SinkError.CLOSED
        self._dq.append(item)
        if self._waiter is not None:
            self._wake()
        return None

    def merge_into_last(self, item: Frame | Done, max_text: int) -> bool:
        """Fold ``item`` into the newest undelivered chunk (text and token ids concatenated, a
        ``Done`` replacing a ``Frame``); if the consumer took it meanwhile, queue ``item``.
        Returns False, delivering nothing, when the merged text would pass ``max_text``
        characters."""
        dq = self._dq
        try:
            last = dq.pop()  # atomic: from here on only the producer holds it
        except IndexError:
            dq.append(item)
            return True
        if not isinstance(last, (Frame, Done)):
            dq.append(last)
            dq.append(item)
            return True
        if len(last.text) + len(item.text) > max_text:
            dq.append(last)
            return False
        dq.append(
            type(item)(
                item.rid,
                last.token_ids + item.token_ids,
                item.finish_reason,
                item.prompt_tokens,
                last.text + item.text,
                item.completion_tokens,
                _merge_extras(last.extras, item.extras),
                item.cached_tokens,
                item.reasoning_tokens,
            )
        )
        if self._waiter is not None:
            self._wake()
        return True

    def _wake(self) -> None:
        waiter = self._waiter
        notifier = self._notifier
        if waiter is not None and notifier is not None:
            notifier.notify(waiter)

    # ---- consumer --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._dq)

    @property
    def closed(self) -> bool:
        """Whether the consumer has gone away."""
        return self._closed

    def close(self) -> None:
        """The consumer is gone: further sends answer CLOSED; undelivered items are dropped."""
        self._closed = True
        self._dq.clear()
        waiter = self._waiter
        if waiter is not None and self._notifier is not None:
            self._notifier.notify(waiter)

    def get_nowait(self) -> Any:
        """The next item; ``IndexError`` when none is waiting."""
        return self._dq.popleft()

    def drain(self) -> list[Any]:
        """Every item waiting now."""
        out = []
        dq = self._dq
        while dq:
            out.append(dq.popleft())
        return out

    async def get(self) -> Any:
        """The next item, waiting for it; ``ClientDisconnected`` once the sink is closed."""
        dq = self._dq
        while True:
            if dq:
                return dq.popleft()
            if self._closed:
                raise ClientDisconnected("the response channel is closed")
            notifier = self._notifier
            if notifier is None:
                notifier = self._notifier = _notifier_for(asyncio.get_running_loop())
            fut = notifier.loop.create_future()
            self._waiter = fut
            if dq or self._closed:  # the producer may have sent before it saw the waiter
                self._waiter = None
                continue
            try:
                await fut
            finally:
                self._waiter = None

    def __aiter__(self) -> EgressSink:
        return self

    async def __anext__(self) -> Any:
        """Items up to and including the final ``Done`` or ``Error``."""
        if self._ended:
            raise StopAsyncIteration
        item = await self.get()
        if isinstance(item, (Done, Error)):
            self._ended = True
        return item


def _merge_extras(old: Any, new: Any) -> Any:
    if old is None:
        return new
    if new is None:
        return old
    return [old, new] if not isinstance(old, list) else [*old, new]
