"""A step's plain chunks handed by the shard straight to each stream's ``DirectStream``
(``EgressSink.direct``): written within the shard's step, nothing queued and nobody woken, while
the sink holds nothing else and the connection takes writes; queued for the wake-up otherwise
(a paused connection, items waiting, a producer on another thread, a stream that is over), and
in order throughout."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from test_direct_stream import Body, turns
from tokenwire import SamplingParams
from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.messages.egress import Done, EgressSink, Error, Frame
from tokenwire.messages.errors import ClientDisconnected
from tokenwire.messages.frames import decode_batch_frame, encode_batch_frame
from tokenwire.server.direct_stream import DirectStream
from tokenwire.shard import DetokShard

from helpers import b, byte_tokenizer

TOK = byte_tokenizer()


class StepStreamer:
    """Each chunk's text, ``|``-terminated; records which way each came (``direct``: through
    ``feed_step``); the final item closes the one choice."""

    takes_steps = True

    def __init__(self, fail_on: str | None = None) -> None:
        self.open = {0}
        self.fail_on = fail_on
        self.ways: list[str] = []

    def feed_step(self, text: str, token_id: int, tokens: int) -> bytes:
        if text == self.fail_on:
            raise RuntimeError("formatting failed")
        self.ways.append("direct")
        return text.encode() + b"|"

    def feed_steps(self, steps: list[tuple[str, int, int]]) -> bytes:
        self.ways.append(f"steps{len(steps)}")
        return b"".join(text.encode() + b"|" for text, _, _ in steps)

    def feed(self, batch) -> bytes:
        self.ways.append(f"feed{len(batch)}")
        out = []
        for _, item in batch:
            if isinstance(item, Error):
                self.open.clear()
                return b"".join(out) + b"error|"
            out.append(item.text.encode() + b"|")
            if isinstance(item, Done):
                self.open.clear()
        return b"".join(out)


def frame(rows, prompt: int = 2):
    """A decoded batch frame: rows of (rid, token ids, finish dict)."""
    header = [
        [r[0] for r in rows],
        [r[2] for r in rows],
        [prompt] * len(rows),
        [len(r[1]) for r in rows],
    ]
    return decode_batch_frame(encode_batch_frame(header, [[t for r in rows for t in r[1]]]))


def step(shard: DetokShard, texts: dict[str, str], finish: dict | None = None) -> None:
    """One token per request (its text one byte), all in one frame."""
    shard.on_frame(frame([(rid, b(text), finish) for rid, text in texts.items()]))


async def streams(n: int, **streamer_kw):
    """``n`` requests on one shard, each with its DirectStream waiting."""
    shard = DetokShard()
    out = []
    for k in range(n):
        sink = EgressSink(capacity=8)
        params = SamplingParams()
        params.normalize(TOK)
        shard.register(f"r{k}", sink, TOK, b("> "), params)
        body, streamer = Body(), StepStreamer(**streamer_kw)
        task = asyncio.create_task(DirectStream(sink, streamer, body, b"head|").wait())
        out.append((sink, body, streamer, task))
    await turns()  # (the waits attach)
    return shard, out


async def test_a_step_is_written_within_the_shards_step_with_nothing_queued():
    shard, got = await streams(3)
    step(shard, {"r0": "a", "r1": "b", "r2": "c"})
    # No loop iteration since: each stream's chunk is written already, the head first.
    assert [body.writes for _, body, _, _ in got] == [[b"head|a|"], [b"head|b|"], [b"head|c|"]]
    assert all(not len(sink) for sink, _, _, _ in got)
    step(shard, {"r0": "d", "r1": "e", "r2": "f"})
    step(shard, {"r0": "g", "r1": "h", "r2": "i"}, {"type": "length", "length": 3})
    for _, _, _, task in got:
        await asyncio.wait_for(task, 5)  # the final chunk ends each body (the general way)
    assert [b"".join(body.writes) for _, body, _, _ in got] == [
        b"head|a|d|g|",
        b"head|b|e|h|",
        b"head|c|f|i|",
    ]
    assert got[0][2].ways == ["direct", "direct", "feed1"]


async def test_a_paused_connection_has_the_steps_queued_and_written_in_order_once_it_drains():
    shard, [(sink, body, streamer, task)] = await streams(1)
    step(shard, {"r0": "a"})
    body.pause()
    step(shard, {"r0": "b"})
    step(shard, {"r0": "c"})
    await turns()
    assert body.writes == [b"head|a|"] and len(sink) == 2  # queued, not taken
    body.resume()
    await turns()
    assert body.writes == [b"head|a|", b"b|c|"]
    step(shard, {"r0": "d"})  # the sink is empty again: direct again
    assert body.writes[-1] == b"d|"
    assert streamer.ways == ["direct", "steps2", "direct"]
    step(shard, {"r0": "!"}, {"type": "length", "length": 5})
    await asyncio.wait_for(task, 5)


async def test_a_step_behind_waiting_items_is_queued_behind_them():
    shard, [(sink, body, streamer, task)] = await streams(1)
    shard.on_frame(frame([("r0", b("xy"), None)]))  # two tokens: the general step's Frame
    assert len(sink) == 1 and body.writes == []
    step(shard, {"r0": "z"})  # before the wake-up ran: behind the Frame, not around it
    assert len(sink) == 2 and body.writes == []
    await turns()
    assert b"".join(body.writes) == b"head|xy|z|"
    step(shard, {"r0": "w"})
    assert b"".join(body.writes) == b"head|xy|z|w|"
    assert streamer.ways[-1] == "direct"
    step(shard, {"r0": "!"}, {"type": "length", "length": 5})
    await asyncio.wait_for(task, 5)


async def test_a_producer_on_another_thread_never_writes_directly():
    shard, [(sink, body, streamer, task)] = await streams(1)
    worker = threading.Thread(target=step, args=(shard, {"r0": "a"}))
    worker.start()
    worker.join()
    assert body.writes == [] and len(sink) == 1  # queued: the loop's own thread writes it
    await turns(8)
    assert body.writes == [b"head|a|"]
    assert streamer.ways == ["steps1"]
    step(shard, {"r0": "!"}, {"type": "length", "length": 2})
    await asyncio.wait_for(task, 5)


async def test_a_formatting_failure_in_the_step_ends_that_wait_only():
    shard, got = await streams(2, fail_on="x")
    step(shard, {"r0": "x", "r1": "a"})
    with pytest.raises(RuntimeError, match="formatting failed"):
        await asyncio.wait_for(got[0][3], 5)
    assert got[1][1].writes == [b"head|a|"]
    step(shard, {"r1": "b"}, {"type": "length", "length": 2})
    await asyncio.wait_for(got[1][3], 5)
    assert b"".join(got[1][1].writes) == b"head|a|b|"


async def test_a_stream_that_is_over_or_gone_takes_nothing_more():
    shard, [(sink, body, _, task)] = await streams(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sink.direct is None
    step(shard, {"r0": "a"})
    assert body.writes == [] and len(sink) == 1  # queued as for any consumer that stopped
    assert isinstance(sink.drain()[0], Frame)


async def test_a_streamer_that_cannot_take_steps_never_gets_them_directly():
    shard = DetokShard()
    sink = EgressSink()
    params = SamplingParams()
    params.normalize(TOK)
    shard.register("r0", sink, TOK, b("> "), params)
    streamer = StepStreamer()
    streamer.takes_steps = False  # (a wrapped feed, logprobs, an echo...)
    body = Body()
    task = asyncio.create_task(DirectStream(sink, streamer, body, b"").wait())
    await turns()
    step(shard, {"r0": "a"})
    assert body.writes == [] and len(sink) == 1
    await turns()
    assert body.writes == [b"a|"] and streamer.ways == ["feed1"]
    step(shard, {"r0": "!"}, {"type": "length", "length": 2})
    await asyncio.wait_for(task, 5)


async def test_a_closed_sink_takes_no_step_and_its_request_ends():
    aborted: list[str] = []
    shard = DetokShard(aborted.append)
    sink = EgressSink()
    params = SamplingParams()
    params.normalize(TOK)
    shard.register("r0", sink, TOK, b("> "), params)
    streamer, body = StepStreamer(), Body()
    task = asyncio.create_task(DirectStream(sink, streamer, body, b"").wait())
    await turns()
    step(shard, {"r0": "a"})
    sink.close()  # the client went away
    assert sink.direct is None
    step(shard, {"r0": "b"})  # before the wake-up ran: not written, the request ended
    assert body.writes == [b"a|"] and "r0" not in shard and aborted == ["r0"]
    with pytest.raises(ClientDisconnected):
        await asyncio.wait_for(task, 5)


def test_over_a_live_server_a_client_that_stops_reading_is_ended_and_the_others_stream_on(
    monkeypatch,
):
    """Over tokenwire's connection protocol: steps go out through the direct call; a client
    that stops reading fills its socket, its writer pauses, its steps queue, and it is ended
    for stalling, while another stream's bytes are whole."""
    import httpx

    from served import MODEL, raw_request, serve, wait_until

    calls = []
    on_step = DirectStream.on_step

    def counted(self, text, token_id, tokens):
        took = on_step(self, text, token_id, tokens)
        calls.append(took)
        return took

    monkeypatch.setattr(DirectStream, "on_step", counted)
    stalling = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 30000,
        "ignore_eos": True,
        "stream": True,
    }
    with serve(SyntheticConfig(output="random", step_time=0.0005), stall_timeout=0.3) as s:
        stalled = raw_request(
            s.port, "POST", "/v1/chat/completions", json.dumps(stalling).encode(), rcvbuf=4096
        )
        try:
            assert wait_until(lambda: len(s.runtime.shard) == 1, 30)
            body = {"model": MODEL, "prompt": "Hello", "max_tokens": 40}
            with httpx.stream(
                "POST", s.url + "/v1/completions", json=body | {"stream": True}, timeout=30
            ) as resp:
                streamed = resp.read().decode()
            events = [e for e in streamed.split("\n\n") if e.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            chunks = [json.loads(e[6:])["choices"][0] for e in events[:-1]]
            assert chunks[-1]["finish_reason"] == "length"
            assert all(c["finish_reason"] is None for c in chunks[:-1]) and len(chunks) > 1

            def ended() -> bool:
                text = httpx.get(s.url + "/metrics").text
                return 'error_type="client_stalled"' in text and not len(s.runtime.shard)

            assert wait_until(ended, 60), "the stalled stream was never ended"
        finally:
            stalled.close()
    assert True in calls  # steps went out through the direct call
    assert False in calls  # and the paused writer declined them
