"""Per-request response channels: what the detok shard delivers and the HTTP handler drains.

``EgressSink`` is bounded and never blocks its producer: ``try_send`` answers at once with
``None`` (delivered), ``SinkError.FULL`` (the client reads slower than the engine writes) or
``SinkError.CLOSED`` (the client is gone). ``merge_into_last`` lets the producer fold a delta into
the newest undelivered item instead of queueing (amortized O(1) per delta: the pieces are joined
once, when the consumer takes the item), so a slow client costs bounded memory and work;
``idle_for`` tells how long the consumer has not taken anything. A producer may queue one
``StepChunks`` (a decode step's chunks for many requests, in columns) in many sinks; each sink
turns it into its own ``Frame`` when its consumer takes it, so consumers only ever see
``Frame``, ``Done``, ``Control`` and ``Error``. The
consumer side is awaitable, or a callback (``attach``) that the consumer's event loop calls when
items arrive; producer and consumer may run on different threads (the queue is a ``deque``, whose
appends and pops are atomic, and wake-ups are handed to the consumer's event loop in one batch
per loop iteration).
"""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
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
    "StepChunks",
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


class StepChunks:
    """One decode step's intermediate chunks for many requests, in columns (``rids``,
    ``token_ids``, ``prompt_tokens``, ``texts``, ``completion_tokens``: one entry per request of
    the step). Every sink that takes part queues this one object instead of a ``Frame`` of its
    own; ``rows`` maps a sink's row (``EgressSink.row``, given by its producer) to its entry, and
    the sink hands its consumer ``chunk(row)``, a ``Frame``, when the consumer takes it. (A sink
    keeps at most its capacity of steps alive: a full sink merges into a ``Frame`` instead.)"""

    __slots__ = ("completion_tokens", "prompt_tokens", "rids", "rows", "texts", "token_ids")

    def __init__(
        self,
        rids: list[str],
        token_ids: list[int],
        prompt_tokens: list[int],
        texts: list[str],
        completion_tokens: list[int],
        rows: Sequence[int] | Mapping[int, int],
    ) -> None:
        self.rids = rids
        self.token_ids = token_ids
        self.prompt_tokens = prompt_tokens
        self.texts = texts
        self.completion_tokens = completion_tokens
        self.rows = rows

    def chunk(self, row: int) -> Frame:
        """The ``Frame`` of the request at ``row``: one token, no finish."""
        j = self.rows[row]
        return Frame(
            self.rids[j],
            [self.token_ids[j]],
            None,
            self.prompt_tokens[j],
            self.texts[j],
            self.completion_tokens[j],
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

    __slots__ = ("_held", "_pending", "_scheduled", "_thread", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: int | None = None) -> None:
        self.loop = loop
        #: The loop's thread: a producer there schedules without waking the loop (it runs).
        self._thread = threading.get_ident() if thread is None else thread
        self._pending: list[asyncio.Future[None] | _Callback] = []
        self._scheduled = False
        self._held: list[_Callback] = []  # callbacks resting until the next loop iteration

    def notify(self, fut: asyncio.Future[None] | _Callback) -> None:
        self._pending.append(fut)
        if not self._scheduled:
            self._scheduled = True
            try:
                if threading.get_ident() == self._thread:
                    self.loop.call_soon(self._run)  # (no write to the loop's wake-up pipe)
                else:
                    self.loop.call_soon_threadsafe(self._run)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                self._scheduled = False

    def _run(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        calls = []
        first = []
        for fut in pending:
            if type(fut) is _Callback:
                if not fut.queued:  # once, however many items came
                    fut.queued = True
                    if fut.fresh:
                        fut.fresh = False
                        first.append(fut)
                    else:
                        calls.append(fut)
            elif not fut.done():
                fut.set_result(None)
        if first:
            # A consumer's first wake-up is its response's first token: called now.
            self._call_each(first)
        if calls:
            # One loop iteration later, when a task woken here would run (more steps may come
            # meanwhile, and go out in the same write).
            self.loop.call_soon(self._call_each, calls)

    def _call_each(self, calls: list[_Callback]) -> None:
        for call in calls:
            call.queued = False
            fn = call.fn
            if fn is None:  # detached meanwhile
                continue
            sink = call.sink
            if sink._waiter is None and sink._callback is call:
                sink._waiter = call  # (called after resting: items wake it again)
            try:
                fn()
            except Exception as exc:  # one consumer's failure is not the others'
                self.loop.call_exception_handler(
                    {"message": "an egress sink's callback failed", "exception": exc}
                )

    def hold(self, call: _Callback) -> None:
        """Rest ``call`` (already out of its sink's waiter slot) until the next loop iteration;
        all of this iteration's in one loop callback."""
        if not self._held:
            self.loop.call_soon(self._release)
        self._held.append(call)

    def _release(self) -> None:
        held, self._held = self._held, []
        due = []
        for call in held:
            sink = call.sink
            if call.fn is None or sink._callback is not call:  # detached meanwhile
                continue
            sink._waiter = call  # armed before looking (a producer may be on another thread)
            if sink._dq or sink._closed:  # came while it rested: called next iteration
                sink._waiter = None
                if not call.queued:
                    call.queued = True
                    due.append(call)
        if due:
            self.loop.call_soon(self._call_each, due)


class _Callback:
    """A consumer that is called when items arrive (``EgressSink.attach``), where a task would
    wait for them: it stands in the sink's waiter slot, and ``_Notifier`` calls it."""

    __slots__ = ("fn", "fresh", "queued", "sink")

    def __init__(self, fn: Callable[[], None], sink: EgressSink) -> None:
        self.fn: Callable[[], None] | None = fn
        self.sink = sink
        self.queued = False  # a call is due
        self.fresh = True  # never woken yet


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
    notifier._thread = threading.get_ident()  # (called on the loop's thread, running)
    return notifier


class _Merged:
    """Deltas folded together while the consumer is behind: the newest chunk's fields, every
    piece of text and every token id, joined into one chunk when the consumer takes it."""

    __slots__ = ("extras", "ids", "last", "size", "texts")

    def __init__(self, first: Frame | Done) -> None:
        self.last = first
        self.texts = [first.text]
        self.ids = list(first.token_ids)
        self.extras = first.extras
        self.size = len(first.text) + len(first.token_ids)

    def add(self, item: Frame | Done) -> None:
        self.last = item
        self.texts.append(item.text)
        self.ids.extend(item.token_ids)
        self.extras = _merge_extras(self.extras, item.extras)
        self.size += len(item.text) + len(item.token_ids)

    def chunk(self) -> Frame | Done:
        last = self.last
        return type(last)(
            last.rid,
            self.ids,
            last.finish_reason,
            last.prompt_tokens,
            "".join(self.texts),
            last.completion_tokens,
            self.extras,
            last.cached_tokens,
            last.reasoning_tokens,
        )


def _taken(item: Any, row: int) -> Any:
    kind = type(item)
    if kind is StepChunks:
        return item.chunk(row)
    return item.chunk() if kind is _Merged else item


class EgressSink:
    """A bounded, non-blocking channel of ``EgressItem``s for one request."""

    __slots__ = (
        "_callback",
        "_closed",
        "_dq",
        "_ended",
        "_notifier",
        "_taken_at",
        "_waiter",
        "capacity",
        "on_abandon",
        "row",
    )

    def __init__(self, capacity: int = DEFAULT_SINK_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._dq: deque[Any] = deque()
        self._closed = False
        self._waiter: asyncio.Future[None] | _Callback | None = None
        self._callback: _Callback | None = None  # the consumer's, when it is one (``attach``)
        self._notifier: _Notifier | None = None
        self._ended = False
        self._taken_at = time.monotonic()
        #: Called (on the producer's thread) when the producer gives up on a consumer that has
        #: stopped taking items (``abandon``); the consumer's owner uses it to end the response.
        self.on_abandon: Any = None
        #: This sink's row in the ``StepChunks`` its producer queues (set by the producer).
        self.row = -1

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

    def merge_into_last(self, item: Frame | Done, max_pending: int) -> bool:
        """Fold ``item`` into the newest undelivered chunk (text and token ids concatenated, a
        ``Done`` replacing a ``Frame``); if the consumer took it meanwhile, queue ``item``.
        Returns False, delivering nothing, when the merged chunk would hold more than
        ``max_pending`` characters and token ids together."""
        dq = self._dq
        try:
            last = dq.pop()  # atomic: from here on only the producer holds it
        except IndexError:
            dq.append(item)
            return True
        if type(last) is StepChunks:
            last = last.chunk(self.row)
        if type(last) is _Merged:
            merged = last
        elif isinstance(last, (Frame, Done)):
            merged = _Merged(last)
        else:
            dq.append(last)
            dq.append(item)
            return True
        if merged.size + len(item.text) + len(item.token_ids) > max_pending:
            dq.append(last)
            return False
        merged.add(item)
        dq.append(merged)
        if self._waiter is not None:
            self._wake()
        return True

    def idle_for(self, now: float) -> float:
        """Seconds (of ``time.monotonic``) since the consumer last took an item; 0 while it is
        waiting for one."""
        waiter = self._waiter
        if waiter is not None and (type(waiter) is not _Callback or not self._dq):
            return 0.0
        return now - self._taken_at

    def abandon(self, item: Any) -> None:
        """The producer gives up on a consumer that has stopped taking items: ``item`` (an
        ``Error``) is its last, and ``on_abandon`` is told."""
        self.send_final(item)
        callback = self.on_abandon
        if callback is not None:
            self.on_abandon = None
            callback()

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

    def attach(self, callback: Callable[[], None]) -> None:
        """Have ``callback`` called on the running event loop after items arrive and when the
        sink closes (with the other sinks' wake-ups, in one loop callback), instead of a task
        waiting in ``take``; it takes the items with ``drain``. Items that wait already are the
        caller's to take. ``rest`` pauses the calls for a loop iteration, ``detach`` ends them."""
        if self._notifier is None:
            self._notifier = _notifier_for(asyncio.get_running_loop())
        self._callback = self._waiter = _Callback(callback, self)

    def rest(self) -> None:
        """Call the attached callback for nothing more that arrives in this loop iteration:
        what does is called for on the next one, together with what arrives then. (A consumer
        that writes what it takes thus writes about every other step while steps come every
        iteration, and every step as it comes while the loop is idle.)"""
        callback = self._callback
        if callback is not None and self._notifier is not None:
            if self._waiter is callback:
                self._waiter = None
            self._notifier.hold(callback)

    def detach(self) -> None:
        """Stop calling the callback given to ``attach`` (a call already due included)."""
        callback = self._callback
        if callback is not None:
            callback.fn = None
            if self._waiter is callback:
                self._waiter = None
            self._callback = None

    def take_steps(self) -> list[tuple[str, int, int]] | None:
        """Every item waiting, when all are steps' chunks (``StepChunks``: one token, no finish),
        as ``(text, token id, completion tokens)`` each, without a ``Frame`` apiece; None, with
        nothing taken, when another kind of item waits (or none does)."""
        dq = self._dq
        try:
            n = len(dq)
            if not n or any(type(item) is not StepChunks for item in dq):
                return None
        except RuntimeError:  # (a producer on another thread changed the queue meanwhile)
            return None
        row = self.row
        out = []
        for _ in range(n):
            item = dq.popleft()
            if type(item) is not StepChunks:  # (merged meanwhile by a producer elsewhere)
                dq.appendleft(item)
                break
            j = item.rows[row]
            out.append((item.texts[j], item.token_ids[j], item.completion_tokens[j]))
        self._taken_at = time.monotonic()
        return out

    def get_nowait(self) -> Any:
        """The next item; ``IndexError`` when none is waiting."""
        item = self._dq.popleft()
        self._taken_at = time.monotonic()
        return _taken(item, self.row)

    def drain(self) -> list[Any]:
        """Every item waiting now."""
        out = []
        dq = self._dq
        row = self.row
        while dq:
            item = dq.popleft()
            kind = type(item)
            if kind is StepChunks:
                item = item.chunk(row)
            elif kind is _Merged:
                item = item.chunk()
            out.append(item)
        self._taken_at = time.monotonic()
        return out

    async def _ready(self) -> None:
        """Wait until an item waits; ``ClientDisconnected`` once the sink is closed."""
        dq = self._dq
        while not dq:
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

    async def take(self) -> list[Any]:
        """Every item waiting, once there is one (waiting for it); ``ClientDisconnected`` once
        the sink is closed."""
        if not self._dq:
            await self._ready()
        return self.drain()

    async def get(self) -> Any:
        """The next item, waiting for it; ``ClientDisconnected`` once the sink is closed."""
        if not self._dq:
            await self._ready()
        return self.get_nowait()

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
