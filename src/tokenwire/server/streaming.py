"""What every API's responses share: the choices of one request (``Subs``: engine request id,
prompt index and sink each) read as their items come, a streamed response sent from a
``Streamer`` (the dialect's formatter), a whole response gathered, and a client that goes away or
stops reading ending every choice, everywhere."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tokenwire.messages.egress import Done, EgressSink, Error
from tokenwire.messages.errors import ClientDisconnected, TokenwireError
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.runtime import Plan, Runtime
from tokenwire.runtime.metrics import EngineSeries
from tokenwire.server import limits
from tokenwire.server.access_log import STREAM_ERROR
from tokenwire.server.admit import admit, release
from tokenwire.server.direct_stream import DirectStream
from tokenwire.server.errors import OPENAI_ERRORS, ErrorDialect
from tokenwire.server.guard import direct
from tokenwire.server.http import (
    SSE,
    current_scope,
    disconnected,
    encode,
    respond,
    send_error,
)
from tokenwire.server.keepalive import KeepAlive
from tokenwire.server.observe import RequestRecord, current_record
from tokenwire.server.security import client_key
from tokenwire.server.serving import BODY_WRITER, BodyWriter

__all__ = [
    "Gathered",
    "Streamer",
    "Subs",
    "Tracker",
    "collect",
    "count_finish",
    "gather",
    "log_failure",
    "matched_stop",
    "merged",
    "serve_plan",
    "stream",
    "watch",
]

log = logging.getLogger("tokenwire.server")

Subs = list[tuple[str, int, EgressSink]]


async def merged(subs: list[tuple[str, int, EgressSink]]) -> AsyncIterator[list[tuple[int, Any]]]:
    """Items of several sinks as they come, in batches (everything waiting at each wake-up):
    ``(choice index, item)`` pairs; ends when every choice has had its final item."""
    if len(subs) == 1:
        sink = subs[0][2]
        while True:
            batch = [(0, item) for item in await sink.take()]
            yield batch
            if isinstance(batch[-1][1], (Done, Error)):
                return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue(maxsize=2 * len(subs))

    async def pump(index: int, sink: EgressSink) -> None:
        try:
            while True:
                item = await sink.get()
                await queue.put((index, item))
                if isinstance(item, (Done, Error)):
                    return
        except ClientDisconnected:
            await queue.put((index, None))

    tasks = [asyncio.ensure_future(pump(k, s)) for k, (_, _, s) in enumerate(subs)]
    try:
        remaining = len(subs)
        while remaining:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            for _index, item in batch:
                if item is None:
                    raise ClientDisconnected("the response channel is closed")
                if isinstance(item, (Done, Error)):
                    remaining -= 1
            yield batch
    finally:
        for t in tasks:
            t.cancel()


def end_when_abandoned(subs: Subs) -> list[bool]:
    """Cancel the current task when the shard abandons one of ``subs``' sinks (the client has
    stopped reading); the returned list is non-empty once that happened."""
    task = asyncio.current_task()
    hit: list[bool] = []

    def end() -> None:
        if not hit and task is not None:
            hit.append(True)
            task.cancel()

    for _, _, sink in subs:
        sink.on_abandon = end
    return hit


#: When the generation request being handled arrived (``perf_counter``), for its latencies.
received: contextvars.ContextVar[float] = contextvars.ContextVar("tokenwire_received", default=0.0)


class Tracker:
    """One request's latency metrics, on the series of the engine that has its first choice;
    ``record`` is its ``RequestRecord`` when tracing or request logging is on (else None)."""

    __slots__ = ("first", "last", "record", "series", "start")

    def __init__(
        self, series: EngineSeries, start: float = 0.0, record: RequestRecord | None = None
    ) -> None:
        self.series = series
        self.start = start or time.perf_counter()
        self.first = True
        self.last = self.start
        self.record = record

    @classmethod
    def of(cls, rt: Runtime, subs: Subs) -> Tracker:
        """The tracker of the request being handled, whose choices are ``subs``."""
        series = rt.metrics.engine(rt.engine_of(subs[0][0]) if subs else 0)
        return cls(series, received.get(), current_record.get())

    def chunk(self) -> None:
        now = time.perf_counter()
        if self.first:
            self.series.ttft.observe(now - self.start)
            self.first = False
            if self.record is not None:
                self.record.first_chunk = now
        else:
            self.series.itl.observe(now - self.last)
        self.last = now

    def ended(self) -> None:
        """The response is complete (end to end latency)."""
        self.series.e2e.observe(time.perf_counter() - self.start)


def body_writer(send: Any) -> BodyWriter | None:
    """The request's ``BodyWriter``, when its connection gives one that may bypass ``send``."""
    scope = current_scope.get()
    body = scope.get("extensions", {}).get(BODY_WRITER) if scope is not None else None
    return body if body is not None and body.serves(send) else None


def watch(
    rt: Runtime, receive: Any, subs: Subs, gone: asyncio.Future[None] | None = None
) -> asyncio.Future[None]:
    """Abort every choice the moment the client disconnects (``gone``: the disconnect already
    watched)."""
    if gone is None:
        gone = disconnected(receive)

    def on_gone(fut: asyncio.Future[None]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            for rid, _, sink in subs:
                rt.abort(rid, sink)

    gone.add_done_callback(on_gone)
    return gone


async def stream(
    rt: Runtime,
    receive: Any,
    send: Any,
    streamer: Streamer,
    route: str,
    *,
    gone: asyncio.Future[None] | None = None,
    started: bool = False,
    keep_alive: float = 0.0,
) -> None:
    """Send a streamed response: ``streamer``'s bytes for its choices' items as they come, until
    every choice has ended, the client has gone or stopped reading (``started``: its start was
    sent already; ``keep_alive``: seconds of silence before its API's keep-alive bytes)."""
    subs = streamer.subs
    gone = watch(rt, receive, subs, gone)
    abandoned = end_when_abandoned(subs)
    alive: KeepAlive | None = None
    tail = b""  # the body's last bytes, sent with its end
    try:
        if not started:
            await send({"type": "http.response.start", "status": 200, "headers": SSE})
        # Mid-stream chunks skip the wrappers that only look at the start and the end.
        write = direct(send)
        pending = streamer.head()
        body = body_writer(write)
        if keep_alive > 0:
            alive = KeepAlive(keep_alive, streamer.dialect.keep_alive, write, body)
            write = alive.send(write)
            if body is not None:
                body = alive.body(body)  # type: ignore[assignment]
        if len(subs) == 1 and body is not None:
            # One choice over tokenwire's connection protocol (the common case): written from
            # the sink's wake-up, without a task wake-up and a send per step.
            tail = await DirectStream(subs[0][2], streamer, body, pending).wait()
        elif len(subs) == 1:
            # One choice: wait on its sink directly.
            sink = subs[0][2]
            while streamer.open:
                data = streamer.feed([(0, item) for item in await sink.take()])
                if pending:
                    data = pending + data
                    pending = b""
                if not streamer.open:
                    tail = data
                elif data:
                    await write({"type": "http.response.body", "body": data, "more_body": True})
        else:
            batches = merged(subs)
            try:
                async for batch in batches:
                    data = pending + streamer.feed(batch)
                    pending = b""
                    if not streamer.open:
                        tail = data
                        break
                    if data:
                        await write({"type": "http.response.body", "body": data, "more_body": True})
            finally:
                await batches.aclose()
        if alive is not None:
            await alive.stop()
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        # A stream that ended in an error event counts as that error's status.
        failed = streamer.failed
        rt.metrics.requests.labels(route, str(failed.status if failed else 200)).inc()
        if failed is None:
            streamer.tracker.ended()
    except ClientDisconnected:
        rt.metrics.requests.labels(route, "499").inc()
        streamer.tracker.series.finished("abort")
    except asyncio.CancelledError:
        if not abandoned:
            raise
        # The client stopped reading (its request is already ended): returning with the
        # response incomplete makes the server close the connection.
        log.warning("%s: the client stopped reading its stream; closing it", route)
        rt.metrics.requests.labels(route, "429").inc()
        rt.metrics.request_errors.labels("client_stalled").inc()
    finally:
        if alive is not None:
            await alive.stop()
        gone.cancel()
        streamer.close()


async def collect(
    rt: Runtime,
    receive: Any,
    send: Any,
    subs: Subs,
    work: Any,
    route: str,
    *,
    gone: asyncio.Future[None] | None = None,
) -> None:
    """Send a whole JSON response: ``work`` (gathering the choices' items) gives its status and
    body; the client going away ends every choice."""
    gone = watch(rt, receive, subs, gone)
    start = received.get() or time.perf_counter()
    series = rt.metrics.engine(rt.engine_of(subs[0][0]) if subs else 0)
    try:
        status, body = await work
    except ClientDisconnected:
        rt.metrics.requests.labels(route, "499").inc()
        series.finished("abort")
        return
    except BaseException:
        # Whatever ends the request here ends it everywhere (the guard answers the client).
        for rid, _, sink in subs:
            rt.abort(rid, sink)
        raise
    finally:
        gone.cancel()
        rt.finished()
    rt.metrics.requests.labels(route, str(status)).inc()
    if status == 200:
        series.e2e.observe(time.perf_counter() - start)
    await respond(send, status, encode(body))


async def gather(
    rt: Runtime, subs: Subs, dialect: ErrorDialect = OPENAI_ERRORS
) -> tuple[int, Any] | Gathered:
    """Every choice's items until its final one; an error ends everything (its status, and its
    body in ``dialect``)."""
    got = Gathered(len(subs))
    tracker = Tracker.of(rt, subs)
    async for batch in merged(subs):
        tracker.chunk()
        for index, item in batch:
            if isinstance(item, Error):
                for rid, _, sink in subs:
                    rt.abort(rid, sink)
                rt.metrics.request_errors.labels(item.error.error_type).inc()
                log_failure(subs, item.error)
                return item.error.status, dialect.body(item.error)
            got.texts[index].append(item.text)
            got.ids[index].extend(item.token_ids)
            if item.extras is not None:
                got.extras[index].append(item.extras)
            if isinstance(item, Done):
                got.finals[index] = item
                text = "".join(got.texts[index]) if tracker.record is not None else None
                count_finish(rt, item, tracker, text)
    return got


def log_failure(subs: Subs, err: TokenwireError, scope: dict | None = None) -> None:
    """A request that ended in an error, in the server's log with its request ids and the
    reason; a stream's error status goes to the access log too (``scope``)."""
    rids = ", ".join(rid for rid, _, _ in subs[:4]) + (", ..." if len(subs) > 4 else "")
    level = logging.ERROR if err.status >= 500 else logging.WARNING
    log.log(level, "request %s failed (%d %s): %s", rids, err.status, err.error_type, err)
    if scope is not None:
        scope[STREAM_ERROR] = err.status


def count_finish(rt: Runtime, done: Any, tracker: Tracker, text: str | None = None) -> None:
    """A choice's final item: its outcome counted (on its request's engine series), and noted
    in its request's record (``text``: the choice's whole output, when the caller has it)."""
    times = rt.finished_request(done, tracker.series)
    if tracker.record is not None:
        tracker.record.finished(done, times, text)


class Gathered:
    __slots__ = ("extras", "finals", "ids", "texts")

    def __init__(self, n: int) -> None:
        self.texts: list[list[str]] = [[] for _ in range(n)]
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.extras: list[list[Any]] = [[] for _ in range(n)]
        self.finals: list[Any] = [None] * n


def matched_stop(fr: FinishReason | None) -> Any:
    """SGLang's ``matched_stop``: the stop token id (EOS included), token id sequence, string or
    regex pattern that ended the request; None otherwise."""
    return fr.matched() if fr is not None else None


class Streamer:
    """Turns one HTTP request's items into SSE bytes (synchronous; the loop in ``stream``
    does the waiting and the sending)."""

    #: How the API ends a stream with an error.
    dialect: ErrorDialect = OPENAI_ERRORS

    def __init__(self, rt: Runtime, subs: Subs) -> None:
        self.rt = rt
        self.subs = subs
        self.open = set(range(len(subs)))
        self.tracker = Tracker.of(rt, subs)
        #: The error the stream ended with, if it did (its status is the request's outcome).
        self.failed: TokenwireError | None = None
        self._scope = current_scope.get()  # (errors may be written from a loop callback)

    def head(self) -> bytes:
        return b""

    def feed(self, batch: list[tuple[int, Any]]) -> bytes:
        """SSE bytes for a batch of items; ``self.open`` empties when the response is over."""
        raise NotImplementedError

    #: Whether ``feed_steps`` may take the steps' plain chunks waiting in the one choice's sink
    #: now, instead of ``feed`` their ``Frame``\ s (never while ``feed`` is wrapped: a wrapper
    #: sees every item).
    takes_steps: bool = False

    def feed_steps(self, steps: list[tuple[str, int, int]]) -> bytes:
        """What ``feed`` writes for the one choice's steps' plain chunks (``EgressSink.take_steps``:
        ``(text, token id, completion tokens)`` each)."""
        raise NotImplementedError

    def error(self, err: TokenwireError) -> bytes:
        self.open.clear()
        self.failed = err
        if self.tracker.record is not None:
            self.tracker.record.error = err.error_type
        self.rt.metrics.request_errors.labels(err.error_type).inc()
        log_failure(self.subs, err, self._scope)
        return self.dialect.stream_end(err)

    def close(self) -> None:
        """The response is over (or abandoned): choices still open are aborted."""
        for k in self.open:
            rid, _, sink = self.subs[k]
            self.rt.abort(rid, sink)
        self.open.clear()
        self.rt.finished()


async def serve_plan(
    rt: Runtime,
    receive: Any,
    send: Any,
    route: str,
    parse: Callable[[Any], Plan],
    streamer: Callable[[Plan, Subs], Streamer],
    gathered: Callable[[Plan, Subs], Awaitable[tuple[int, Any]]],
    dialect: ErrorDialect = OPENAI_ERRORS,
) -> None:
    """A generation route: the JSON body parsed into a plan (``parse``), admitted (its key's
    quotas, the waiting queue: ``admit``), submitted, and answered as a stream (``streamer``'s
    bytes) or a whole response (``gathered``'s status and body); a request refused before that
    is answered in ``dialect``."""
    received.set(time.perf_counter())
    try:
        plan = await limits.parse_body(receive, parse)
        await rt.prepare_media(plan)  # (media fetched and processed in the media workers)
        # (an engine compiles a grammar off the event loop, each client in its turn)
        await rt.check_grammar(plan, client_key(current_scope.get()))
    except ClientDisconnected:
        return
    except TokenwireError as err:
        await send_error(rt.metrics, send, err, route, dialect)
        return
    admitted = await admit(rt, plan, receive, send, route, dialect)
    if admitted is None:
        return
    subs = admitted.subs
    try:
        record = current_record.get()
        if record is not None:
            record.submitted(plan, subs)
        if plan.stream:
            out = streamer(plan, subs)
            if record is not None and record.log_outputs:
                record.watch(out)
            await stream(
                rt,
                receive,
                admitted.send,
                out,
                route,
                gone=admitted.gone,
                started=admitted.started,
                keep_alive=admitted.keep_alive,
            )
        else:
            work = gathered(plan, subs)
            await collect(rt, receive, admitted.send, subs, work, route, gone=admitted.gone)
    finally:
        release(rt, admitted)
