"""Stop token sequences (vLLM's nested ``stop_token_ids``): the whole sequence's text is trimmed,
streamed or not, whether the engine or the frontend matches it."""

from __future__ import annotations

import httpx
import pytest

from tokenwire import FinishReason, SamplingParams, Tokenizer, ValidationError
from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.messages.egress import Done, EgressSink
from tokenwire.shard import DetokShard

from helpers import b, byte_tokenizer
from test_server_e2e import MODEL, serve
from test_shard import frame

TEXT = "VLLM is a 100% volunteer team. We are a group of people"
GROUP = b(" group of")  # a stop token sequence on the byte tokenizer


def generate(
    tok: Tokenizer,
    ids: list[int],
    stop_token_ids: list,
    *,
    engine_matches: bool,
    per_step: int = 1,
    no_stop_trim: bool = False,
    min_new_tokens: int = 0,
) -> tuple[list[str], Done, list[str]]:
    """Run ``ids`` through a shard as an engine would: one that matches the stop token ids (and,
    if ``engine_matches``, the sequences) finishes on them; otherwise the shard must stop it.
    Returns (text deltas, the final item, engine aborts)."""
    params = SamplingParams(
        stop_token_ids=stop_token_ids, no_stop_trim=no_stop_trim, min_new_tokens=min_new_tokens
    ).normalize(tok)
    aborted: list[str] = []
    shard = DetokShard(aborted.append)
    sink = EgressSink(capacity=4096)
    shard.register("r", sink, tok, b("> "), params)
    singles = [t for t in stop_token_ids if isinstance(t, int)]
    seqs = params.stop_token_sequences if engine_matches else []
    sent: list[int] = []
    step: list[int] = []
    for tid in ids:
        sent.append(tid)
        step.append(tid)
        finish = None
        may_stop = len(sent) > min_new_tokens
        ended = [s for s in seqs if sent[-len(s) :] == s] if may_stop else []
        if ended:
            finish = {"type": "stop", "matched": ended[0]}
        elif may_stop and tid in singles:
            finish = {"type": "stop", "matched": tid}
        elif len(sent) == len(ids):
            finish = {"type": "length", "length": len(ids)}
        if finish is not None or len(step) == per_step:
            shard.on_frame(frame([("r", step, finish)]))
            step = []
        if finish is not None or "r" not in shard:
            break
    items = sink.drain()
    assert isinstance(items[-1], Done)
    assert len(shard) == 0 and shard.live_slots == 0
    return [it.text for it in items], items[-1], aborted


BOTH = pytest.mark.parametrize("engine_matches", [True, False], ids=["engine", "frontend"])


@BOTH
@pytest.mark.parametrize("per_step", [1, 4])
def test_the_whole_sequence_is_trimmed(engine_matches, per_step):
    deltas, done, aborted = generate(
        byte_tokenizer(),
        b(TEXT),
        [GROUP, ord("!")],
        engine_matches=engine_matches,
        per_step=per_step,
    )
    assert "".join(deltas) == "VLLM is a 100% volunteer team. We are a"
    assert done.finish_reason == FinishReason.stop(GROUP)
    assert done.finish_reason.stop_reason() == str(GROUP)
    # The ids are all reported, the sequence's included.
    assert done.completion_tokens == len(b("VLLM is a 100% volunteer team. We are a group of"))
    assert aborted == ([] if engine_matches else ["r"])


@BOTH
def test_include_stop_str_in_output_keeps_the_sequence(engine_matches):
    deltas, done, _ = generate(
        byte_tokenizer(), b(TEXT), [GROUP], engine_matches=engine_matches, no_stop_trim=True
    )
    assert "".join(deltas) == "VLLM is a 100% volunteer team. We are a group of"
    assert done.finish_reason == FinishReason.stop(GROUP)


@BOTH
def test_a_single_id_ending_earlier_wins(engine_matches):
    # vLLM: stop_token_ids=[2318, [2318, 310, 2305]] stops on the single id.
    deltas, done, _ = generate(
        byte_tokenizer(), b(TEXT), [ord("g"), GROUP], engine_matches=engine_matches
    )
    assert "".join(deltas) == "VLLM is a 100% volunteer team. We are a "
    assert done.finish_reason == FinishReason.stop(ord("g"))


@BOTH
def test_a_sequence_ending_on_a_single_stop_id_wins(engine_matches):
    # vLLM: stop_token_ids=[2305, [2318, 310, 2305]] reports the sequence.
    deltas, done, _ = generate(
        byte_tokenizer(), b(TEXT), [ord("f"), GROUP], engine_matches=engine_matches
    )
    assert "".join(deltas) == "VLLM is a 100% volunteer team. We are a"
    assert done.finish_reason == FinishReason.stop(GROUP)


@BOTH
def test_a_broken_prefix_is_released(engine_matches):
    text = "a grove, a grouse, a group of them"
    deltas, done, _ = generate(byte_tokenizer(), b(text), [GROUP], engine_matches=engine_matches)
    assert "".join(deltas) == "a grove, a grouse, a"
    # Text that turned out not to be the sequence went out as soon as that was known.
    seen = ""
    for d in deltas:
        seen += d
        if "grove," in seen:
            break
    assert seen.endswith("grove,") or seen.endswith("grove, a")
    assert done.finish_reason == FinishReason.stop(GROUP)


@BOTH
def test_no_sequence_stop_before_min_tokens(engine_matches):
    text = " group of one, a group of two"
    deltas, done, _ = generate(
        byte_tokenizer(), b(text), [GROUP], engine_matches=engine_matches, min_new_tokens=10
    )
    assert "".join(deltas) == " group of one, a"
    assert done.finish_reason == FinishReason.stop(GROUP)


def test_length_finish_inside_a_prefix_delivers_everything():
    deltas, done, _ = generate(byte_tokenizer(), b("we are a gro"), [GROUP], engine_matches=False)
    assert "".join(deltas) == "we are a gro"
    assert done.finish_reason.kind == "length"


@pytest.mark.parametrize("engine_matches", [True, False], ids=["engine", "frontend"])
@pytest.mark.parametrize("per_step", [1, 3])
def test_real_tokenizer_multibyte_sequence(engine_matches, per_step):
    tok = Tokenizer.default()
    head = "你好, we are a"
    ids = tok.encode(head + " 世界 group of people", add_special_tokens=False)
    head_ids = tok.encode(head, add_special_tokens=False)
    assert ids[: len(head_ids)] == head_ids
    seq = ids[len(head_ids) : len(head_ids) + 3]
    deltas, done, _ = generate(tok, ids, [seq], engine_matches=engine_matches, per_step=per_step)
    assert "".join(deltas) == tok.decode(head_ids)
    assert done.finish_reason == FinishReason.stop(seq)


def test_nested_stop_token_ids_are_validated():
    p = SamplingParams.from_dict({"stop_token_ids": [5, [1, 2], [7]]})
    assert p.stop_token_ids == [5, [1, 2], [7]]
    assert p.stop_token_sequences == [[1, 2], [7]]
    assert p.for_engine(stop_token_sequences=True) is p
    assert p.for_engine(stop_token_sequences=False).stop_token_ids == [5]
    only_seq = SamplingParams.from_dict({"stop_token_ids": [[1, 2]]})
    assert only_seq.for_engine(stop_token_sequences=False).stop_token_ids is None
    for bad in ([[]], [[1, "2"]], [[1, -2]], [[1, [2]]], [list(range(65))]):
        with pytest.raises(ValidationError) as exc:
            SamplingParams.from_dict({"stop_token_ids": bad})
        assert exc.value.param == "stop_token_ids"
    with pytest.raises(ValidationError, match="stop_token_ids"):
        SamplingParams.from_dict({"stop_token_ids": [[1, 999]]}).verify(300)
    assert SamplingParams.from_wire(p.to_wire()).stop_token_ids == [5, [1, 2], [7]]


@pytest.mark.parametrize("engine_matches", [True, False], ids=["engine", "frontend"])
def test_server_trims_sequences_streamed_and_not(engine_matches):
    config = SyntheticConfig(output="echo", stop_token_sequences=engine_matches)
    with serve(config) as srv:
        prompt = "one two three four five six seven"
        ids = srv.tok.encode(prompt)
        seq = ids[2:4]
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 20, "stop_token_ids": [seq]}
        raw = httpx.post(srv.url + "/v1/completions", json=body).json()
        assert raw["choices"][0]["text"] == srv.tok.decode(ids[:2])
        assert raw["choices"][0]["finish_reason"] == "stop"
        assert raw["choices"][0]["stop_reason"] == str(seq)
        chunks = srv.client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=20,
            stream=True,
            extra_body={"stop_token_ids": [seq]},
        )
        assert "".join(c.choices[0].text for c in chunks) == srv.tok.decode(ids[:2])
        gen = httpx.post(
            srv.url + "/generate",
            json={"text": prompt, "sampling_params": {"stop_token_ids": [seq]}},
        ).json()
        assert gen["text"] == srv.tok.decode(ids[:2]) and gen["output_ids"] == ids[:4]
        assert gen["meta_info"]["finish_reason"] == {"type": "stop", "matched": seq}
