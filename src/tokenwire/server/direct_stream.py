"""A one-choice streamed response written from its sink's wake-up callback.

The general streaming loop (``streaming.stream``) runs a task per response that waits on its sink,
wakes for each decode step, formats the step's items and awaits an ASGI ``send``. Over
tokenwire's own connection protocol (which gives each request a ``BodyWriter``) a response with
one choice skips all of that: its sink calls ``DirectStream.on_items`` from the one loop callback
that wakes every stream of a step, which formats the waiting items and writes them to the
connection at once. The handler's task only waits for the end of the body, and sends the body's
last bytes (the final item's) with the response's end: one write, not two. After each write the
sink rests for the rest of the loop iteration (``EgressSink.rest``): while steps come back to
back, a stream writes about every other step, two steps' text at once, as a task woken per step
would; while the loop is idle, every step goes out as it comes.

Behaviour is the general loop's: the same bytes, in the same order; a closed sink (the client
went away) ends the wait with ``ClientDisconnected``; an error while formatting or writing ends
it with that error (the handler's guard answers it); while the connection's write buffer is
full nothing is taken from the sink, which then fills and lets the shard merge and, past its
bounds, end the request, as it does for a task that stops taking.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tokenwire.messages.egress import EgressSink
from tokenwire.messages.errors import ClientDisconnected
from tokenwire.server.serving import BodyWriter

__all__ = ["DirectStream"]


class DirectStream:
    """Writes ``sink``'s items, as ``streamer`` formats them, through ``body``; ``pending``
    (bytes due before the first items) goes out with the first write. ``wait`` returns once
    the streamer has closed every choice, with the bytes of that last batch of items, which it
    leaves unwritten: the caller sends them as the body's end."""

    __slots__ = ("_body", "_done", "_pending", "_resume", "_sink", "_streamer", "_tail")

    def __init__(self, sink: EgressSink, streamer: Any, body: BodyWriter, pending: bytes) -> None:
        self._sink = sink
        self._streamer = streamer
        self._body = body
        self._pending = pending
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._resume: asyncio.Future[None] | None = None
        self._tail = b""

    async def wait(self) -> bytes:
        """Stream until the streamer has closed every choice; the bytes still to send, as the
        body's end. ``ClientDisconnected`` if the sink closes first. (Cancelling the wait stops
        the writes.)"""
        self._sink.attach(self.on_items)
        try:
            self.on_items()  # items may wait already
            await self._done
            return self._tail
        finally:
            self._sink.detach()
            if self._resume is not None:
                self._resume.cancel()
            self._done.cancel()  # a late wake-up writes nothing

    def on_items(self) -> None:
        """Format and write every item waiting (the sink's callback, on the event loop). A
        failure ends the wait with it (the handler's guard answers it)."""
        done = self._done
        if done.done():
            return
        try:
            self._write_waiting()
        except Exception as exc:
            if not done.done():
                done.set_exception(exc)

    def _write_waiting(self) -> None:
        body = self._body
        if body.paused:
            if self._resume is None:
                self._resume = asyncio.ensure_future(self._when_drained())
            return
        sink = self._sink
        if not len(sink):
            if sink.closed:
                self._done.set_exception(ClientDisconnected("the response channel is closed"))
            return
        streamer = self._streamer
        steps = sink.take_steps() if getattr(streamer, "takes_steps", False) else None
        if steps is not None:
            data = streamer.feed_steps(steps)
            if len(sink):  # (an item another thread's producer merged meanwhile)
                data += streamer.feed([(0, item) for item in sink.drain()])
        else:
            data = streamer.feed([(0, item) for item in sink.drain()])
        if self._pending:
            data = self._pending + data
            self._pending = b""
        if not streamer.open:
            self._tail = data  # (the caller's end of the body carries it)
            self._done.set_result(None)
            return
        body.write(data)
        sink.rest()

    async def _when_drained(self) -> None:
        await self._body.drained()
        self._resume = None
        self.on_items()
