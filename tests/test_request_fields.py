"""Every request field vLLM 0.32 or SGLang 0.5.23 honours is honoured or refused with a 400 naming
it: each test here fails if its field is accepted and has no effect. Frontend fields are checked
in the responses; engine fields at the engine boundary (the ``EngineRequest`` an engine that
declares them receives, and the sampling map vLLM engines get: their effect in vLLM itself is
checked against stock ``vllm serve`` in ``test_vllm_dropin.py``); on the synthetic engine, which
honours none of them, they are a 400 saying so."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import msgspec
import pytest

from tokenwire.engine import REQUEST_FIELDS, EngineRequest
from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.engine.vllm import protocol as wire
from tokenwire.runtime import Features
from tokenwire.server import ServerConfig, create_app
from tokenwire.server.extras import REFUSED, bad_words_token_ids
from tokenwire.server.openai.parse import parse_chat

from conftest import real_tokenizer
from served import run_tokenwire

MODEL = "m"


class RecordingEngine(SyntheticEngine):
    """The synthetic engine, declaring every engine-side field, keeping what it was sent."""

    supported_request_fields = REQUEST_FIELDS

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.seen: list[EngineRequest] = []

    def submit(self, request: EngineRequest) -> None:
        self.seen.append(request)
        super().submit(request)


class Server:
    def __init__(self, url: str, engine: SyntheticEngine, tok) -> None:
        self.url, self.engine, self.tok = url, engine, tok

    def post(self, path: str, body: dict, status: int = 200) -> dict:
        r = httpx.post(self.url + path, json={"model": MODEL, **body}, timeout=30)
        assert r.status_code == status, r.text
        return r.json()

    def stream(self, path: str, body: dict) -> list[dict]:
        body = {"model": MODEL, **body, "stream": True}
        with httpx.stream("POST", self.url + path, json=body, timeout=30) as r:
            lines = [x[6:] for x in r.iter_lines() if x.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        return [msgspec.json.decode(x) for x in lines[:-1]]

    def refused(self, path: str, body: dict, param: str) -> str:
        err = self.post(path, body, 400)["error"]
        assert err["param"] == param, err
        return err["message"]


@contextlib.contextmanager
def serving(engine_cls=SyntheticEngine, **config) -> Iterator[Server]:
    tok = real_tokenizer("default")
    engine = engine_cls(tok, SyntheticConfig(output="echo", step_time=0.0))
    app = create_app(tok, engine, ServerConfig(model_name=MODEL, **config))
    with run_tokenwire(app) as url:
        yield Server(url, engine, tok)


@pytest.fixture(scope="module")
def synth() -> Iterator[Server]:
    with serving(features=Features(reasoning_parser="qwen3")) as s:
        yield s


@pytest.fixture(scope="module")
def rec() -> Iterator[Server]:
    with serving(RecordingEngine, features=Features(reasoning_parser="qwen3")) as s:
        yield s


PROMPT = "one two three four five six seven eight"
CHAT = [{"role": "user", "content": "one two three"}]

# ---- refused: a 400 naming the field, on every route that takes it ------------------------------


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_fields_are_a_400_naming_them(synth, name):
    value = 2.0 if name == "length_penalty" else {"x": 1} if "kwargs" in name else True
    routes = [
        ("/v1/completions", {"prompt": "x"}),
        ("/v1/chat/completions", {"messages": CHAT}),
        ("/generate", {"text": "x"}),
    ]
    if name == "use_beam_search":  # (vLLM's routes serve it: tokenwire runs the search)
        routes = routes[2:]
    for path, body in routes:
        assert name in synth.refused(path, {**body, name: value}, name)
    # their do-nothing values are accepted
    off = 1.0 if name == "length_penalty" else False
    synth.post("/v1/completions", {"prompt": "x", "max_tokens": 1, name: off})


def test_chat_input_ids_and_beam_search(synth):
    synth.refused("/v1/chat/completions", {"messages": CHAT, "input_ids": [1, 2]}, "input_ids")
    msg = synth.refused("/generate", {"text": "x", "use_beam_search": True}, "use_beam_search")
    assert "beam search" in msg  # (SGLang's /generate has none; vLLM's routes run it)


# ---- engine fields: a 400 on an engine that cannot, carried to one that can ----------------------

ENGINE_CASES = [
    ("allowed_token_ids", [5, 6]),
    ("bad_words", ["two"]),
    ("logprob_token_ids", [5, 6]),
    ("thinking_token_budget", 4),
    ("vllm_xargs", {"k": 1}),
    ("kv_transfer_params", {"do_remote_decode": True}),
    ("repetition_detection", {"max_pattern_size": 4, "min_count": 3}),
    ("cache_salt", "salty"),
    ("data_parallel_rank", 0),
    ("session_id", "s1"),
]


@pytest.mark.parametrize(("name", "value"), ENGINE_CASES)
def test_engine_fields_are_refused_by_an_engine_that_cannot(synth, name, value):
    body = {"prompt": "x", name: value, "logprobs": 1}
    assert "engine" in synth.refused("/v1/completions", body, name)


@pytest.mark.parametrize(("name", "value"), ENGINE_CASES)
def test_engine_fields_reach_an_engine_that_can(rec, name, value):
    rec.engine.seen.clear()
    lp = name == "logprob_token_ids"
    for path, body in (
        ("/v1/completions", {"prompt": "x", "max_tokens": 2, **({"logprobs": 1} if lp else {})}),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "logprobs": lp}),
    ):
        rec.post(path, {**body, name: value})
    assert len(rec.engine.seen) == 2
    for req in rec.engine.seen:
        p = req.params
        got = {
            "allowed_token_ids": p.allowed_token_ids,
            "bad_words": p.bad_words_token_ids,
            "logprob_token_ids": p.logprob_token_ids,
            "thinking_token_budget": p.thinking_token_budget,
            "vllm_xargs": p.extra_args,
            "kv_transfer_params": p.extra_args,
            "repetition_detection": p.repetition_detection,
            "cache_salt": req.cache_salt,
            "data_parallel_rank": req.data_parallel_rank,
            "session_id": req.session_id,
        }[name]
        if name == "bad_words":
            assert got == bad_words_token_ids(value, rec.tok)
        elif name == "kv_transfer_params":
            assert got == {"kv_transfer_params": value}
        else:
            assert got == value
        # ... and goes to a vLLM engine the way vLLM's own frontend sends it
        sp = wire.sampling_params_map(p, 1, 100, wire.EngineEos(None))
        add = msgspec.msgpack.decode(wire.encode_add(req, sp))
        carried = {
            "allowed_token_ids": sp.get("allowed_token_ids"),
            "bad_words": sp.get("_bad_words_token_ids"),
            "logprob_token_ids": sp.get("logprob_token_ids"),
            "thinking_token_budget": sp.get("thinking_token_budget"),
            "vllm_xargs": sp.get("extra_args"),
            "kv_transfer_params": (sp.get("extra_args") or {}).get("kv_transfer_params"),
            "repetition_detection": sp.get("repetition_detection"),
            "cache_salt": add[7],
            "data_parallel_rank": add[8],
            "session_id": add[20] if len(add) > 20 else None,
        }[name]
        assert carried == (bad_words_token_ids(value, rec.tok) if name == "bad_words" else value)


def test_engine_field_checks(rec):
    top = rec.tok.model_vocab_size
    rec.refused("/v1/completions", {"prompt": "x", "allowed_token_ids": [top]}, "allowed_token_ids")
    rec.refused("/v1/completions", {"prompt": "x", "bad_words": [""]}, "bad_words")
    rec.refused(
        "/v1/completions", {"prompt": "x", "logprob_token_ids": [1]}, "logprob_token_ids"
    )  # (logprobs must be set)
    rec.refused("/v1/completions", {"prompt": "x", "cache_salt": ""}, "cache_salt")
    rec.refused("/v1/completions", {"prompt": "x", "vllm_xargs": {"a": {}}}, "vllm_xargs")
    body = {"prompt": "x", "repetition_detection": {"max_pattern_size": 2, "min_count": 1}}
    rec.refused("/v1/completions", body, "repetition_detection")
    # SGLang's names on /generate: token_ids_logprob (with return_logprob), max_thinking_tokens
    rec.engine.seen.clear()
    out = rec.post(
        "/generate",
        {
            "text": "x",
            "sampling_params": {"max_new_tokens": 2},
            "return_logprob": True,
            "token_ids_logprob": [7, 8],
            "max_thinking_tokens": 3,
            "cache_salt": "s",
        },
    )
    p = rec.engine.seen[0].params
    assert p.logprob_token_ids == [7, 8] and p.logprobs == 2 and p.thinking_token_budget == 3
    assert rec.engine.seen[0].cache_salt == "s"
    # (the engine's columns for those ids go out under SGLang's key)
    assert len(out["meta_info"]["output_token_ids_logprobs"][0]) == 2
    assert "output_top_logprobs" not in out["meta_info"]
    body = {"text": "x", "token_ids_logprob": [7]}
    rec.refused("/generate", body, "token_ids_logprob")


def test_thinking_budget_needs_a_reasoning_parser():
    with serving(RecordingEngine) as s:
        body = {"prompt": "x", "thinking_token_budget": 5}
        assert "--reasoning-parser" in s.refused("/v1/completions", body, "thinking_token_budget")
        s.post("/v1/completions", {"prompt": "x", "max_tokens": 1, "thinking_token_budget": -1})


# ---- frontend fields: their effect in the response -----------------------------------------------


def test_add_special_tokens_and_truncation_side(synth):
    tok = synth.tok
    ids = tok.encode(PROMPT, add_special_tokens=False)
    body = {"prompt": PROMPT, "max_tokens": 1, "return_token_ids": True}
    plain = synth.post("/v1/completions", body)["choices"][0]["prompt_token_ids"]
    assert plain == tok.encode(PROMPT)
    chat = synth.post(
        "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "return_token_ids": True}
    )
    with_special = synth.post(
        "/v1/chat/completions",
        {"messages": CHAT, "max_tokens": 1, "return_token_ids": True, "add_special_tokens": True},
    )
    # Qwen3 adds no BOS: the flag reaches the tokenizer, whose answer is the same here
    assert chat["prompt_token_ids"] == with_special["prompt_token_ids"]
    k = 3
    for side, want in ((None, ids[-k:]), ("left", ids[-k:]), ("right", ids[:k])):
        body = {
            "prompt": ids,
            "max_tokens": 1,
            "truncate_prompt_tokens": k,
            "return_token_ids": True,
            **({"truncation_side": side} if side else {}),
        }
        got = synth.post("/v1/completions", body)["choices"][0]["prompt_token_ids"]
        assert got == want, side
    synth.refused(
        "/v1/completions",
        {"prompt": "x", "truncate_prompt_tokens": 1, "truncation_side": "middle"},
        "truncation_side",
    )


def test_add_special_tokens_on_a_bos_tokenizer():
    tok = real_tokenizer("llama2")
    engine = SyntheticEngine(tok, SyntheticConfig(output="echo", step_time=0.0))
    app = create_app(tok, engine, ServerConfig(model_name=MODEL))
    with run_tokenwire(app) as url:
        s = Server(url, engine, tok)
        base = {"prompt": "hi there", "max_tokens": 1, "return_token_ids": True}
        on = s.post("/v1/completions", base)["choices"][0]["prompt_token_ids"]
        off = s.post("/v1/completions", {**base, "add_special_tokens": False})["choices"][0]
        assert on[0] == tok.bos_token_id and off["prompt_token_ids"] == on[1:]


def test_return_token_ids_streamed_and_not(synth):
    body = {"prompt": PROMPT, "max_tokens": 5, "return_token_ids": True}
    out = synth.post("/v1/completions", body)["choices"][0]
    assert len(out["token_ids"]) == 5 and out["prompt_token_ids"] == synth.tok.encode(PROMPT)
    chunks = synth.stream("/v1/completions", body)
    ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids") or []]
    assert ids == out["token_ids"]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == out["prompt_token_ids"]
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
    # chat: the prompt's ids at the top, the output's per choice
    chat = {"messages": CHAT, "max_tokens": 4, "return_token_ids": True}
    got = synth.post("/v1/chat/completions", chat)
    assert len(got["choices"][0]["token_ids"]) == 4 and got["prompt_token_ids"]
    chunks = synth.stream("/v1/chat/completions", chat)
    assert chunks[0]["prompt_token_ids"] == got["prompt_token_ids"]
    ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids") or []]
    assert ids == got["choices"][0]["token_ids"]


def test_return_prompt_token_ids_and_prompt_text(synth):
    got = synth.post(
        "/v1/chat/completions",
        {
            "messages": CHAT,
            "max_tokens": 1,
            "return_prompt_token_ids": True,
            "return_prompt_text": True,
        },
    )
    assert synth.tok.decode(got["prompt_token_ids"], False) == got["prompt_text"]
    assert got["prompt_text"].startswith("<|im_start|>user")
    out = synth.post(
        "/generate",
        {"text": "hi", "return_prompt_token_ids": True, "sampling_params": {"max_new_tokens": 1}},
    )
    assert out["prompt_token_ids"] == synth.tok.encode("hi")


def test_stream_interval_on_the_openai_routes(synth):
    body = {"prompt": PROMPT, "max_tokens": 9, "stream_interval": 4}
    chunks = synth.stream("/v1/completions", body)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    every = synth.stream("/v1/completions", {**body, "stream_interval": 1})
    assert "".join(texts) == "".join(c["choices"][0]["text"] for c in every if c["choices"])
    assert len(texts) < len(every)  # tokens 1, 5, 9: three chunks where one a token gives nine
    synth.refused("/v1/completions", {"prompt": "x", "stream_interval": 0}, "stream_interval")


def test_stop_regex_and_no_stop_trim_on_the_openai_routes(synth):
    full = synth.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8})["choices"][0]["text"]
    end = full.index("five") + 4
    # a stop regex ends the output at its match, which stays (SGLang's semantics)
    body = {"prompt": PROMPT, "max_tokens": 8, "stop_regex": "f[a-z]ve"}
    got = synth.post("/v1/completions", body)["choices"][0]
    assert got["finish_reason"] == "stop" and got["text"] == full[:end]
    assert got["stop_reason"] == "f[a-z]ve"
    chat = synth.post(
        "/v1/chat/completions", {"messages": CHAT, "max_tokens": 30, "stop_regex": r"t\w+e"}
    )["choices"][0]
    assert chat["finish_reason"] == "stop" and chat["message"]["content"].endswith("three")
    # no_stop_trim keeps a matched stop string, as include_stop_str_in_output does
    body = {"prompt": PROMPT, "max_tokens": 8, "stop": ["five"]}
    assert synth.post("/v1/completions", body)["choices"][0]["text"] == full[: end - 4]
    kept = synth.post("/v1/completions", {**body, "no_stop_trim": True})["choices"][0]
    assert kept["text"] == full[:end]
    both = {**body, "no_stop_trim": True, "include_stop_str_in_output": False}
    synth.refused("/v1/completions", both, "no_stop_trim")


def test_rid_names_the_openai_request(synth):
    got = synth.post("/v1/completions", {"prompt": "x", "max_tokens": 1, "rid": "my-rid"})
    assert got["id"] == "cmpl-my-rid"
    got = synth.post("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "rid": "r2"})
    assert got["id"] == "chatcmpl-r2"


def test_documents_and_thinking_reach_the_template():
    template = (
        "{% if documents is defined %}{% for d in documents %}[{{ d.title }}]{% endfor %}"
        "{% endif %}{% if thinking is defined %}<{{ thinking.type }}>{% endif %}"
        "{{ messages[0].content }}"
    )
    with serving(features=Features(chat_template=template)) as s:
        body = {"messages": CHAT, "max_tokens": 1, "return_prompt_text": True}
        assert s.post("/v1/chat/completions", body)["prompt_text"] == "one two three"
        got = s.post("/v1/chat/completions", {**body, "documents": [{"title": "A"}]})
        assert got["prompt_text"] == "[A]one two three"
        got = s.post("/v1/chat/completions", {**body, "thinking": {"type": "adaptive"}})
        assert got["prompt_text"] == "<adaptive>one two three"
        s.refused("/v1/chat/completions", {**body, "documents": "A"}, "documents")


def test_chat_echo(synth):
    messages = [*CHAT, {"role": "assistant", "content": "The answer:"}]
    body = {
        "messages": messages,
        "max_tokens": 3,
        "echo": True,
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    got = synth.post("/v1/chat/completions", body)["choices"][0]["message"]["content"]
    plain = synth.post("/v1/chat/completions", {**body, "echo": False})["choices"][0]
    assert got == "The answer:" + plain["message"]["content"]
    streamed = synth.stream("/v1/chat/completions", body)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in streamed if c["choices"])
    assert text == got


THINK = "<think>\nthe user wants numbers\n</think>\n\nfour five six"


def _thinking_server():
    """A synthetic engine that answers every chat with Qwen3-style thinking, then an answer."""
    tok = real_tokenizer("default")

    class Thinker(SyntheticEngine):
        def submit(self, request):
            ids = tok.encode(THINK, add_special_tokens=False)
            super().submit(
                EngineRequest(request.rid, ids, request.params, request.stream, request.priority)
            )

    return serving(Thinker, features=Features(reasoning_parser="qwen3"))


def test_include_separate_and_stream_reasoning():
    with _thinking_server() as s:
        n = len(s.tok.encode(THINK, add_special_tokens=False))
        body = {
            "messages": CHAT,
            "max_tokens": n,
            "chat_template_kwargs": {"enable_thinking": True},
        }
        msg = s.post("/v1/chat/completions", body)["choices"][0]["message"]
        assert msg["reasoning"].strip() == "the user wants numbers"
        assert msg["content"].strip() == "four five six"
        # vLLM's include_reasoning: false drops the thinking, the answer stays the answer
        msg2 = s.post("/v1/chat/completions", {**body, "include_reasoning": False})["choices"][0]
        assert "reasoning" not in msg2["message"] and msg2["message"]["content"] == msg["content"]
        # SGLang's separate_reasoning: false leaves it in the content, as written
        msg3 = s.post("/v1/chat/completions", {**body, "separate_reasoning": False})["choices"][0]
        assert msg3["message"]["content"] == THINK
        # SGLang's stream_reasoning: false sends the thinking in one delta when it ends
        deltas = [
            c["choices"][0]["delta"] for c in s.stream("/v1/chat/completions", body) if c["choices"]
        ]
        held = [
            c["choices"][0]["delta"]
            for c in s.stream("/v1/chat/completions", {**body, "stream_reasoning": False})
            if c["choices"]
        ]
        pieces = [d["reasoning"] for d in deltas if d.get("reasoning")]
        one = [d["reasoning"] for d in held if d.get("reasoning")]
        assert len(pieces) > 1 and len(one) == 1 and one[0] == "".join(pieces)
        assert "".join(d.get("content") or "" for d in held) == msg["content"]


def test_generate_with_n_above_one(synth):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 3, "n": 3}}
    out = synth.post("/generate", body)
    assert isinstance(out, list) and len(out) == 3
    assert len({o["meta_info"]["id"] for o in out}) == 3
    batch = synth.post("/generate", {**body, "text": [PROMPT, "x y"]})
    assert len(batch) == 6 and batch[0]["text"] == out[0]["text"]  # prompt 0's samples first
    with httpx.stream(
        "POST", synth.url + "/generate", json={**body, "stream": True, "rid": "nn"}, timeout=30
    ) as r:
        events = [msgspec.json.decode(x[6:]) for x in r.iter_lines() if x[6:7] == "{"]
    assert {e["index"] for e in events} == {0, 1, 2}
    ids = {e["meta_info"]["id"] for e in events}  # the samples' rids, the client's as prefix
    assert len(ids) == 3 and all(i.startswith("nn-") for i in ids)
    synth.refused("/generate", {"text": "x", "sampling_params": {"n": 0}}, "n")


def test_put_generate_and_return_cached_tokens_details(synth):
    r = httpx.put(
        synth.url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 1}}
    )
    assert r.status_code == 200 and "meta_info" in r.json()
    plain = synth.post("/v1/completions", {"prompt": "x", "max_tokens": 1})["usage"]
    assert "prompt_tokens_details" not in plain
    body = {"prompt": "x", "max_tokens": 1, "return_cached_tokens_details": True}
    assert synth.post("/v1/completions", body)["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0
    }


def test_enable_prompt_tokens_details():
    with serving(features=Features(prompt_tokens_details=True)) as s:
        usage = s.post("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1})["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


def test_annotations_are_accepted(synth):
    for name in ("custom_labels", "extra_key", "routing_key", "mm_payload", "return_token_offsets"):
        synth.post("/v1/completions", {"prompt": "x", "max_tokens": 1, name: "v"})


def test_spaces_between_special_tokens(synth):
    """Qwen3's decoder puts nothing between special tokens: false is accepted (and changes
    nothing); a WordPiece tokenizer puts spaces there, which tokenwire does not take out: a 400."""
    body = {"prompt": "x", "max_tokens": 1, "skip_special_tokens": False}
    synth.post("/v1/completions", {**body, "spaces_between_special_tokens": False})
    tok = real_tokenizer("minilm_bert")
    engine = SyntheticEngine(tok, SyntheticConfig(output="echo", step_time=0.0))
    app = create_app(tok, engine, ServerConfig(model_name=MODEL))
    with run_tokenwire(app) as url:
        s = Server(url, engine, tok)
        s.refused(
            "/v1/completions",
            {**body, "spaces_between_special_tokens": False},
            "spaces_between_special_tokens",
        )
        s.post("/v1/completions", {**body, "spaces_between_special_tokens": True})
        s.post(
            "/v1/completions",
            {"prompt": "x", "max_tokens": 1, "spaces_between_special_tokens": False},
        )


def test_sglang_structured_output_fields_on_the_openai_routes(synth, rec):
    """SGLang's top-level regex, json_schema and ebnf constrain decoding: the synthetic engine
    constrains its output to them, and they reach an engine as the grammar fields."""
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    cases = (("regex", "(yes|no)"), ("json_schema", schema), ("ebnf", 'root ::= "x"'))
    texts = []
    for name, value in cases:
        body = {"prompt": "x", "max_tokens": 30, name: value}
        texts.append(synth.post("/v1/completions", body)["choices"][0]["text"])
    assert texts[0] in ("yes", "no") and texts[2] == "x"
    assert set(msgspec.json.decode(texts[1])) <= {"a"}
    structured = []
    for name, value in cases:
        features = Features(structured_outputs=True)
        plan = parse_chat({"messages": CHAT, name: value}, rec.tok, MODEL, features=features)
        structured.append(getattr(plan.params, name))
    assert structured[0] == "(yes|no)" and '"integer"' in structured[1] and structured[2]
