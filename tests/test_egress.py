"""EgressSink: bounded, non-blocking, awaitable, merge on full, cross-thread delivery."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tokenwire.messages.egress import (
    ChunkEvent,
    Control,
    Done,
    EgressSink,
    Error,
    Frame,
    SinkError,
    StepChunks,
)
from tokenwire.messages.errors import ClientDisconnected, DecodeError
from tokenwire.messages.finish_reason import FinishReason


def chunk(text: str, ids: list[int], n: int, fin: FinishReason | None = None) -> ChunkEvent:
    return ChunkEvent("r", ids, fin, 3, text, n)


def test_sink_errors_read_as_words():
    assert str(SinkError.FULL) == "full"
    assert str(SinkError.CLOSED) == "closed"


def test_try_send_full_and_closed():
    sink = EgressSink(capacity=2)
    assert sink.try_send(Frame.of(chunk("a", [1], 1))) is None
    assert sink.try_send(Frame.of(chunk("b", [2], 2))) is None
    assert sink.try_send(Frame.of(chunk("c", [3], 3))) is SinkError.FULL
    assert len(sink) == 2
    assert sink.get_nowait().event.text == "a"
    assert sink.try_send(Control(b"ok")) is None
    sink.close()
    assert sink.closed
    assert sink.try_send(Frame.of(chunk("d", [4], 4))) is SinkError.CLOSED
    assert len(sink) == 0


def test_merge_into_last():
    sink = EgressSink(capacity=1)
    assert sink.try_send(Frame.of(chunk("ab", [1, 2], 2))) is None
    assert sink.merge_into_last(Frame.of(chunk("c", [3], 3)), max_pending=100)
    assert sink.merge_into_last(
        Done.of(chunk("d", [4], 4, FinishReason.length(4))), max_pending=100
    )
    (item,) = sink.drain()
    assert isinstance(item, Done)
    assert (item.event.text, item.event.token_ids) == ("abcd", [1, 2, 3, 4])
    assert item.event.completion_tokens == 4 and item.event.finish_reason == FinishReason.length(4)
    # Over the cap: nothing is delivered and the caller is told.
    sink.try_send(Frame.of(chunk("x" * 8, [5], 5)))
    assert not sink.merge_into_last(Frame.of(chunk("y" * 3, [6], 6)), max_pending=10)
    assert sink.drain()[0].event.text == "x" * 8
    # The consumer took everything meanwhile: the item is simply queued.
    assert sink.merge_into_last(Frame.of(chunk("z", [7], 7)), max_pending=10)
    assert sink.get_nowait().event.text == "z"


def test_merging_is_amortized_constant_time():
    # A stalled consumer: every delta is folded into one pending item, which is never copied.
    sink = EgressSink(capacity=1)
    sink.try_send(Frame.of(chunk("a", [0], 1)))
    for i in range(1, 2000):
        assert sink.merge_into_last(Frame.of(chunk("b", [i], i + 1)), max_pending=1 << 20)
        if i == 1:
            pending = sink._dq[-1]
            ids = pending.ids
        assert sink._dq[-1] is pending and pending.ids is ids  # appended in place
    (item,) = sink.drain()
    assert item.event.text == "a" + "b" * 1999 and item.event.token_ids == list(range(2000))
    assert item.event.completion_tokens == 2000


def test_pending_bound_counts_token_ids_too():
    # Tokens with no text (special tokens, partial characters) are bounded as well.
    sink = EgressSink(capacity=1)
    sink.try_send(Frame.of(chunk("", [0], 1)))
    merged = 0
    while sink.merge_into_last(Frame.of(chunk("", [merged + 1], merged + 2)), max_pending=100):
        merged += 1
        assert merged < 1000
    assert merged == 99
    (item,) = sink.drain()
    assert len(item.event.token_ids) == 100


def test_idle_for_and_abandon():
    sink = EgressSink(capacity=1)
    called = []
    sink.on_abandon = lambda: called.append(True)
    sink.try_send(Frame.of(chunk("a", [1], 1)))
    t0 = sink._taken_at
    assert sink.idle_for(t0 + 5) == 5
    sink.get_nowait()
    assert sink.idle_for(t0) <= 0  # taking an item resets the clock
    sink.abandon(Error(DecodeError("gone")))
    sink.abandon(Error(DecodeError("again")))
    assert called == [True]  # told once
    assert isinstance(sink.drain()[0], Error)


async def test_a_waiting_consumer_is_never_idle():
    sink = EgressSink(capacity=1)
    task = asyncio.create_task(sink.get())
    await asyncio.sleep(0)
    assert sink.idle_for(sink._taken_at + 1000) == 0
    sink.try_send(Frame.of(chunk("a", [1], 1)))
    await asyncio.wait_for(task, 5)


def test_send_final_goes_past_capacity():
    sink = EgressSink(capacity=1)
    sink.try_send(Frame.of(chunk("a", [1], 1)))
    assert sink.send_final(Error(DecodeError("bad"))) is None
    assert [type(i) for i in sink.drain()] == [Frame, Error]


async def test_async_consumer_same_loop():
    sink = EgressSink()
    got = []

    async def consume():
        async for item in sink:
            got.append(item)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    sink.try_send(Frame.of(chunk("a", [1], 1)))
    await asyncio.sleep(0)
    sink.try_send(Frame.of(chunk("b", [2], 2)))
    sink.try_send(Done.of(chunk("", [], 2, FinishReason.length(2))))
    await asyncio.wait_for(task, 5)
    assert [type(i) for i in got] == [Frame, Frame, Done]


async def test_take_waits_for_an_item_then_takes_every_waiting_one():
    sink = EgressSink()
    task = asyncio.create_task(sink.take())
    await asyncio.sleep(0)
    assert not task.done()
    sink.try_send(Frame.of(chunk("a", [1], 1)))
    sink.try_send(Done.of(chunk("b", [2], 2, FinishReason.length(2))))
    got = await asyncio.wait_for(task, 5)
    assert [(type(i), i.text) for i in got] == [(Frame, "a"), (Done, "b")]
    assert len(sink) == 0
    sink.close()
    with pytest.raises(ClientDisconnected):
        await sink.take()


async def test_close_wakes_a_waiting_consumer():
    sink = EgressSink()
    task = asyncio.create_task(sink.get())
    await asyncio.sleep(0)
    sink.close()
    with pytest.raises(ClientDisconnected):
        await asyncio.wait_for(task, 5)


async def test_producer_on_another_thread():
    sink = EgressSink(capacity=8)
    n = 2000

    def produce():
        i = 0
        while i < n:
            item = Frame.of(chunk(str(i % 10), [i], i + 1))
            if sink.try_send(item) is not None and not sink.merge_into_last(item, 1 << 20):
                raise AssertionError("cap")
            i += 1
            if i % 50 == 0:
                threading.Event().wait(0.0005)
        sink.send_final(Done.of(chunk("", [], n, FinishReason.length(n))))

    t = threading.Thread(target=produce)
    t.start()
    ids = []
    text = []
    async for item in sink:
        ids += item.event.token_ids
        text.append(item.event.text)
    t.join()
    assert ids == list(range(n))  # nothing lost, nothing reordered, merges included
    assert "".join(text) == "".join(str(i % 10) for i in range(n))


def test_step_chunks_are_read_at_each_sinks_row():
    """One step object queued in several sinks: each consumer gets its own ``Frame``; merging
    into a queued step keeps its text and ids."""
    step = StepChunks(["a", "b"], [7, 8], [3, 4], ["x", "yz"], [1, 5], {10: 0, 11: 1})
    a, b = EgressSink(), EgressSink()
    a.row, b.row = 10, 11
    assert a.try_send(step) is None and b.try_send(step) is None
    assert b.merge_into_last(Done.of(chunk("!", [9], 6, FinishReason.length(6))), 100)
    got_a = a.get_nowait()
    assert type(got_a) is Frame
    assert (got_a.rid, got_a.token_ids, got_a.text, got_a.prompt_tokens) == ("a", [7], "x", 3)
    assert got_a.completion_tokens == 1 and got_a.finish_reason is None
    (got_b,) = b.drain()
    assert type(got_b) is Done
    assert (got_b.text, got_b.token_ids, got_b.completion_tokens) == ("yz!", [8, 9], 6)


# ---- a consumer that is called (attach) -------------------------------------------------------


async def _turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_an_attached_callback_is_called_on_the_loop_once_per_batch_of_items():
    sink = EgressSink(capacity=8)
    calls = []
    sink.attach(lambda: calls.append(sink.drain()))
    sink.try_send(Frame.of(chunk("a", [1], 1)))
    sink.try_send(Frame.of(chunk("b", [2], 2)))
    assert calls == []  # never from the producer's call
    await _turns()
    assert [[i.text for i in batch] for batch in calls] == [["a", "b"]]
    sink.try_send(Frame.of(chunk("c", [3], 3)))
    await _turns()
    assert [[i.text for i in batch] for batch in calls] == [["a", "b"], ["c"]]


async def test_a_consumers_first_wake_up_comes_a_loop_iteration_before_the_later_ones():
    # The first item is a response's first token (its TTFT): the consumer is called in the
    # notifier's own callback. Later ones wait an iteration more, for more steps to join them.
    sink = EgressSink(capacity=8)
    calls = []
    sink.attach(lambda: calls.append([i.text for i in sink.drain()]))
    sink.try_send(Frame.of(chunk("a", [1], 1)))
    await asyncio.sleep(0)
    assert calls == [["a"]]
    sink.try_send(Frame.of(chunk("b", [2], 2)))
    await asyncio.sleep(0)
    assert calls == [["a"]]
    sink.try_send(Frame.of(chunk("c", [3], 3)))  # (joins the call that is due)
    await asyncio.sleep(0)
    assert calls == [["a"], ["b", "c"]]


async def test_several_sinks_are_called_in_one_loop_callback():
    sinks = [EgressSink() for _ in range(3)]
    order = []
    for k, sink in enumerate(sinks):
        sink.attach(lambda k=k: order.append((k, asyncio.current_task())))
    for sink in sinks:
        sink.try_send(Frame.of(chunk("a", [1], 1)))
    await _turns()
    assert [k for k, _ in order] == [0, 1, 2]
    assert {task for _, task in order} == {None}  # plain loop callbacks, not tasks


async def test_a_resting_sink_is_called_for_what_came_meanwhile_on_the_next_iteration():
    sink = EgressSink(capacity=8)
    calls = []
    sink.attach(lambda: calls.append([i.text for i in sink.drain()]))
    sink.rest()
    sink.try_send(Frame.of(chunk("a", [1], 1)))  # arrives while it rests: no call now ...
    sink.try_send(Frame.of(chunk("b", [2], 2)))
    await asyncio.sleep(0)
    assert calls == []
    await _turns()
    assert calls == [["a", "b"]]  # ... but one on the next iteration, for both
    sink.try_send(Frame.of(chunk("c", [3], 3)))  # not resting now: called as usual
    await _turns()
    assert calls == [["a", "b"], ["c"]]


async def test_a_resting_sink_with_nothing_new_is_simply_called_again_later():
    sink = EgressSink(capacity=8)
    calls = []
    sink.attach(lambda: calls.append(len(sink.drain())))
    sink.rest()
    await _turns()
    assert calls == []  # nothing came: no call
    sink.try_send(Frame.of(chunk("a", [1], 1)))
    await _turns()
    assert calls == [1]


@pytest.mark.parametrize("resting", [False, True])
async def test_close_calls_an_attached_callback(resting):
    sink = EgressSink()
    calls = []
    sink.attach(lambda: calls.append(sink.closed))
    if resting:
        sink.rest()
    sink.close()
    await _turns()
    assert calls == [True]


async def test_detach_ends_the_calls():
    sink = EgressSink()
    calls = []
    sink.attach(lambda: calls.append(True))
    sink.try_send(Frame.of(chunk("a", [1], 1)))
    sink.detach()  # before the loop got to the call that was due: it does not come either
    await _turns()
    sink.try_send(Frame.of(chunk("b", [2], 2)))
    await _turns()
    assert calls == []
    assert len(sink) == 2


async def test_an_attached_consumer_is_idle_while_items_wait_or_it_rests():
    sink = EgressSink(capacity=8)
    sink.attach(lambda: None)
    t0 = sink._taken_at
    assert sink.idle_for(t0 + 100) == 0  # armed, nothing waiting: it waits
    sink.try_send(Frame.of(chunk("a", [1], 1)))
    assert sink.idle_for(t0 + 100) == pytest.approx(100)  # items wait untaken
    sink.drain()
    sink.rest()
    assert sink.idle_for(sink._taken_at + 7) == pytest.approx(7)  # resting: not waiting


async def test_a_failing_callback_does_not_stop_the_others():
    loop = asyncio.get_running_loop()
    reported = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))
    sinks = [EgressSink() for _ in range(3)]
    calls = []

    def failing():
        calls.append("bad")
        raise RuntimeError("consumer bug")

    sinks[0].attach(failing)
    sinks[1].attach(lambda: calls.append("good1"))
    sinks[2].attach(lambda: calls.append("good2"))
    for _ in range(2):
        for sink in sinks:
            sink.try_send(Frame.of(chunk("a", [1], 1)))
        await _turns()
    assert calls == ["bad", "good1", "good2"] * 2  # every round, each of them
    assert [str(e) for e in reported] == ["consumer bug"] * 2
