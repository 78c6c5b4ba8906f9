"""Steps read together from a vLLM engine reach the shard as one step (``VllmEngine.on_messages``):
a request's tokens in order, its finish from its last step, each message's own bookkeeping kept;
messages that cannot merge (logprobs, another engine, a request after its finish) go one by one."""

from __future__ import annotations

from typing import Any

import pytest

from tokenwire import Tokenizer
from tokenwire.engine.vllm import VllmEngine, VllmEngineConfig
from tokenwire.engine.vllm import client as vllm_client
from tokenwire.engine.vllm import protocol as wire
from tokenwire.messages.frames import Decoded


def _engine(rids: list[str]) -> tuple[VllmEngine, list[Any]]:
    engine = VllmEngine(Tokenizer.default(), VllmEngineConfig())
    got: list[Any] = []
    engine._output = got.append
    core = vllm_client._Core(0, wire.engine_identity(0))
    for rid in rids:
        engine._prompt_lens[rid] = 3
        engine._max_tokens[rid] = 16
        engine._owner[rid] = core
        core.in_flight.add(rid)
    return engine, got


def _msg(rows: list[tuple[str, list[int], int | None, Any]], rank: int = 0) -> list[bytes]:
    return [wire.encode_outputs(wire.outputs_for_step(rank, rows, stats={"num_running_reqs": 2}))]


def _steps(got: list[Any]) -> list[Decoded]:
    return [g for g in got if isinstance(g, Decoded)]


def test_consecutive_steps_merge_per_request_in_order():
    engine, got = _engine(["a", "b"])
    messages = [
        _msg([("a", [1], None, None), ("b", [10], None, None)]),
        _msg([("a", [2], None, None), ("b", [11], None, None)]),
        _msg([("a", [3], wire.FINISH_LENGTH, None), ("b", [12], None, None)]),
    ]
    engine.on_messages(messages)
    (step,) = _steps(got)
    assert step.rids == ["a", "b"]
    assert step.tok_lens == [3, 3]
    assert step.token_ids.tolist() == [1, 2, 3, 10, 11, 12]
    assert step.finish_reasons[0] is not None and step.finish_reasons[0].kind == "length"
    assert step.finish_reasons[1] is None
    # Each message is still its own engine step in the counters, and the finished request is
    # forgotten once its tokens went out.
    stats = engine.rank_stats[0]
    assert sum(stats.iteration_counts) == 3 and stats.iteration_sum == 6
    assert len(stats.pending) == 3
    assert "a" not in engine._prompt_lens and "b" in engine._prompt_lens


def test_one_by_one_gives_the_same_tokens():
    rows = [
        [("a", [1], None, None), ("b", [10], None, None)],
        [("b", [11], None, None)],
        [("a", [2, 3], wire.FINISH_STOP, "x"), ("b", [12], None, None)],
    ]
    merged, got_merged = _engine(["a", "b"])
    merged.on_messages([_msg(r) for r in rows])
    single, got_single = _engine(["a", "b"])
    for r in rows:
        single.on_message(_msg(r))

    def per_request(steps: list[Decoded]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for s in steps:
            pos = 0
            ids = s.token_ids.tolist()
            for rid, n in zip(s.rids, s.tok_lens):
                out.setdefault(rid, []).extend(ids[pos : pos + n])
                pos += n
        return out

    assert len(_steps(got_merged)) == 1 and len(_steps(got_single)) == 3
    assert per_request(_steps(got_merged)) == per_request(_steps(got_single))
    (step,) = _steps(got_merged)
    fin = step.finish_reasons[step.rids.index("a")]
    assert fin is not None and fin.matched() == "x"
    assert merged.rank_stats[0].iteration_counts == single.rank_stats[0].iteration_counts


def test_a_request_seen_after_its_finish_starts_a_new_step():
    engine, got = _engine(["a"])
    engine.on_messages(
        [_msg([("a", [1], wire.FINISH_LENGTH, None)]), _msg([("a", [2], None, None)])]
    )
    assert [s.tok_lens for s in _steps(got)] == [[1], [1]]


def test_steps_of_different_engines_do_not_merge():
    engine, got = _engine(["a", "b"])
    engine.on_messages(
        [
            _msg([("a", [1], None, None)], rank=0),
            _msg([("b", [2], None, None)], rank=1),
            _msg([("b", [3], None, None)], rank=1),
        ]
    )
    steps = _steps(got)
    assert [(s.engine, s.rids, s.tok_lens) for s in steps] == [(0, ["a"], [1]), (1, ["b"], [2])]


@pytest.mark.parametrize("why", ["logprobs", "pooling"])
def test_requests_with_side_data_keep_one_step_per_message(why: str):
    engine, got = _engine(["a", "b"])
    if why == "logprobs":
        engine._logprobs["b"] = (0, -1)
    else:
        engine._pooling.add("p")
    engine.on_messages([_msg([("a", [1], None, None)]), _msg([("a", [2], None, None)])])
    assert [s.tok_lens for s in _steps(got)] == [[1], [1]]


def test_a_failed_request_ends_after_its_tokens():
    engine, got = _engine(["a", "b"])
    engine.on_messages(
        [
            _msg([("a", [1], None, None), ("b", [5], None, None)]),
            _msg([("a", [2], wire.FINISH_ERROR, None), ("b", [6], None, None)]),
        ]
    )
    step, error = got
    assert isinstance(step, Decoded) and step.rids == ["b"] and step.tok_lens == [2]
    assert isinstance(error, bytes)
    assert engine.rank_stats[0].iteration_sum == 3  # the failed request's tokens do not count


def test_steps_before_the_engines_death_notice_go_out_first():
    engine, _ = _engine(["a"])
    order: list[str] = []
    engine._output = lambda frame: order.append("step")
    engine._engine_dead_message = lambda: order.append("dead")  # type: ignore[method-assign]
    engine.on_messages(
        [_msg([("a", [1], None, None)]), _msg([("a", [2], None, None)]), [wire.ENGINE_CORE_DEAD]]
    )
    assert order == ["step", "dead"]


def test_steps_before_a_malformed_message_go_out_first():
    engine, _ = _engine(["a"])
    order: list[str] = []
    engine._output = lambda frame: order.append("step")
    engine._malformed = lambda *args: order.append("malformed")  # type: ignore[method-assign]
    engine.on_messages([_msg([("a", [1], None, None)]), [b"\xc1 not msgpack"]])
    assert order == ["step", "malformed"]
