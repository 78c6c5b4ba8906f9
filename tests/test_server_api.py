"""Sans-I/O server pieces: request parsing, chat templates, chunk shapes, the synthetic engine."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from tokenwire import FinishReason, SamplingParams, Tokenizer, ValidationError
from tokenwire.chat import normalize_messages, render_chat
from tokenwire.engine import EngineRequest
from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.messages.frames import EGRESS_TAG_ERROR, decode_batch_frame
from tokenwire.runtime import Features, Runtime
from tokenwire.server import ServerConfig, fields
from tokenwire.server.generate import GenerateStreamer, parse_generate
from tokenwire.server.openai.chunks import ChunkWriter, openai_head
from tokenwire.server.openai.parse import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    chat_template_options,
    parse_chat,
    parse_completion,
)
from tokenwire.server.openai.stream import OpenAIStreamer

from conftest import real_tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.default()


def test_completion_defaults_and_mapping(tok):
    plan = parse_completion({"prompt": "Hello"}, tok, "m")
    assert plan.route == "completion" and plan.n == 1 and not plan.stream
    assert plan.prompts == [tok.encode("Hello")]
    assert plan.params.max_new_tokens == DEFAULT_COMPLETION_MAX_TOKENS
    plan = parse_completion(
        {
            "prompt": [[1, 2, 3], "text"],
            "max_tokens": 7,
            "stop": "x",
            "seed": 5,
            "min_tokens": 2,
            "include_stop_str_in_output": True,
            "top_k": -1,
            "stop_token_ids": [9],
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "someone",
            "logprobs": None,
            "echo": False,
        },
        tok,
        "m",
    )
    p = plan.params
    assert plan.prompts[0] == [1, 2, 3] and plan.choices == 4 and plan.include_usage
    assert (p.max_new_tokens, p.stop_strs, p.sampling_seed, p.min_new_tokens) == (7, ["x"], 5, 2)
    assert p.no_stop_trim and p.stop_token_ids == [9]


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"prompt": "x", "max_tokens": -1}, "max_tokens", "max_tokens must be at least 0"),
        ({"prompt": "x", "max_completion_tokens": "9"}, "max_completion_tokens", "integer"),
        ({"prompt": "x", "temperature": "hot"}, "temperature", "temperature must be a number"),
        ({"prompt": "x", "min_tokens": 5, "max_tokens": 2}, "min_tokens", "min_tokens must be"),
        ({"prompt": "x", "top_p": 0}, "top_p", "top_p must be in (0, 1]"),
        ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias", "decimal token ids"),
        ({"prompt": "x", "stop": 3}, "stop", "stop must be"),
        ({"prompt": "x", "n": 0}, "n", "n must be"),
        ({"prompt": "x", "max_tokens": 40960}, "max_tokens", "maximum context length is 40960"),
        ({"prompt": [151936]}, "prompt", "out of range"),
        ({"prompt": [-1]}, "prompt", "out of range"),
        ({"prompt": []}, "prompt", "must be a string"),
        ({"prompt": ""}, "prompt", "is empty"),
        ({"prompt": "x", "logprobs": 21}, "logprobs", "max_logprobs"),
        ({"prompt": "x", "logprobs": True}, "logprobs", "non-negative integer"),
        ({"prompt": "x", "echo": "yes"}, "echo", "boolean"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", "stream"),
        ({"prompt": "x", "max_tokens": 1, "max_completion_tokens": 1}, "max_completion_tokens", ""),
        ({}, "prompt", "prompt is required"),
    ],
)
def test_completion_errors_name_the_clients_field(tok, body, param, fragment):
    with pytest.raises(ValidationError) as info:
        parse_completion(body, tok, "m")
    assert info.value.param == param
    assert fragment in str(info.value)
    assert "max_new_tokens" not in str(info.value)


def test_ids_past_the_tokenizer_are_valid_prompts(tok):
    plan = parse_completion({"prompt": [151669, 151935, 5]}, tok, "m")
    assert plan.prompts == [[151669, 151935, 5]]


def test_chat_renders_the_tokenizers_template(tok):
    plan = parse_chat(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ]
        },
        tok,
        "m",
    )
    text = tok.decode(plan.prompts[0], skip_special_tokens=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert plan.params.max_new_tokens == 40960 - len(plan.prompts[0])
    # chat_template_kwargs reach the template (Qwen3's thinking switch)
    plan = parse_chat(
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "chat_template_kwargs": {"enable_thinking": False},
        },
        tok,
        "m",
    )
    assert tok.decode(plan.prompts[0], skip_special_tokens=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([], "non-empty list"),
        ([{"role": 5, "content": "x"}], "role must be a non-empty string"),
        ([{"role": "", "content": "x"}], "role must be a non-empty string"),
        ([{"role": "user", "content": 5}], "content must be"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "not supported"),
        ([{"role": "user"}], "content is missing"),
    ],
)
def test_chat_message_errors(tok, messages, fragment):
    with pytest.raises(ValidationError, match=fragment):
        parse_chat({"messages": messages}, tok, "m")


def test_a_custom_role_goes_to_the_template(tok):
    """vLLM's custom roles: a role OpenAI does not have is the template's business."""
    features = Features(
        chat_template="{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}"
    )
    body = {"messages": [{"role": "my-custom-role", "content": "hi"}]}
    plan = parse_chat(body, tok, "m", features=features)
    assert tok.decode(plan.prompts[0]) == "my-custom-role: hi"
    # (Qwen3's own template renders only the roles it knows, as it does in vLLM)
    assert parse_chat(body, tok, "m").prompts[0] == tok.encode(
        "<|im_start|>assistant\n", add_special_tokens=False
    )


def test_chat_template_helpers():
    msgs = normalize_messages(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    )
    assert msgs[0]["content"] == "a\nb"
    template = (
        "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        "{{ bos_token }}{% for m in messages %}{{ m.content | tojson }}{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}{{ strftime_now('%Y') | length }}"
    )
    out = render_chat(template, msgs, bos_token="<s>", eos_token="</s>")
    assert out == '<s>"a\\nb">4'
    with pytest.raises(ValidationError, match="user first"):
        render_chat(template, [{"role": "system", "content": "x"}], bos_token="", eos_token="")
    with pytest.raises(ValidationError, match="no chat template"):
        render_chat(None, msgs, bos_token="", eos_token="")
    with pytest.raises(ValidationError):  # the sandbox refuses unsafe attribute access
        render_chat("{{ ''.__class__.__mro__ }}", msgs, bos_token="", eos_token="")


def test_chat_without_template():
    tok = real_tokenizer("llama2")  # its tokenizer_config has no chat template
    with pytest.raises(ValidationError, match="no chat template"):
        parse_chat({"messages": [{"role": "user", "content": "x"}]}, tok, "m")


def test_generate_parsing(tok):
    plan = parse_generate(
        {"text": "Hi", "sampling_params": {"max_new_tokens": 3, "stop": ["\n"]}, "rid": "abc"},
        tok,
        "m",
    )
    assert plan.rids == ["abc"] and not plan.batch and plan.params.max_new_tokens == 3
    plan = parse_generate({"input_ids": [[1, 2], [3]], "rid": ["a", "b"]}, tok, "m")
    assert plan.batch and plan.prompts == [[1, 2], [3]]
    plan = parse_generate({"text": "x", "sampling_params": {"max_new_tokens": None}}, tok, "m")
    # "no limit" is the context length left after the prompt
    assert plan.params.max_new_tokens == tok.max_model_len - len(plan.prompts[0])
    with pytest.raises(ValidationError, match="unknown sampling parameter 'temprature'"):
        parse_generate({"text": "x", "sampling_params": {"temprature": 1}}, tok, "m")
    with pytest.raises(ValidationError, match="exactly one of"):
        parse_generate({"text": "x", "input_ids": [1]}, tok, "m")
    with pytest.raises(ValidationError, match="rid"):
        parse_generate({"input_ids": [[1], [2]], "rid": ["a", "a"]}, tok, "m")
    with pytest.raises(ValidationError, match="out of range"):
        parse_generate({"input_ids": [1, 10**9]}, tok, "m")


def test_chunk_writer_shapes(tok):
    plan = parse_completion({"prompt": "x", "stream": True}, tok, "model-x")
    w = ChunkWriter(plan, (151645,))
    chunk = msgspec.json.decode(w.delta(0, 'he said "hi"\n')[6:])
    assert chunk["object"] == "text_completion" and chunk["model"] == "model-x"
    assert chunk["choices"] == [
        {"index": 0, "text": 'he said "hi"\n', "logprobs": None, "finish_reason": None}
    ]
    final = msgspec.json.decode(w.final(1, "", FinishReason.stop(151645))[6:])
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["choices"][0]["stop_reason"] is None  # EOS
    final = msgspec.json.decode(w.final(1, "!", FinishReason.stop("##"))[6:])
    assert final["choices"][0]["stop_reason"] == "##" and final["choices"][0]["text"] == "!"
    chat = parse_chat(
        {
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        tok,
        "m",
    )
    w = ChunkWriter(chat, ())
    role = msgspec.json.decode(w.role(0)[6:])
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["usage"] is None
    usage = msgspec.json.decode(w.usage(3, 4)[6:])
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 7


# ---- the synthetic engine, driven directly -------------------------------------------------------


def run_engine(tok, config, requests, *, faults=()):
    """Submit ``requests`` and collect every frame until all finished."""

    async def main():
        frames: list[bytes] = []
        engine = SyntheticEngine(tok, config)
        await engine.start(frames.append)
        for r in requests:
            engine.submit(r)
        for f in faults:
            engine.inject(*f)
        for _ in range(10_000):
            await asyncio.sleep(0)
            if engine.running == 0 and engine.waiting == 0 and not engine._faults:
                break
        await engine.close()
        return frames, engine

    return asyncio.run(main())


def outputs(frames):
    per: dict[str, list[int]] = {}
    fins: dict[str, dict] = {}
    for f in frames:
        if f[0] == EGRESS_TAG_ERROR:
            continue
        d = decode_batch_frame(f)
        assert d.ok
        for e in d.events:
            per.setdefault(e.rid, []).extend(e.token_ids.tolist())
            if e.finish_reason is not None:
                fins[e.rid] = e.finish_reason.to_json()
    return per, fins


def req(rid, prompt, **kw):
    return EngineRequest(rid, prompt, SamplingParams(**kw).normalize(real_tokenizer("default")))


def test_echo_is_deterministic(tok):
    prompt = tok.encode("one two three four five six")
    frames, _ = run_engine(
        tok,
        SyntheticConfig(output="echo", max_batch_size=2),
        [
            req("a", prompt, max_new_tokens=3),
            req("b", prompt, max_new_tokens=100),
            req("c", prompt, max_new_tokens=0),
        ],
    )
    per, fins = outputs(frames)
    assert per["a"] == prompt[:3] and fins["a"] == {"type": "length", "length": 3}
    assert per["b"] == prompt and fins["b"] == {"type": "length", "length": len(prompt)}
    assert per.get("c", []) == [] and fins["c"] == {"type": "length", "length": 0}


def test_stop_tokens_eos_min_new_and_ignore_eos(tok):
    prompt = tok.encode("alpha beta gamma delta")
    stop = prompt[2]
    frames, _ = run_engine(
        tok,
        SyntheticConfig(output="echo"),
        [
            req("stop", prompt, stop_token_ids=[stop]),
            req("late", prompt, stop_token_ids=[prompt[0]], min_new_tokens=2),
        ],
    )
    per, fins = outputs(frames)
    assert per["stop"] == prompt[:3] and fins["stop"] == {"type": "stop", "matched": stop}
    assert fins["late"]["type"] == "length"  # the stop id only came before min_new_tokens
    eos = tok.eos_token_ids[0]
    frames, _ = run_engine(
        tok,
        SyntheticConfig(output="random", eos_at=4),
        [
            req("e", [1], max_new_tokens=50),
            req("i", [1], max_new_tokens=6, ignore_eos=True),
            req("m", [1], max_new_tokens=50, min_new_tokens=6),
        ],
    )
    per, fins = outputs(frames)
    assert len(per["e"]) == 4 and per["e"][-1] == eos and fins["e"]["matched"] == eos
    assert len(per["i"]) == 6 and fins["i"] == {"type": "length", "length": 6}
    assert eos not in per["m"][:6]


def test_tokens_per_step_and_batching(tok):
    frames, engine = run_engine(
        tok,
        SyntheticConfig(output="random", tokens_per_step=3, max_batch_size=2),
        [req(f"r{i}", [1], max_new_tokens=7, sampling_seed=i) for i in range(5)],
    )
    per, _fins = outputs(frames)
    assert all(len(v) == 7 for v in per.values()) and len(per) == 5
    assert max(len(decode_batch_frame(f).rids) for f in frames) == 2
    assert engine.stats["finished"] == 5
    # seeded output is reproducible
    again, _ = run_engine(
        tok,
        SyntheticConfig(output="random", tokens_per_step=3),
        [req("r1", [1], max_new_tokens=7, sampling_seed=1)],
    )
    assert outputs(again)[0]["r1"] == per["r1"]


def test_replay_reads_as_text_and_ends_with_eos(tok):
    frames, _ = run_engine(
        tok, SyntheticConfig(output="replay"), [req("r", [1], max_new_tokens=None, sampling_seed=3)]
    )
    per, fins = outputs(frames)
    assert fins["r"] == {"type": "stop", "matched": tok.eos_token_ids[0]}
    text = tok.decode(per["r"])
    assert len(text) > 10 and "\ufffd" not in text


def test_replay_with_ignore_eos_keeps_emitting_text(tok):
    frames, _ = run_engine(
        tok,
        SyntheticConfig(output="replay"),
        [req("r", [1], max_new_tokens=3000, sampling_seed=3, ignore_eos=True)],
    )
    per, fins = outputs(frames)
    assert fins["r"]["type"] == "length" and len(per["r"]) == 3000
    eos = set(tok.eos_token_ids)
    # One EOS where each passage ends, then the next passage: text, not EOS forever.
    assert sum(t in eos for t in per["r"]) < 3000 / 20
    text = tok.decode(per["r"])
    assert len(text) > 3000


def test_faults(tok):
    frames, engine = run_engine(
        tok,
        SyntheticConfig(output="echo"),
        [req("a", [5, 6, 7], max_new_tokens=3), req("b", [5, 6, 7], max_new_tokens=3)],
        faults=[("bad_id", "a"), ("error", "b")],
    )
    assert any(f[0] == EGRESS_TAG_ERROR for f in frames)
    per, _ = outputs(frames)
    assert per["a"][0] == tok.model_vocab_size
    frames, engine = run_engine(
        tok,
        SyntheticConfig(output="echo"),
        [req("a", [5, 6], max_new_tokens=2)],
        faults=[("malformed", None)],
    )
    assert not decode_batch_frame(frames[0]).ok
    frames, engine = run_engine(
        tok,
        SyntheticConfig(output="echo"),
        [req("a", [5, 6], max_new_tokens=2)],
        faults=[("crash", None)],
    )
    assert not engine.alive


def test_control_result_frames_reach_their_waiter(tok):
    from tokenwire.messages.frames import encode_result_frame

    async def main():
        rt = Runtime(tok, SyntheticEngine(tok), ServerConfig())
        fut = rt.expect_control("ctl-1")
        rt.on_output(encode_result_frame("ctl-1", b"payload"))
        rt.on_output(encode_result_frame("nobody", b"dropped"))
        return await asyncio.wait_for(fut, 1)

    assert asyncio.run(main()) == b"payload"


# ---- every OpenAI message shape renders (issue 10, item 1) ---------------------------------------

TOOL_HISTORY = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": "Weather in Paris?", "name": "bob"},
    {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def test_tool_calling_history_renders_as_the_template_expects(tok):
    plan = parse_chat({"messages": TOOL_HISTORY, "tools": TOOLS}, tok, "m")
    text = tok.decode(plan.prompts[0], skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert text.endswith(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_message_shapes_are_normalized():
    msgs = normalize_messages(
        [
            {"role": "developer", "content": "rules"},
            {"role": "assistant", "content": None, "refusal": "I can't help with that."},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": ""}}]},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "x{"}}]},
        ],
        roles=frozenset({"system", "user", "assistant"}),
    )
    assert msgs[0] == {"role": "system", "content": "rules"}
    assert msgs[1]["content"] == "I can't help with that." and "refusal" in msgs[1]
    assert msgs[2]["content"] == "No."
    assert msgs[3]["content"] == "" and msgs[3]["tool_calls"][0]["function"]["arguments"] == {}
    assert msgs[4]["tool_calls"][0]["function"]["arguments"] == "x{"  # not JSON: kept
    # a template that names the developer role keeps it
    kept = normalize_messages(
        [{"role": "developer", "content": "x"}], roles=frozenset({"developer"})
    )
    assert kept[0]["role"] == "developer"
    with pytest.raises(ValidationError, match=r"messages\[0\].tool_calls must be a list"):
        normalize_messages([{"role": "assistant", "tool_calls": "f()"}])


def test_deeply_nested_tool_call_arguments_are_a_400():
    """Arguments sent as JSON text are parsed for the template: JSON nested past what the parser
    can take is the request's 400 naming messages (it was a RecursionError, a 500)."""
    deep = "[" * 5000 + "]" * 5000
    call = {"type": "function", "function": {"name": "f", "arguments": deep}}
    with pytest.raises(ValidationError, match="nests too deeply") as info:
        normalize_messages([{"role": "assistant", "content": "", "tool_calls": [call]}])
    assert info.value.param == "messages"


@pytest.mark.parametrize("key", ["messages", "tools", "namespace", "raise_exception", "self"])
def test_chat_template_kwargs_may_not_set_what_the_renderer_sets(key):
    msgs = normalize_messages([{"role": "user", "content": "x"}])
    with pytest.raises(ValidationError, match=f"may not set '{key}'") as info:
        render_chat("{{ messages[0].content }}", msgs, bos_token="", eos_token="", extra={key: 1})
    assert info.value.param == "chat_template_kwargs"


def test_a_template_that_breaks_is_a_400_not_a_500():
    msgs = normalize_messages([{"role": "user", "content": "x"}])
    with pytest.raises(ValidationError, match="cannot render these messages") as info:
        render_chat("{{ messages[0].content + 1 }}", msgs, bos_token="", eos_token="")
    assert info.value.param == "messages"


# ---- the unknown-field policy and vLLM's request extras (issue 10, item 2) -----------------------

#: Fields real clients send that only annotate the request (accepted without a word).
ANNOTATIONS = {
    "user": "u-1",
    "metadata": {"k": "v"},
    "store": False,
    "service_tier": "flex",
    "prompt_cache_key": "conv-9",
    "safety_identifier": "hash",
    "verbosity": "low",
    "parallel_tool_calls": True,
    "modalities": ["text"],
}


def test_unknown_fields_are_ignored_and_logged_once_per_name(tok, caplog, monkeypatch):
    monkeypatch.setattr(fields, "_warned", set())
    body = {"prompt": "x", "frobnicate": True, "stream_output": True} | ANNOTATIONS
    with caplog.at_level("WARNING", logger="tokenwire.server"):
        parse_completion(body, tok, "m")
        parse_completion(body, tok, "m")
        chat = {k: v for k, v in body.items() if k != "prompt"}
        parse_chat({"messages": [{"role": "user", "content": "x"}], **chat}, tok, "m")
        parse_generate({"text": "x", "frobnicate": True, "bogus": 1}, tok, "m")
        parse_completion(
            {"prompt": "x", "stream": True, "stream_options": {"include_usage": True, "z": 1}},
            tok,
            "m",
        )
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 4, warned  # frobnicate, stream_output, bogus, options.z
    for name in ("frobnicate", "stream_output", "bogus", "stream_options.z"):
        assert sum(name in w for w in warned) == 1
    assert not any(key in " ".join(warned) for key in ANNOTATIONS)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"chat_template": "{{ messages }}"}, "chat_template"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"priority": "high"}, "priority"),
        ({"request_id": ""}, "request_id"),
        ({"request_id": "x" * 257}, "request_id"),
        ({"return_tokens_as_token_ids": "yes"}, "return_tokens_as_token_ids"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": 40961}, "truncate_prompt_tokens"),
        ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
        ({"add_generation_prompt": "no"}, "add_generation_prompt"),
        ({"stream_options": {"include_usage": 1}}, "stream_options"),
    ],
)
def test_known_fields_with_values_we_cannot_honour_are_400s(tok, extra, param):
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True} | extra
    with pytest.raises(ValidationError) as info:
        parse_chat(body, tok, "m")
    assert info.value.param == param


def test_request_id_priority_and_token_id_flag(tok):
    plan = parse_completion(
        {"prompt": "x", "request_id": "my-req", "priority": -3, "return_tokens_as_token_ids": True},
        tok,
        "m",
    )
    assert plan.id == "my-req" and openai_head(plan, chunk=False)["id"] == "cmpl-my-req"
    assert plan.priority == -3 and plan.return_tokens_as_token_ids
    chat = parse_chat(
        {"messages": [{"role": "user", "content": "x"}], "request_id": "c1"}, tok, "m"
    )
    assert openai_head(chat, chunk=True)["id"] == "chatcmpl-c1" and chat.priority == 0
    assert parse_generate({"text": "x", "priority": 7}, tok, "m").priority == 7


def test_truncate_prompt_tokens_keeps_the_end(tok):
    ids = tok.encode("one two three four five six seven")
    plan = parse_completion({"prompt": ids, "truncate_prompt_tokens": 3}, tok, "m")
    assert plan.prompts == [ids[-3:]]
    plan = parse_completion({"prompt": ["a b c d e", ids], "truncate_prompt_tokens": 2}, tok, "m")
    assert plan.prompts == [tok.encode("a b c d e")[-2:], ids[-2:]]
    plan = parse_completion({"prompt": ids, "truncate_prompt_tokens": -1}, tok, "m")
    assert plan.prompts == [ids]
    chat = parse_chat(
        {"messages": [{"role": "user", "content": "Hello"}], "truncate_prompt_tokens": 3}, tok, "m"
    )
    assert tok.decode(chat.prompts[0], skip_special_tokens=False) == "<|im_start|>assistant\n"


def test_continue_final_message_leaves_the_last_message_open(tok):
    messages = [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "One, two,"},
    ]
    plan = parse_chat({"messages": messages, "continue_final_message": True}, tok, "m")
    text = tok.decode(plan.prompts[0], skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nOne, two,")
    closed = parse_chat({"messages": messages, "add_generation_prompt": False}, tok, "m")
    assert tok.decode(closed.prompts[0], skip_special_tokens=False).endswith("two,<|im_end|>\n")
    with pytest.raises(ValidationError, match="final message is empty"):
        parse_chat(
            {
                "messages": [*messages[:1], {"role": "assistant", "content": ""}],
                "continue_final_message": True,
            },
            tok,
            "m",
        )


@pytest.mark.parametrize(
    ("content", "opened"),
    [
        ("One, two,", "One, two,"),
        ([{"type": "text", "text": "One, two,"}], "One, two,"),
        # (text parts are joined with a newline, as vLLM does)
        ([{"type": "text", "text": "One,"}, {"type": "text", "text": " two,"}], "One,\n two,"),
    ],
)
def test_continue_final_message_with_a_template_that_loops_over_content(tok, content, opened):
    """A template that takes content as a list of parts (Gemma's) gets it so; the final message
    still stays open (it was an AttributeError, a 500)."""
    features = Features(
        chat_template=(
            "{% for m in messages %}<{{ m.role }}>{% for p in m.content %}{{ p.text }}"
            "{% endfor %}</{{ m.role }}>{% endfor %}"
        )
    )
    messages = [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": content},
    ]
    body = {"messages": messages, "continue_final_message": True}
    plan = parse_chat(body, tok, "m", features=features)
    text = tok.decode(plan.prompts[0], skip_special_tokens=False)
    assert text == "<user>Count to three.</user><assistant>" + opened


def test_reasoning_effort_reaches_the_template():
    template = "{{ reasoning_effort | default('unset') }}|{{ add_generation_prompt }}"
    msgs = normalize_messages([{"role": "user", "content": "x"}])
    body = {"reasoning_effort": "low"}
    assert (
        render_chat(template, msgs, bos_token="", eos_token="", **chat_template_options(body))
        == "low|True"
    )
    body = {"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}}
    assert (
        render_chat(template, msgs, bos_token="", eos_token="", **chat_template_options(body))
        == "high|True"
    )
    assert (
        render_chat(template, msgs, bos_token="", eos_token="", **chat_template_options({}))
        == "unset|True"
    )


def test_continuous_usage_chunks(tok):
    plan = parse_completion(
        {
            "prompt": ["a b", "c"],
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
        tok,
        "m",
    )
    assert plan.continuous_usage
    w = ChunkWriter(plan, ())
    chunk = msgspec.json.decode(w.delta(2, "hi", 5)[6:])  # choice 2: the second prompt
    assert chunk["usage"] == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}
    final = msgspec.json.decode(w.final(1, "", FinishReason.length(7), 7)[6:])
    assert final["usage"]["prompt_tokens"] == 2 and final["usage"]["completion_tokens"] == 7
    # without include_usage, continuous_usage_stats asks for nothing (vLLM's rule)
    plan = parse_completion(
        {"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": True}},
        tok,
        "m",
    )
    assert not plan.continuous_usage and "usage" not in msgspec.json.decode(
        ChunkWriter(plan, ()).delta(0, "x", 1)[6:]
    )


def test_synthetic_engine_admits_by_priority(tok):
    frames, _ = run_engine(
        tok,
        SyntheticConfig(output="echo", max_batch_size=1),
        [
            EngineRequest(r, [5, 6], req(r, [5, 6], max_new_tokens=2).params, priority=p)
            for r, p in (("late", 5), ("first", -1), ("mid", 0))
        ],
    )
    order = []
    for f in frames:
        for rid in decode_batch_frame(f).rids:
            if rid not in order:
                order.append(rid)
    assert order == ["first", "mid", "late"]


# ---- replay output reads like text (issue 10, item 7) --------------------------------------------


def _replayed(tok, prompts, **kw):
    frames, _ = run_engine(
        tok,
        SyntheticConfig(output="replay"),
        [req(f"r{k}", p, max_new_tokens=None, **kw) for k, p in enumerate(prompts)],
    )
    per, _ = outputs(frames)
    return [tok.decode(per[f"r{k}"]) for k in range(len(prompts))], per


def test_replay_is_natural_text_chosen_by_prompt_and_seed(tok):
    from tokenwire.engine.synthetic import replay_passages

    passages = replay_passages()
    assert len(passages) >= 30 and len({p[:1] for p in passages}) > 5  # several scripts
    prompts = [tok.encode(f"Question number {k}: tell me something.") for k in range(12)]
    texts, per = _replayed(tok, prompts, temperature=0.0)
    assert all(t in passages for t in texts)  # a whole passage, then EOS
    assert len(set(texts)) >= 6  # different prompts read differently
    again, _ = _replayed(tok, prompts, temperature=0.0)
    assert again == texts  # greedy: the same prompt reads the same
    one = [prompts[0]] * 6
    same_seed, _ = _replayed(tok, one, sampling_seed=7)
    assert len(set(same_seed)) == 1
    by_seed = {_replayed(tok, [prompts[0]], sampling_seed=s)[0][0] for s in range(12)}
    assert len(by_seed) >= 4  # the seed moves it too
    # the output re-tokenizes to its own length (what benchmark clients count)
    for k, text in enumerate(texts):
        assert len(tok.encode(text, add_special_tokens=False)) == len(per[f"r{k}"]) - 1  # + EOS


def test_replay_text_is_licensed():
    from importlib import resources

    notice = (resources.files("tokenwire") / "_data" / "replay" / "NOTICE").read_text()
    assert "Apache License 2.0" in notice and "CC0" in notice


# ---- a stream's waiting deltas go out as one chunk (vLLM merges what a stream has not taken) ----


def _sse(raw: bytes) -> list[dict]:
    """The JSON events of SSE bytes (``[DONE]`` left out)."""
    lines = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    return [msgspec.json.decode(e) for e in lines if e != "[DONE]"]


def _stream_events(tok, body: dict, batches: list[list]) -> list[dict]:
    """The SSE events an OpenAI stream writes for ``batches`` of ``(choice, item)`` pairs."""
    from tokenwire.messages.egress import EgressSink

    rt = Runtime(tok, SyntheticEngine(tok), ServerConfig())
    parse = parse_chat if "messages" in body else parse_completion
    plan = parse(body | {"model": "m", "stream": True}, tok, "m")
    subs = [(f"r{k}", k // plan.n, EgressSink()) for k in range(plan.choices)]
    streamer = OpenAIStreamer(rt, plan, subs, tuple(tok.eos_token_ids))
    return _sse(streamer.head() + b"".join(streamer.feed(batch) for batch in batches))


def _items(rid: str, pieces: list[str], finish: FinishReason | None = None) -> list:
    """A choice's items, one token each; the last a ``Done`` when ``finish`` is given."""
    from tokenwire.messages.egress import Done, Frame

    items = [Frame(rid, [k], None, 3, text, k + 1) for k, text in enumerate(pieces)]
    if finish is not None:
        last = items[-1]
        items[-1] = Done(rid, last.token_ids, finish, 3, last.text, last.completion_tokens)
    return items


def _texts(events: list[dict]) -> list[tuple[int, str]]:
    out = []
    for event in events:
        for choice in event["choices"]:
            text = choice["text"] if "text" in choice else choice["delta"].get("content")
            if text:
                out.append((choice["index"], text))
    return out


@pytest.mark.parametrize("route", ["completion", "chat"])
def test_waiting_plain_deltas_go_out_as_one_chunk(tok, route):
    body = {"max_tokens": 5} | (
        {"prompt": "hi"}
        if route == "completion"
        else {"messages": [{"role": "user", "content": "hi"}]}
    )
    items = _items("r0", ["a", "b", "c", "d", "e"], FinishReason.length(5))
    events = _stream_events(tok, body, [[(0, i) for i in items[:3]], [(0, i) for i in items[3:]]])
    # Three waiting deltas: one chunk; a delta waiting with the final item: in the final chunk.
    assert _texts(events) == [(0, "abc"), (0, "de")]
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_deltas_of_different_choices_stay_apart_and_in_order(tok):
    a = _items("r0", ["a1", "a2", "a3", ""], FinishReason.length(4))
    b = _items("r1", ["b1", "b2", "", ""], FinishReason.length(4))
    batch = [(0, a[0]), (0, a[1]), (1, b[0]), (0, a[2]), (1, b[1]), (1, b[2])]
    events = _stream_events(tok, {"prompt": "hi", "n": 2}, [batch, [(0, a[3]), (1, b[3])]])
    assert _texts(events) == [(0, "a1a2"), (1, "b1"), (0, "a3"), (1, "b2")]
    assert [e["choices"][0]["finish_reason"] for e in events[-2:]] == ["length", "length"]


def test_chunks_with_logprobs_or_an_echo_are_not_merged(tok):
    items = _items("r0", ["a", "b", "c"])
    batch = [(0, i) for i in items]
    lp = _stream_events(tok, {"prompt": "hi", "logprobs": 1}, [batch])
    assert _texts(lp) == [(0, "a"), (0, "b"), (0, "c")]
    # The echoed prompt rides on the first chunk; the deltas after it merge.
    echo = _stream_events(tok, {"prompt": "hi", "echo": True}, [batch])
    assert _texts(echo) == [(0, "hia"), (0, "bc")]


def test_generate_stream_writes_the_newest_of_the_waiting_items(tok):
    from tokenwire.messages.egress import EgressSink, Error

    rt = Runtime(tok, SyntheticEngine(tok), ServerConfig())
    plan = parse_generate({"text": "hi", "stream": True}, tok, "m")
    streamer = GenerateStreamer(rt, plan, [("r0", 0, EgressSink())])
    items = _items("r0", ["a", "b", "c", "d"], FinishReason.length(4))

    # Every chunk carries everything so far: of three waiting items, the newest says it all.
    first = _sse(streamer.feed([(0, i) for i in items[:3]]))
    assert [(e["text"], e["output_ids"]) for e in first] == [("abc", [0, 1, 2])]
    assert first[0]["meta_info"]["completion_tokens"] == 3
    last = _sse(streamer.feed([(0, items[3])]))
    assert [(e["text"], e["meta_info"]["finish_reason"]["type"]) for e in last] == [
        ("abcd", "length")
    ]
    # An error after waiting items: the text so far still goes out before it.
    streamer = GenerateStreamer(rt, plan, [("r0", 0, EgressSink())])
    failed = _sse(streamer.feed([(0, items[0]), (0, items[1]), (0, Error(ValidationError("x")))]))
    assert [e.get("text") for e in failed] == ["ab", None]
