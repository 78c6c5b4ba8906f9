"""``--sse-keep-alive-interval``: a streamed response silent for the interval is sent its API's
keep-alive bytes (``ErrorDialect.keep_alive``: an SSE comment, ``: keep-alive``; Anthropic's
``ping`` event), so that proxies with read timeouts do not close it while the request waits for a
place, for a long prefill, or for text a parser holds back (vLLM 0.33's flag).

One timer per stream, re-armed for the interval after the latest write: the chunks themselves go
through ``body`` or ``send`` wrapped here, which only note the time.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["KeepAlive"]


class _Body:
    """A ``BodyWriter`` whose writes are noted."""

    __slots__ = ("_body", "_keep")

    def __init__(self, body: Any, keep: KeepAlive) -> None:
        self._body = body
        self._keep = keep

    def serves(self, send: Any) -> bool:
        return bool(self._body.serves(send))

    @property
    def paused(self) -> bool:
        return bool(self._body.paused)

    def write(self, data: bytes) -> None:
        if data:
            self._keep.last = self._keep.loop.time()
        self._body.write(data)

    async def drained(self) -> None:
        await self._body.drained()


class KeepAlive:
    """Keeps one started SSE response alive: every ``interval`` seconds of silence, ``data``
    goes out through ``body`` (a ``BodyWriter``) when the response has one, else ``send``.
    ``stop`` before the response's last message."""

    def __init__(self, interval: float, data: bytes, send: Any, body: Any = None) -> None:
        self.interval = interval
        self.data = data
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self._send = send
        self._body = body
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = self.loop.call_later(interval, self._tick)
        #: Keep-alives sent (for tests).
        self.sent = 0

    def body(self, body: Any) -> _Body:
        """``body``, its writes noted."""
        return _Body(body, self)

    def send(self, send: Any) -> Any:
        """``send``, its body messages noted."""

        async def noted(message: dict) -> None:
            if message.get("body"):
                self.last = self.loop.time()
            await send(message)

        return noted

    def _tick(self) -> None:
        now = self.loop.time()
        due = self.last + self.interval
        if now >= due - 1e-3:
            body = self._body
            if body is not None:
                if not body.paused:  # (a client reading nothing needs no more bytes)
                    body.write(self.data)
                    self.sent += 1
            elif self._task is None or self._task.done():
                self._task = self.loop.create_task(self._send_one())
            self.last = now
            due = now + self.interval
        self._timer = self.loop.call_later(max(0.01, due - now), self._tick)

    async def _send_one(self) -> None:
        with contextlib.suppress(Exception):
            await self._send({"type": "http.response.body", "body": self.data, "more_body": True})
            self.sent += 1

    async def stop(self) -> None:
        """No more keep-alives (one being sent finishes first)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(Exception):
                await task
