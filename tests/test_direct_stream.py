"""DirectStream: a one-choice stream written from its sink's wake-ups (no sockets: a recording
body writer stands in for the connection)."""

from __future__ import annotations

import asyncio

import pytest

from tokenwire.messages.egress import ChunkEvent, Done, EgressSink, Error, Frame
from tokenwire.messages.errors import ClientDisconnected, DecodeError
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.server.direct_stream import DirectStream


class Body:
    """Records writes; ``paused`` until ``resume``."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.paused = False
        self._writable = asyncio.Event()
        self._writable.set()

    def pause(self) -> None:
        self.paused = True
        self._writable.clear()

    def resume(self) -> None:
        self.paused = False
        self._writable.set()

    def write(self, data: bytes) -> None:
        if data:
            self.writes.append(data)

    async def drained(self) -> None:
        await self._writable.wait()


class Streamer:
    """Each item's text, ``|``-terminated; the final item closes the one choice."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.open = {0}
        self.fail_on = fail_on
        self.batches: list[int] = []

    def feed(self, batch):
        self.batches.append(len(batch))
        out = []
        for _, item in batch:
            if isinstance(item, Error):
                self.open.clear()
                out.append(b"error|")
                break
            if item.text == self.fail_on:
                raise RuntimeError("formatting failed")
            out.append(item.text.encode() + b"|")
            if isinstance(item, Done):
                self.open.clear()
        return b"".join(out)


def frame(text: str, n: int) -> Frame:
    return Frame.of(ChunkEvent("r", [n], None, 3, text, n))


def done(text: str, n: int) -> Done:
    return Done.of(ChunkEvent("r", [n], FinishReason.length(n), 3, text, n))


async def turns(n: int = 4) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_items_go_out_in_order_with_the_head_first_and_the_wait_returns_the_last():
    sink, body, streamer = EgressSink(capacity=8), Body(), Streamer()
    sink.try_send(frame("a", 1))  # waiting before the stream starts
    task = asyncio.create_task(DirectStream(sink, streamer, body, b"head|").wait())
    await turns()
    assert body.writes == [b"head|a|"]
    sink.try_send(frame("b", 2))
    await turns()
    sink.try_send(done("c", 3))
    await asyncio.wait_for(task, 5)
    # The final item's bytes are the wait's: the handler sends them as the body's end (one
    # write with the terminator, not two).
    assert b"".join(body.writes) == b"head|a|b|" and task.result() == b"c|"
    sink.try_send(frame("late", 4))
    await turns()
    assert b"late" not in b"".join(body.writes)  # over: nothing more is written


async def test_steps_that_come_while_the_loop_is_busy_go_out_together():
    """A step every loop iteration: a stream writes about every other one (two steps at a
    time), as a task woken per step would; every item goes out, in order."""
    sink, body, streamer = EgressSink(capacity=64), Body(), Streamer()
    task = asyncio.create_task(DirectStream(sink, streamer, body, b"").wait())
    await turns()
    for k in range(40):
        sink.try_send(frame(str(k % 10), k + 1))
        await asyncio.sleep(0)
    sink.try_send(done("!", 41))
    await asyncio.wait_for(task, 5)
    written = b"".join(body.writes) + task.result()
    assert written == b"".join(f"{k % 10}|".encode() for k in range(40)) + b"!|"
    assert len(body.writes) <= 25  # not one write per step
    assert max(streamer.batches) >= 2


async def test_a_step_that_comes_to_an_idle_loop_goes_out_alone():
    sink, body, streamer = EgressSink(capacity=8), Body(), Streamer()
    task = asyncio.create_task(DirectStream(sink, streamer, body, b"").wait())
    for k in range(5):
        await turns()
        sink.try_send(frame(str(k), k + 1))
        await turns()
        assert len(body.writes) == k + 1  # written within a few loop iterations
    sink.try_send(done("", 6))
    await asyncio.wait_for(task, 5)
    assert body.writes == [b"0|", b"1|", b"2|", b"3|", b"4|"] and task.result() == b"|"


async def test_nothing_is_taken_while_the_connection_is_paused():
    sink, body, streamer = EgressSink(capacity=3), Body(), Streamer()
    task = asyncio.create_task(DirectStream(sink, streamer, body, b"").wait())
    await turns()
    body.pause()
    for k in range(3):
        sink.try_send(frame(str(k), k + 1))
        await turns()
    assert body.writes == [] and len(sink) == 3  # the sink fills (the shard merges past it)
    assert sink.idle_for(sink._taken_at + 9) == pytest.approx(9)  # and sees it untaken
    body.resume()
    await turns()
    assert body.writes == [b"0|1|2|"]
    sink.try_send(done("", 4))
    await asyncio.wait_for(task, 5)


async def test_a_closed_sink_ends_the_wait_with_client_disconnected():
    sink, body = EgressSink(), Body()
    task = asyncio.create_task(DirectStream(sink, Streamer(), body, b"").wait())
    await turns()
    sink.close()
    with pytest.raises(ClientDisconnected):
        await asyncio.wait_for(task, 5)


async def test_a_sink_closed_while_the_connection_is_paused_ends_the_wait_too():
    sink, body = EgressSink(), Body()
    task = asyncio.create_task(DirectStream(sink, Streamer(), body, b"").wait())
    await turns()
    body.pause()
    sink.try_send(frame("a", 1))
    await turns()
    sink.close()
    body.resume()  # (a lost connection resumes writing)
    with pytest.raises(ClientDisconnected):
        await asyncio.wait_for(task, 5)


async def test_an_error_item_is_written_and_ends_the_body():
    sink, body = EgressSink(), Body()
    task = asyncio.create_task(DirectStream(sink, Streamer(), body, b"").wait())
    sink.try_send(frame("a", 1))
    sink.send_final(Error(DecodeError("bad id")))
    await asyncio.wait_for(task, 5)
    assert b"".join(body.writes) + task.result() == b"a|error|"


async def test_a_formatting_failure_is_raised_to_the_handler():
    sink, body = EgressSink(), Body()
    task = asyncio.create_task(DirectStream(sink, Streamer(fail_on="x"), body, b"").wait())
    await turns()
    sink.try_send(frame("x", 1))
    with pytest.raises(RuntimeError, match="formatting failed"):
        await asyncio.wait_for(task, 5)


async def test_a_write_failure_is_raised_to_the_handler_too():
    class Broken(Body):
        def write(self, data: bytes) -> None:
            raise OSError("the socket broke")

    sink = EgressSink()
    task = asyncio.create_task(DirectStream(sink, Streamer(), Broken(), b"").wait())
    await turns()
    sink.try_send(frame("a", 1))  # written from the sink's callback, not the handler's task
    with pytest.raises(OSError, match="the socket broke"):
        await asyncio.wait_for(task, 5)


async def test_cancelling_the_wait_stops_the_writes():
    sink, body = EgressSink(), Body()
    task = asyncio.create_task(DirectStream(sink, Streamer(), body, b"").wait())
    sink.try_send(frame("a", 1))
    await turns()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    sink.try_send(frame("b", 2))
    await turns()
    assert body.writes == [b"a|"]
    assert len(sink) == 1  # left where it is


# ---- the connection's side: BodyWriter over a uvicorn request cycle --------------------------


class Transport:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


class Flow:
    def __init__(self) -> None:
        self.write_paused = False
        self.writable = asyncio.Event()
        self.writable.set()

    async def drain(self) -> None:
        await self.writable.wait()


class Cycle:
    """What BodyWriter reads of uvicorn's ``RequestResponseCycle``."""

    def __init__(self) -> None:
        self.transport = Transport()
        self.flow = Flow()
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None

    async def send(self, message: dict) -> None:  # pragma: no cover - never awaited here
        pass


def test_body_writer_writes_chunks_until_the_client_is_gone_or_the_response_over():
    from tokenwire.server.serving import BodyWriter

    cycle = Cycle()
    writer = BodyWriter(cycle)
    writer.write(b"hello")
    writer.write(b"")
    writer.write(b"x" * 26)
    assert cycle.transport.data == b"5\r\nhello\r\n1a\r\n" + b"x" * 26 + b"\r\n"
    cycle.disconnected = True
    writer.write(b"gone")
    cycle.disconnected, cycle.response_complete = False, True
    writer.write(b"over")
    assert b"gone" not in cycle.transport.data and b"over" not in cycle.transport.data


def test_body_writer_serves_only_its_own_started_chunked_response():
    from tokenwire.server.serving import BodyWriter

    cycle = Cycle()
    writer = BodyWriter(cycle)
    assert not writer.serves(cycle.send)  # not started yet
    cycle.response_started, cycle.chunked_encoding = True, True
    assert writer.serves(cycle.send)

    async def wrapper(message: dict) -> None:  # pragma: no cover - a middleware's send
        await cycle.send(message)

    assert not writer.serves(wrapper)  # it may change the body: go through it
    assert not writer.serves(Cycle().send)
    cycle.chunked_encoding = False  # a Content-Length response
    assert not writer.serves(cycle.send)
    cycle.chunked_encoding, cycle.response_complete = True, True
    assert not writer.serves(cycle.send)


async def test_body_writer_is_paused_while_the_write_buffer_is_full():
    from tokenwire.server.serving import BodyWriter

    cycle = Cycle()
    writer = BodyWriter(cycle)
    assert not writer.paused
    cycle.flow.write_paused = True
    cycle.flow.writable.clear()
    assert writer.paused
    waiting = asyncio.create_task(writer.drained())
    await turns()
    assert not waiting.done()
    cycle.flow.write_paused = False
    cycle.flow.writable.set()
    await asyncio.wait_for(waiting, 5)
    cycle.flow.write_paused, cycle.disconnected = True, True
    assert not writer.paused  # a lost client is not waited for
    await asyncio.wait_for(writer.drained(), 5)


# ---- the response's head goes out with its first body bytes ----------------------------------


class Wire:
    """A connection's transport that records each write (one system call each)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _serve_one(app, *parts: bytes, until=lambda wire: False) -> Wire:
    """A request (its ``parts`` a few turns of the loop apart) through tokenwire's connection
    protocol (uvicorn's request cycle) to ``app``; the transport once the response is complete
    (or ``until`` holds)."""
    from uvicorn.server import ServerState

    from tokenwire.server.serving import ConnectionLimits, uvicorn_config

    config = uvicorn_config(app, ConnectionLimits(), lifespan="off", log_level="warning")
    config.load()
    proto = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
    wire = Wire()
    proto.connection_made(wire)
    for k, part in enumerate(parts):
        if k:
            await turns(5)
        proto.data_received(part)
    for _ in range(200):
        await asyncio.sleep(0)
        if (proto.cycle is not None and proto.cycle.response_complete) or until(wire):
            break
    proto.connection_lost(None)
    return wire


_POST = (
    b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
)


async def test_a_streamed_responses_head_goes_out_with_its_first_chunk():
    first = asyncio.Event()

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await first.wait()
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        await send({"type": "http.response.body", "body": b"two", "more_body": False})

    async def later():
        await turns(20)
        first.set()

    waker = asyncio.ensure_future(later())
    wire = await _serve_one(app, _POST)
    await waker
    assert len(wire.writes) == 2, wire.writes
    assert wire.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert wire.writes[0].endswith(b"\r\n\r\n3\r\none\r\n")  # the head, then the first chunk
    assert wire.writes[1] == b"3\r\ntwo\r\n0\r\n\r\n"


async def test_a_whole_response_is_one_write():
    async def app(scope, receive, send):
        await receive()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"{}"})

    wire = await _serve_one(app, _POST)
    assert len(wire.writes) == 1
    assert wire.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert wire.writes[0].endswith(b"content-length: 2\r\n\r\n{}")


async def test_100_continue_goes_at_once_and_a_failed_response_still_sends_its_head():
    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("the handler failed after the start")

    request = b"POST /x HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n{}"
    wire = await _serve_one(app, request, until=lambda w: w.closed)
    assert wire.writes[0] == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert wire.writes[1].startswith(b"HTTP/1.1 200 OK\r\n")  # the head, then the close
    assert wire.closed


def test_head_with_body_holds_only_the_first_write_after_the_start():
    from tokenwire.server.serving import HeadWithBody

    cycle = Cycle()
    wire = Wire()
    cycle.transport = held = HeadWithBody(wire, cycle)
    held.write(b"early")  # not started: at once
    cycle.response_started = True
    held.write(b"head")
    assert wire.writes == [b"early"]
    held.write(b"body")
    assert wire.writes == [b"early", b"headbody"]
    assert cycle.transport is wire  # the cycle writes to its transport itself again
    held.write(b"late")  # (a stale reference): at once, nothing held
    assert wire.writes[-1] == b"late"
    assert held.get_extra_info("peername") == ("127.0.0.1", 50000)


async def test_a_body_there_already_is_received_without_a_timer(monkeypatch):
    from tokenwire.server import limits

    armed: list[float] = []
    real = limits._timeout_at
    assert real is not None

    def recording(when: float):
        armed.append(when)
        return real(when)

    monkeypatch.setattr(limits, "_timeout_at", recording)
    bodies: list[bytes] = []

    async def app(scope, receive, send):
        bounded = limits.bounded_receive(receive, 1 << 20, 5.0)
        bodies.append(await limits.read_body(bounded))
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
        )
        await send({"type": "http.response.body", "body": b""})

    await _serve_one(app, _POST)  # the body came with the headers
    assert bodies == [b"{}"] and armed == []

    # A body that comes later is waited for under the deadline.
    await _serve_one(app, _POST[:-2], _POST[-2:])
    assert bodies == [b"{}", b"{}"] and len(armed) == 1


async def test_the_disconnect_future_is_plain_and_the_connection_resolves_it():
    from tokenwire.server import limits
    from tokenwire.server.http import disconnected

    seen: dict = {}
    hold = asyncio.Event()

    async def app(scope, receive, send):
        bounded = limits.bounded_receive(receive, 1 << 20, 5.0)
        await limits.read_body(bounded)
        seen["gone"] = disconnected(bounded)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await hold.wait()

    await _serve_one(app, _POST, until=lambda w: "gone" in seen)
    gone = seen["gone"]
    assert not isinstance(gone, asyncio.Task)  # no task per request
    await turns()
    assert gone.done() and gone.result() is None  # the connection was lost
    hold.set()


async def test_the_disconnect_watch_reads_a_body_still_coming():
    from tokenwire.server.http import disconnected

    seen: dict = {}

    async def app(scope, receive, send):
        seen["gone"] = disconnected(receive)  # before the body has arrived whole
        await asyncio.sleep(0)

    await _serve_one(app, _POST[:-1], until=lambda w: "gone" in seen)
    gone = seen["gone"]
    assert isinstance(gone, asyncio.Task)
    await turns()
    assert gone.done()


async def test_a_response_to_head_sends_its_head_once_complete():
    async def app(scope, receive, send):
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"{}"})

    wire = await _serve_one(app, b"HEAD /health HTTP/1.1\r\nhost: t\r\n\r\n")
    assert len(wire.writes) == 1  # before the connection closes
    assert wire.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert wire.writes[0].endswith(b"content-length: 2\r\n\r\n")  # no body to HEAD
