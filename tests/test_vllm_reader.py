"""The vLLM engine's output reader shares the event loop: steps already waiting on the socket are
read in turns, so that a fast engine's streams go out while it runs, not in one piece at the end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import zmq
import zmq.asyncio

from tokenwire import Tokenizer
from tokenwire.engine.vllm import VllmEngine, VllmEngineConfig
from tokenwire.engine.vllm import client as vllm_client
from tokenwire.engine.vllm import protocol as wire

STEPS = 400


@contextlib.asynccontextmanager
async def _engine_on_a_pipe(rids: list[str]) -> AsyncIterator[tuple[VllmEngine, Any]]:
    """A ``VllmEngine`` reading the PULL end of an in-process pipe as its output socket, with
    ``rids`` in flight; yields it and the PUSH end."""
    ctx = zmq.asyncio.Context()
    push = ctx.socket(zmq.PUSH)
    pull = ctx.socket(zmq.PULL)
    try:
        push.bind("inproc://outputs")
        pull.connect("inproc://outputs")
        engine = VllmEngine(Tokenizer.default(), VllmEngineConfig())
        engine._output_sock = pull
        for rid in rids:
            engine._prompt_lens[rid] = 3
            engine._max_tokens[rid] = None
        yield engine, push
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()


def _read_queued(
    turn: float,
    busy: float = 0.0,
    longest: float = vllm_client._MAX_READ_TURN,
    merged: int = 1,
) -> tuple[int, list[int]]:
    """``STEPS`` one-token steps queued on the engine's output socket before the reader starts;
    another task counts its turns on the loop (each keeping the CPU ``busy`` seconds). Returns
    the steps read and, for each turn of the other task, how many steps had been read by then.
    The reader takes at most ``merged`` messages at once (1: each message is its own read)."""

    async def main() -> tuple[int, list[int]]:
        rids = [f"r{i}" for i in range(8)]
        async with _engine_on_a_pipe(rids) as (engine, push):
            steps: list[int] = []
            # (steps merged into one count as the steps they were: 8 tokens each)
            engine._output = lambda frame: steps.extend([1] * (len(frame.token_ids) // 8))
            for k in range(STEPS):
                msg = wire.outputs_for_step(0, [(rid, [k % 100], None, None) for rid in rids])
                await asyncio.wait_for(push.send(wire.encode_outputs(msg)), 5)
            seen: list[int] = []
            reader = asyncio.ensure_future(engine._read_outputs())

            async def other() -> None:
                while len(steps) < STEPS:
                    seen.append(len(steps))
                    until = time.perf_counter() + busy
                    while time.perf_counter() < until:
                        pass
                    await asyncio.sleep(0)

            try:
                await asyncio.wait_for(other(), 30)
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            return len(steps), seen

    saved = vllm_client._READ_TURN, vllm_client._MAX_READ_TURN, vllm_client._MAX_MERGED
    vllm_client._READ_TURN, vllm_client._MAX_READ_TURN = turn, longest
    vllm_client._MAX_MERGED = merged
    try:
        return asyncio.run(main())
    finally:
        vllm_client._READ_TURN, vllm_client._MAX_READ_TURN, vllm_client._MAX_MERGED = saved


def test_waiting_steps_are_read_in_turns_that_let_other_tasks_run():
    read, seen = _read_queued(0.0)
    assert read == STEPS
    # A turn of no length yields after every step: the other task sees the steps arrive one by one.
    between = [n for n in seen if 0 < n < STEPS]
    assert len(set(between)) >= STEPS // 2, seen[:20]


def test_a_long_turn_reads_everything_waiting_at_once():
    # The contrast that makes the test above able to fail: a turn longer than the whole backlog
    # reads it before any other task runs.
    read, seen = _read_queued(60.0)
    assert read == STEPS
    assert not [n for n in seen if 0 < n < STEPS], seen[:20]


def test_a_turn_lasts_as_long_as_the_other_tasks_took():
    # The others take 2 ms a turn: the reader's turns grow to match, reading many steps each
    # (with turns of a fixed length near 0 it would read about one per turn of the others).
    read, seen = _read_queued(0.0, busy=0.002)
    assert read == STEPS
    assert len(seen) < STEPS // 4, len(seen)


def test_a_turn_is_bounded():
    # The same, with turns bounded near 0: the reader yields after about every step again.
    read, seen = _read_queued(0.0, busy=0.002, longest=1e-6)
    assert read == STEPS
    assert len(seen) >= STEPS // 2, len(seen)


def test_waiting_steps_are_merged_up_to_a_bound_per_read():
    # With merging, a turn of no length yields after every read of what waits (at most
    # ``_MAX_MERGED`` messages, handed to the shard as one step): the other task sees the
    # steps arrive in pieces of about that size, never all at once.
    read, seen = _read_queued(0.0, merged=64)
    assert read == STEPS
    between = sorted({n for n in seen if 0 < n < STEPS})
    assert len(between) >= STEPS // 64 - 1, seen[:20]
    assert all(b - a <= 64 for a, b in zip([0, *between], [*between, STEPS])), between


def _new_io_threads(before: set[int]) -> set[int]:
    """The I/O threads started since ``before`` (a thread names itself once it runs: wait)."""
    deadline = time.monotonic() + 5
    while True:
        started = _io_threads() - before
        if started or time.monotonic() > deadline:
            return started
        time.sleep(0.01)


def _io_threads() -> set[int]:
    threads = set()
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().startswith("ZMQbg/IO"):
                threads.add(int(tid))
    return threads


@pytest.mark.skipif(
    not hasattr(os, "SCHED_BATCH") or not os.path.isdir("/proc/self/task"),
    reason="SCHED_BATCH and /proc/self/task are Linux's",
)
def test_the_engine_sockets_io_thread_runs_under_sched_batch():
    """The engine's ZMQ context starts its I/O thread under ``SCHED_BATCH``: sharing a core with
    the event loop, its wake-ups do not preempt the loop."""
    before = _io_threads()
    ctx = vllm_client._context()
    try:
        assert ctx.get(zmq.THREAD_SCHED_POLICY) == os.SCHED_BATCH
        sock = ctx.socket(zmq.PULL)  # (libzmq starts the I/O thread with the first socket)
        try:
            started = _new_io_threads(before)
            assert started
            assert {os.sched_getscheduler(t) for t in started} == {os.SCHED_BATCH}
        finally:
            sock.close(linger=0)
    finally:
        ctx.term()
    # A plain context keeps the default policy (so the check above can fail).
    plain = zmq.Context()
    try:
        sock = plain.socket(zmq.PULL)
        started = _new_io_threads(before)
        assert started and all(os.sched_getscheduler(t) == os.SCHED_OTHER for t in started)
        sock.close(linger=0)
    finally:
        plain.term()


def test_the_reader_waits_on_the_socket_between_steps_without_spinning(monkeypatch):
    """Steps that arrive one at a time, the reader waiting for each: every one is read as it
    comes; each costs at most one read that finds nothing (``zmq.Again``, which ends a turn of
    reading; a wake-up with no message waiting is answered by the socket's ``EVENTS``); and
    while nothing comes the reader takes no CPU (it waits on the socket's descriptor, not in a
    loop)."""
    raised: list[int] = []
    init = zmq.ZMQError.__init__

    def counting(self, *args, **kwargs):
        raised.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(zmq.ZMQError, "__init__", counting)

    async def main() -> tuple[list[int], float]:
        async with _engine_on_a_pipe(["r0"]) as (engine, push):
            tokens: list[int] = []
            arrived = asyncio.Event()

            def output(frame) -> None:
                tokens.extend(frame.token_ids)
                arrived.set()

            engine._output = output
            reader = asyncio.ensure_future(engine._read_outputs())
            try:
                await asyncio.sleep(0.05)
                for k in range(50):
                    arrived.clear()
                    msg = wire.outputs_for_step(0, [("r0", [k], None, None)])
                    await push.send(wire.encode_outputs(msg))
                    await asyncio.wait_for(arrived.wait(), 5)
                before = time.process_time()
                await asyncio.sleep(0.3)  # nothing comes
                idle = time.process_time() - before
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            return tokens, idle

    tokens, idle = asyncio.run(main())
    assert tokens == list(range(50))
    assert len(raised) <= 50, len(raised)
    assert idle < 0.1, idle


def test_waiting_messages_are_read_whole_without_asking_the_socket_about_them(monkeypatch):
    """Messages already waiting, of one and of three frames, are read whole and in order, at
    most ``most`` at a time, by reads alone after one ``EVENTS`` question a turn: no ``EVENTS``
    or ``RCVMORE`` question per message (each a system call and an enum conversion in pyzmq,
    which cost more than the read)."""
    asked: list[int] = []
    get = zmq.Socket.get

    def counting(self, option):
        asked.append(option)
        return get(self, option)

    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    try:
        push.bind("inproc://waiting")
        pull.connect("inproc://waiting")
        sent = [[b"a%d" % k] if k % 2 else [b"b%d" % k, b"x", b"y"] for k in range(10)]
        for frames in sent:
            push.send_multipart(frames)
        deadline = time.monotonic() + 5
        while not pull.poll(0) and time.monotonic() < deadline:
            time.sleep(0.001)
        monkeypatch.setattr(zmq.Socket, "get", counting)
        monkeypatch.setattr(zmq.Socket, "getsockopt", counting)
        first = vllm_client._read_waiting(pull, 4)
        rest = vllm_client._read_waiting(pull, 64)
        assert vllm_client._read_waiting(pull, 64) == []
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()
    assert len(first) == 4
    assert [[bytes(b) for b in m] for m in first + rest] == sent
    assert asked == [zmq.EVENTS] * 3


def test_a_failure_while_reading_ends_the_reader_and_fails_the_engines():
    """What reading raises (here, handling a message) ends the reader and marks every engine
    gone, rather than vanishing in a loop callback and leaving the requests waiting."""

    async def main() -> list[str]:
        async with _engine_on_a_pipe(["r0"]) as (engine, push):
            died: list[str] = []
            engine._output = lambda frame: None
            engine._cores = ["core"]  # type: ignore[list-item]
            engine._core_died = lambda core, why: died.append(f"{core}: {why}")  # type: ignore[method-assign]

            def failing(frames):
                raise RuntimeError("boom")

            engine.on_message = failing  # type: ignore[method-assign]
            reader = asyncio.ensure_future(engine._read_outputs())
            await asyncio.sleep(0.05)
            assert not reader.done()
            msg = wire.outputs_for_step(0, [("r0", [1], None, None)])
            await push.send(wire.encode_outputs(msg))
            await asyncio.wait_for(reader, 5)
            return died

    assert asyncio.run(main()) == ["core: engine output socket failed: boom"]
