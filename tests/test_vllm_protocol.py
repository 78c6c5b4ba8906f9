"""vLLM EngineCore wire protocol, sans-I/O: what tokenwire sends, and how it reads the replies."""

from __future__ import annotations

import msgspec
import pytest

from tokenwire import FinishReason, SamplingParams, ValidationError
from tokenwire.engine import EngineRequest
from tokenwire.engine.vllm import protocol as wire
from tokenwire.engine.vllm.client import check_vllm_params
from tokenwire.entrypoints.vllm_frontend import settings_from_args

EOS = wire.EngineEos(151645, (151643,))


def params(**kw) -> SamplingParams:
    p = SamplingParams(**kw)
    p.normalized = True
    return p


def test_sampling_map_eos_and_stop_tokens_as_vllms_frontend_sets_them():
    sp = wire.sampling_params_map(params(max_new_tokens=7, stop_token_ids=[5]), 3, 512, EOS)
    assert sp["max_tokens"] == 7
    assert sp["_eos_token_id"] == 151645
    assert sp["stop_token_ids"] == [151643, 5]  # extra EOS ids become stop tokens
    assert sp["_all_stop_token_ids"] == [5, 151643, 151645]
    assert "ignore_eos" not in sp and "temperature" not in sp
    sp = wire.sampling_params_map(params(ignore_eos=True, stop_token_ids=[5]), 3, 512, EOS)
    assert sp["ignore_eos"] is True and "_eos_token_id" not in sp
    assert sp["stop_token_ids"] == [5]  # EOS ignored: the extra EOS ids are not stops either
    assert 151645 in sp["_all_stop_token_ids"]  # but min_tokens still masks them


def test_sampling_map_greedy_seed_limits_and_structured_output():
    greedy = params(temperature=1.0, top_k=1, sampling_seed=9, min_new_tokens=2)
    sp = wire.sampling_params_map(greedy, 10, 512, EOS)
    assert sp["temperature"] == 0.0 and "top_k" not in sp
    assert sp["seed"] == 9 and sp["min_tokens"] == 2
    # No max_new_tokens: what the context leaves.
    assert wire.sampling_params_map(params(max_new_tokens=None), 10, 512, EOS)["max_tokens"] == 502
    sp = wire.sampling_params_map(params(top_k=40, top_p=0.5, json_schema="{}"), 1, 512, EOS)
    assert sp["top_k"] == 40 and sp["top_p"] == 0.5
    assert sp["structured_outputs"] == {"json": "{}", "_backend": "xgrammar"}


def test_add_round_trip_is_an_engine_core_request_array():
    req = EngineRequest("r1", [1, 2, 3], params(max_new_tokens=4))
    sp = wire.sampling_params_map(req.params, 3, 512, EOS)
    payload = wire.encode_add(req, sp, arrival_time=1.0)
    raw = msgspec.msgpack.decode(payload)
    assert isinstance(raw, list) and len(raw) == 9  # the required fields only
    assert raw[0] == "r1" and raw[1] == [1, 2, 3] and raw[3] == sp and raw[5] == 1.0
    add = wire.decode_add(payload)
    assert (add.rid, add.prompt_ids, add.client_index) == ("r1", [1, 2, 3], 0)
    add = wire.decode_add(wire.encode_add(req, sp, client_index=2, priority=-1))
    assert (add.client_index, add.priority) == (2, -1)
    back = wire.sampling_params_from_map(sp)
    assert back.max_new_tokens == 4 and not back.ignore_eos
    with pytest.raises(wire.CodecError):
        wire.decode_add(b"\x93\x01\x02\x03")


def test_outputs_decode_tolerates_newer_trailing_fields_and_maps_finish_reasons():
    outputs = [
        ["a", [5, 6]],  # still running
        ["b", [7, 151645], None, None, None, 0, None],  # EOS
        ["c", [8], None, None, None, 0, 151643],  # stop token
        ["d", [9], None, None, None, 1, None, [{"type": 1}], None, None, None, {}, None, 0, 1, 2],
        ["e", [], None, None, None, 2, None],  # aborted by the engine
        ["f", [], None, None, None, 3, None],  # engine error
        ["g", [4], None, None, None, 4, "repetition_detected"],
    ]
    payload = msgspec.msgpack.encode([1, outputs, {"num_running_reqs": 2}, 3.5, None, ["b"], 0])
    msg = wire.decode_outputs(payload)
    assert msg.engine_index == 1 and msg.timestamp == 3.5
    batch = wire.to_batch(msg.outputs, {"a": 3, "b": 4}, {"d": 1})
    d = batch.decoded
    assert d.rids == ["a", "b", "c", "d", "e", "g"]
    assert d.tok_lens == [2, 2, 1, 1, 0, 1]
    assert d.token_ids.tolist() == [5, 6, 7, 151645, 8, 9, 4]
    assert d.prompt_tokens[:2] == [3, 4]
    f = d.finish_reasons
    assert f[0] is None
    assert f[1] == FinishReason.stop(151645)
    assert f[2] == FinishReason.stop(151643)
    assert f[3] == FinishReason.length(1)
    assert f[4].kind == "abort"
    assert f[5].openai_finish_reason == "repetition"
    assert batch.errors and batch.errors[0][0] == "f"
    assert set(batch.finished) == {"b", "c", "d", "e", "f", "g"}
    with pytest.raises(wire.CodecError):
        wire.decode_outputs(b"\x92\x00\x91\x01")
    assert wire.request_ids_in(msgspec.msgpack.encode([0, [["x", "bad"]]])) == ["x"]


def test_handshake_messages():
    assert wire.decode_handshake(wire.encode_handshake("HELLO"))["headless"] is True
    with pytest.raises(wire.CodecError):
        wire.decode_handshake(msgspec.msgpack.encode({"status": "NOPE"}))
    init = wire.encode_init(["tcp://a:1"], ["tcp://a:2"])
    assert wire.decode_init(init) == (["tcp://a:1"], ["tcp://a:2"])
    ready = wire.decode_ready_response(wire.encode_ready_response(max_model_len=77))
    assert ready["max_model_len"] == 77 and ready["data_parallel_rank"] == 0
    assert wire.engine_identity(1) == b"\x01\x00"


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"top_p": 0.0}, "top_p"),
        ({"max_new_tokens": 2, "min_new_tokens": 3}, "min_tokens"),
    ],
)
def test_what_vllm_refuses_is_a_400_before_it_reaches_the_engine(kw, param):
    with pytest.raises(ValidationError) as err:
        check_vllm_params(EngineRequest("r", [1], params(**kw)))
    assert err.value.param == param
    check_vllm_params(EngineRequest("r", [1], params(temperature=0.5)))


def test_frontend_settings_from_vllms_args():
    s = settings_from_args('{"model_tag": "m", "served_model_name": ["x"], "max_model_len": 9}')
    assert (s["model"], s["tokenizer"], s["served_model_name"], s["max_model_len"]) == (
        "m",
        "m",
        "x",
        9,
    )
    assert (s["max_header_count"], s["max_header_bytes"]) == (256, 4 << 20)  # vLLM's defaults
    s = settings_from_args(
        '{"model": "m", "h11_max_header_count": 8, "h11_max_incomplete_event_size": 1000}'
    )
    assert (s["max_header_count"], s["max_header_bytes"]) == (8, 1000)
    with pytest.raises(SystemExit):
        settings_from_args("{}")


def test_logprobs_inline_and_in_aux_frames_become_the_frames_logprob_families():
    import numpy as np

    def arr(a: np.ndarray, aux: list | None = None):
        if aux is None:
            return [a.dtype.str, list(a.shape), msgspec.msgpack.Ext(3, a.tobytes())]
        aux.append(a.tobytes())
        return [a.dtype.str, list(a.shape), len(aux) - 1]

    aux: list = [b"(the message)"]  # vLLM numbers a message's frames from its own, 0
    ids = np.array([[7, 7, 3, 9], [8, 1, 8, 2]], dtype=np.int32)  # sampled, then the top three
    lps = np.array([[-0.1, -0.1, -2.0, -3.0], [-0.5, -0.2, -0.5, -4.0]], dtype=np.float32)
    prompt_ids = np.array([[5, 5, 6, 1]], dtype=np.int64)
    prompt_lps = np.array([[-1.0, -1.0, -2.0, -2.5]], dtype=np.float32)
    outputs = [
        ["plain", [4]],
        [
            "lp",
            [7, 8],
            [arr(ids, aux), arr(lps, aux), arr(np.zeros(2, np.int32)), None],
            [arr(prompt_ids), arr(prompt_lps), arr(np.zeros(1, np.int64))],
        ],
    ]
    msg = wire.decode_outputs(msgspec.msgpack.encode([0, outputs]))
    batch = wire.to_batch(msg.outputs, {}, {}, {"lp": (2, 1)}, aux)
    d = batch.decoded
    assert d.has_extras and d.extras_at(0) is None
    ex = d.extras_at(1)
    assert ex["out_lp"]["ids"].tolist() == [7, 8]
    assert np.allclose(ex["out_lp"]["values"], [-0.1, -0.5])
    assert ex["out_topk"]["poslens"].tolist() == [2, 2]
    assert ex["out_topk"]["ids"].tolist() == [7, 3, 1, 8]
    assert ex["in_lp"]["ids"].tolist() == [5] and ex["in_topk"]["ids"].tolist() == [5]
    for bad in (5, 0):  # no such frame; the message's own
        with pytest.raises(wire.CodecError):
            wire.decode_array(["<i4", [2, 2], bad], aux)


def test_a_request_for_no_tokens_gets_none_of_the_one_vllm_makes():
    sp = wire.sampling_params_map(params(max_new_tokens=0, prompt_logprobs=1), 3, 512, EOS)
    assert sp["max_tokens"] == 1 and sp["prompt_logprobs"] == 1
    out = wire.decode_outputs(msgspec.msgpack.encode([0, [["z", [42], None, None, None, 1]]]))
    d = wire.to_batch(out.outputs, {"z": 3}, {"z": 0}).decoded
    assert d.tok_lens == [0] and d.finish_reasons[0] == FinishReason.length(0)


#: vLLM 0.32's ``SchedulerStats`` as it travels (recorded from a CPU engine in mid-stream).
RECORDED_STATS = {
    "num_running_reqs": 1,
    "num_waiting_reqs": 0,
    "num_skipped_waiting_reqs": 0,
    "num_kv_fetch_reqs_by_stage": {"waiting_to_start": 0, "in_progress": 0, "completed_waiting": 0},
    "step_counter": 0,
    "current_wave": 0,
    "kv_cache_usage": 6.103888176767214e-05,
    "iteration_details": None,
    "prefix_cache_stats": {
        "reset": False,
        "requests": 1,
        "queries": 2,
        "hits": 0,
        "preempted_requests": 0,
        "preempted_queries": 0,
        "preempted_hits": 0,
        "hits_by_source": {},
    },
    "connector_prefix_cache_stats": None,
    "kv_cache_eviction_events": [],
    "spec_decoding_stats": None,
    "kv_connector_stats": None,
    "ec_connector_stats": None,
    "waiting_lora_adapters": {},
    "running_lora_adapters": {},
    "cudagraph_stats": None,
    "perf_stats": None,
}


def test_prefix_cache_increments_read_only_the_prefix_cache_counts_of_the_stats():
    # What the step's stats add to vllm:prefix_cache_queries / _hits, read without decoding the
    # rest: the same numbers the whole decoded map gives, and nothing from what is not a map.
    assert wire.prefix_cache_increments(msgspec.msgpack.encode(RECORDED_STATS)) == (2, 0)
    made = wire.scheduler_stats_map(
        running=3, waiting=1, kv_cache_usage=0.5, prefix_queries=48, prefix_hits=16
    )
    assert wire.prefix_cache_increments(msgspec.msgpack.encode(made)) == (48, 16)
    odd = {**RECORDED_STATS, "prefix_cache_stats": {"queries": 2.5, "hits": 7, "x": [1]}}
    assert wire.prefix_cache_increments(msgspec.msgpack.encode(odd)) == (0, 7)
    for stats in (
        {**RECORDED_STATS, "prefix_cache_stats": None},
        {**RECORDED_STATS, "prefix_cache_stats": [2, 0]},
        {"num_running_reqs": 1},
        [1, 2],
        "stats",
        None,
    ):
        assert wire.prefix_cache_increments(msgspec.msgpack.encode(stats)) == (0, 0), stats
    assert wire.prefix_cache_increments(b"\xc1") == (0, 0)  # not msgpack


def test_scheduler_stats_come_with_the_engines_time_on_any_message_that_carries_them():
    # A step's message to the frontend that gets the stats (with outputs or without), and the
    # same step's message to another frontend, without: vLLM 0.32's whole layout, trailing fields
    # (finished requests, waves, weight version) included.
    with_outputs = [0, [["r", [5]]], RECORDED_STATS, 812.25, None, None, None, None, "default"]
    alone = [1, [], RECORDED_STATS, 813.5, None, ["q"], None, None, "default"]
    without = [0, [["s", [6]]], None, 812.25, None, None, None, None, "default"]
    stats, at = wire.scheduler_stats(wire.decode_outputs(msgspec.msgpack.encode(with_outputs)))
    assert stats == RECORDED_STATS and at == 812.25
    msg = wire.decode_outputs(msgspec.msgpack.encode(alone))
    assert msg.engine_index == 1 and not msg.outputs
    assert wire.scheduler_stats(msg) == (RECORDED_STATS, 813.5)
    assert wire.scheduler_stats(wire.decode_outputs(msgspec.msgpack.encode(without))) is None
    not_a_map = wire.decode_outputs(msgspec.msgpack.encode([0, [], [1, 2], 1.0]))
    assert wire.scheduler_stats(not_a_map) is None
    # The mock engine's step messages carry them the same way.
    step = wire.outputs_for_step(0, [("r", [5], None, None)], stats={"num_running_reqs": 1})
    got = wire.scheduler_stats(wire.decode_outputs(wire.encode_outputs(step)))
    assert got == ({"num_running_reqs": 1}, step.timestamp)
