"""Structured outputs: validated in the frontend, passed to an engine that constrains decoding
(the synthetic one does, with llguidance), refused with a 400 naming the field by one that
cannot, or when the engine's grammar library refuses the grammar."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.messages.errors import ValidationError
from tokenwire.structured import (
    MAX_CHOICES,
    MAX_REGEX_BYTES,
    check_grammar_params,
    structured_fields,
)

from test_server_e2e import MODEL, serve

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}, "n": {"type": "integer"}},
    "required": ["city"],
}
RF = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"response_format": {"type": "text"}}, {}),
        ({"response_format": {"type": "json_object"}}, {"json_schema": '{"type":"object"}'}),
        ({"response_format": RF}, {"json_schema": json.dumps(SCHEMA, separators=(",", ":"))}),
        ({"structured_outputs": {"regex": "[0-9]+"}}, {"regex": "[0-9]+"}),
        ({"structured_outputs": {"choice": ["yes", "no?"]}}, {"regex": "(?:yes|no\\?)"}),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, {"ebnf": 'root ::= "a"'}),
        (
            {"structured_outputs": {"json": json.dumps(SCHEMA)}},
            {"json_schema": json.dumps(SCHEMA, separators=(",", ":"))},
        ),
        ({"guided_json": SCHEMA}, {"json_schema": json.dumps(SCHEMA, separators=(",", ":"))}),
        ({"guided_regex": "a|b"}, {"regex": "a|b"}),
        ({"guided_choice": ["x"]}, {"regex": "(?:x)"}),
        ({"guided_grammar": "root ::= x"}, {"ebnf": "root ::= x"}),
    ],
)
def test_accepted_with_an_engine_that_constrains(body, expected) -> None:
    assert structured_fields(body, supported=True) == expected
    if expected:
        with pytest.raises(ValidationError) as exc:
            structured_fields(body, supported=False)
        assert exc.value.param == next(iter(body))
        assert "constrains decoding" in exc.value.detail


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}},
            "response_format",
        ),
        (
            {"response_format": RF | {"json_schema": RF["json_schema"] | {"strict": "yes"}}},
            "response_format",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "thing"}},
                }
            },
            "response_format",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"properties": []}},
                }
            },
            "response_format",
        ),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_json": {"type": "object", "required": "city"}}, "guided_json"),
        ({"guided_json": {"properties": {"a": {"pattern": "(unclosed"}}}}, "guided_json"),
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"guided_regex": "a" * (MAX_REGEX_BYTES + 1)}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": ["a"] * (MAX_CHOICES + 1)}, "guided_choice"),
        ({"guided_grammar": "  "}, "guided_grammar"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": "json"}, "structured_outputs"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ],
)
def test_malformed_is_a_400_naming_the_field(body, param) -> None:
    for supported in (True, False):
        with pytest.raises(ValidationError) as exc:
            structured_fields(body, supported=supported)
        assert exc.value.param.startswith(param), exc.value


def test_deep_schema_is_bounded() -> None:
    schema: dict = {"type": "object"}
    for _ in range(40):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(ValidationError) as exc:
        structured_fields({"guided_json": schema}, supported=True)
    assert "deeper" in exc.value.detail


@pytest.mark.parametrize(
    "body",
    [
        {"guided_json": {"enum": [json.loads("[" * 900 + "]" * 900)]}},
        {"guided_json": "[" * 5000 + "]" * 5000},
        {"structured_outputs": {"json": {"const": json.loads("[" * 900 + "]" * 900)}}},
        {"structured_outputs": {"structural_tag": {"x": json.loads("[" * 900 + "]" * 900)}}},
        {"response_format": RF | {"json_schema": {"name": "x", "schema": "[" * 3000 + "]" * 3000}}},
    ],
)
def test_deeply_nested_values_are_a_400(body) -> None:
    """A schema's values (enum, const...) and its JSON text nest within bounds: a 400 naming the
    field, never a RecursionError (a 500)."""
    with pytest.raises(ValidationError) as exc:
        structured_fields(body, supported=True)
    assert exc.value.param.startswith(next(iter(body))), exc.value
    assert "nests" in exc.value.detail


@pytest.mark.parametrize("text", ['{"maximum": NaN}', '{"maximum": Infinity}', '{"x": 1e999}'])
def test_schema_text_is_strict_json(text) -> None:
    """A schema sent as text is JSON: NaN and Infinity are no JSON an engine takes (and were
    passed on as written)."""
    with pytest.raises(ValidationError) as exc:
        structured_fields({"guided_json": text}, supported=True)
    assert exc.value.param == "guided_json"
    with pytest.raises(ValidationError) as exc:
        check_grammar_params({"json_schema": text}, supported=True)
    assert exc.value.param == "json_schema"


def test_sglang_grammar_params() -> None:
    check_grammar_params({"regex": "[a-z]+"}, supported=True)
    check_grammar_params({"json_schema": ""}, supported=False)  # empty: not asked for
    for sp, param in (
        ({"regex": "[a-z]+"}, "regex"),
        ({"json_schema": json.dumps(SCHEMA)}, "json_schema"),
        ({"ebnf": "root ::= x"}, "ebnf"),
    ):
        with pytest.raises(ValidationError) as exc:
            check_grammar_params(sp, supported=False)
        assert exc.value.param == param
    with pytest.raises(ValidationError) as exc:
        check_grammar_params({"json_schema": "{"}, supported=True)
    assert exc.value.param == "json_schema"


# ---- end to end ----------------------------------------------------------------------------------


class _Unconstrained(SyntheticEngine):
    """A synthetic engine that says it cannot constrain decoding."""

    supports_structured_outputs = False


def test_an_engine_that_cannot_constrain_refuses_structured_outputs(monkeypatch) -> None:
    from test_server_tools import END, TOOLS
    from tokenwire.runtime import Features

    import test_server_e2e

    monkeypatch.setattr(test_server_e2e, "SyntheticEngine", _Unconstrained)
    features = Features(chat_template="{{ messages[-1]['content'] }}")
    with serve(SyntheticConfig(output="echo"), features=features) as s:
        with pytest.raises(openai.BadRequestError) as exc:
            s.client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "weather?"}],
                response_format=RF,
                max_tokens=5,
            )
        assert exc.value.body["param"] == "response_format"
        with pytest.raises(openai.BadRequestError) as exc:
            s.client.completions.create(
                model=MODEL, prompt="x", max_tokens=2, extra_body={"guided_choice": ["a", "b"]}
            )
        assert exc.value.body["param"] == "guided_choice"
        r = httpx.post(
            s.url + "/generate",
            json={"text": "x", "sampling_params": {"regex": "[0-9]+", "max_new_tokens": 2}},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "regex"
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            with pytest.raises(openai.BadRequestError) as exc:
                s.client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "hi" + END}],
                    tools=TOOLS,
                    tool_choice=choice,
                )
            body = exc.value.body
            assert body["param"] == "tool_choice" and "structured output" in body["message"]


def test_the_synthetic_engine_constrains_on_every_route() -> None:
    """Each form reaches the engine and comes back as a sentence of its grammar; a grammar the
    engine's grammar library refuses is a 400 naming the field as the client sent it."""
    with serve(SyntheticConfig()) as s:
        r = s.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "weather?"}], response_format=RF
        )
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
        r = s.client.completions.create(
            model=MODEL, prompt="x", extra_body={"guided_choice": ["yes", "no?"]}
        )
        assert r.choices[0].text in ("yes", "no?")
        r = s.client.completions.create(
            model=MODEL, prompt="x", extra_body={"structured_outputs": {"regex": "[0-9]{4}"}}
        )
        assert re.fullmatch("[0-9]{4}", r.choices[0].text)
        r = s.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"guided_grammar": 'root ::= "n=" [0-9]+'},
        )
        assert re.fullmatch("n=[0-9]+", r.choices[0].message.content)
        r = httpx.post(
            s.url + "/generate",
            json={"text": "x", "sampling_params": {"json_schema": json.dumps(SCHEMA)}},
        )
        jsonschema.validate(json.loads(r.json()["text"]), SCHEMA)
        r = httpx.post(
            s.url + "/generate",
            json={"text": "x", "sampling_params": {"ebnf": 'root ::= "a" | "b"'}},
        )
        assert r.json()["text"] in ("a", "b")
        chunks = s.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "weather?"}],
            response_format={"type": "json_object"},
            stream=True,
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert isinstance(json.loads(text), dict)
        for body, param in (
            ({"guided_grammar": "root ::= ("}, "guided_grammar"),
            ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs"),
            ({"guided_json": {"$ref": "#/nope"}}, "guided_json"),
        ):
            with pytest.raises(openai.BadRequestError) as exc:
                s.client.completions.create(model=MODEL, prompt="x", extra_body=body)
            assert exc.value.body["param"] == param and "llguidance" in exc.value.body["message"]
        r = httpx.post(
            s.url + "/generate", json={"text": "x", "sampling_params": {"ebnf": "root ::= ("}}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "ebnf"
        bad_tool = [
            {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nope"}}}
        ]
        with pytest.raises(openai.BadRequestError) as exc:
            s.client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "x"}],
                tools=bad_tool,
                tool_choice="required",
            )
        assert exc.value.body["param"] == "tool_choice"


class _Constraining(SyntheticEngine):
    """A synthetic engine that says it constrains decoding, and records what it was asked."""

    supports_structured_outputs = True

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.seen: list = []

    def submit(self, request) -> None:
        self.seen.append(request.params)
        super().submit(request)


def test_an_engine_that_constrains_gets_the_grammar(monkeypatch) -> None:
    import test_server_e2e

    monkeypatch.setattr(test_server_e2e, "SyntheticEngine", _Constraining)
    with serve(SyntheticConfig(output="echo")) as s:
        s.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "weather?"}],
            response_format=RF,
            max_tokens=16,
        )
        s.client.completions.create(
            model=MODEL, prompt="x", max_tokens=2, extra_body={"guided_choice": ["a", "b"]}
        )
        r = httpx.post(
            s.url + "/generate",
            json={"text": "x", "sampling_params": {"regex": "[0-9]+", "max_new_tokens": 2}},
        )
        assert r.status_code == 200
        seen = s.engine.seen
        assert json.loads(seen[0].json_schema) == SCHEMA
        assert seen[1].regex == "(?:a|b)"
        assert seen[2].regex == "[0-9]+"


def test_tool_choice_required_and_named_with_an_engine_that_constrains(monkeypatch) -> None:
    from test_server_tools import END, TOOLS
    from tokenwire.parsers.tools.forced import required_schema
    from tokenwire.runtime import Features

    import test_server_e2e

    monkeypatch.setattr(test_server_e2e, "SyntheticEngine", _Constraining)
    features = Features(chat_template="{{ messages[-1]['content'] }}")
    with serve(SyntheticConfig(output="echo"), features=features) as s:

        def chat(text: str, choice, **kw):
            return s.client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": text + END}],
                tools=TOOLS,
                tool_choice=choice,
                max_tokens=100,
                **kw,
            )

        r = chat('[{"name": "get_weather", "parameters": {"city": "Paris"}}]', "required")
        assert json.loads(s.engine.seen[-1].json_schema) == required_schema(TOOLS)
        (call,) = r.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "get_weather",
            {"city": "Paris"},
        )
        assert r.choices[0].finish_reason == "tool_calls"
        named = {"type": "function", "function": {"name": "get_weather"}}
        r = chat('{"city": "巴黎"}', named)
        assert json.loads(s.engine.seen[-1].json_schema) == TOOLS[0]["function"]["parameters"]
        (call,) = r.choices[0].message.tool_calls
        assert call.function.arguments == '{"city": "巴黎"}'
        # Streamed: the same call.
        args = ""
        for chunk in chat('{"city": "巴黎"}', named, stream=True):
            for tc in chunk.choices[0].delta.tool_calls or []:
                args += tc.function.arguments or ""
        assert args == '{"city": "巴黎"}'
        # With response_format too, the tool constraint wins (stock vLLM and OpenAI answer 200;
        # the Agents SDK sends both with output_type and tool_choice="required")
        text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
        for rf in ({"type": "json_object"}, RF):
            r = chat(text, "required", response_format=rf)
            assert json.loads(s.engine.seen[-1].json_schema) == required_schema(TOOLS)
            assert s.engine.seen[-1].regex is None
            (call,) = r.choices[0].message.tool_calls
            assert call.function.name == "get_weather"
        r = chat('{"city": "Oslo"}', named, response_format=RF)
        assert json.loads(s.engine.seen[-1].json_schema) == TOOLS[0]["function"]["parameters"]
        assert r.choices[0].message.tool_calls[0].function.arguments == '{"city": "Oslo"}'
        # Responses: text.format with a forced function tool
        tool = {"type": "function", **TOOLS[0]["function"]}
        got = httpx.post(
            s.url + "/v1/responses",
            json={
                "model": MODEL,
                "input": text + END,
                "tools": [tool],
                "tool_choice": "required",
                "text": {"format": {"type": "json_schema", "name": "w", "schema": SCHEMA}},
                "max_output_tokens": 100,
            },
        )
        assert got.status_code == 200, got.text
        assert json.loads(s.engine.seen[-1].json_schema) == required_schema(TOOLS)
        calls = [o for o in got.json()["output"] if o["type"] == "function_call"]
        assert [c["name"] for c in calls] == ["get_weather"]


class _CutShort(_Constraining):
    """Says it constrains, but decodes as an unconstrained model would (the synthetic engine's
    own constrained decoding always finishes its JSON within ``max_tokens``, and refuses a
    grammar that cannot): the echo engine's output is then the prompt's first ``max_tokens``
    tokens, a call cut short, as a real engine's may be."""

    async def check_grammar(self, params, client=None) -> None:
        return None  # (it constrains nothing, so it refuses no grammar)

    def submit(self, request) -> None:
        request.params.json_schema = None
        super().submit(request)


def test_a_forced_tool_call_cut_by_max_tokens_is_no_content_and_no_calls(monkeypatch) -> None:
    """vLLM's answer: the fragment is not the answer; finish reason length says why (chat,
    streamed chat, Messages, Responses)."""
    from test_server_tools import END, TOOLS
    from tokenwire.runtime import Features

    import test_server_e2e

    monkeypatch.setattr(test_server_e2e, "SyntheticEngine", _CutShort)
    features = Features(chat_template="{{ messages[-1]['content'] }}")
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]' + END
    named = {"type": "function", "function": {"name": "get_weather"}}
    with serve(SyntheticConfig(output="echo"), features=features) as s:
        for choice in ("required", named):
            kw = {
                "model": MODEL,
                "messages": [{"role": "user", "content": text}],
                "tools": TOOLS,
                "tool_choice": choice,
                "max_tokens": 4,
            }
            r = s.client.chat.completions.create(**kw)
            assert r.choices[0].finish_reason == "length"
            assert not r.choices[0].message.content and not r.choices[0].message.tool_calls
            chunks = list(s.client.chat.completions.create(**kw, stream=True))
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            assert not "".join(d.content or "" for d in deltas)
            assert not any(d.tool_calls for d in deltas)
            assert chunks[-1].choices[0].finish_reason == "length"
        tool = {"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}
        got = httpx.post(
            s.url + "/v1/messages",
            json={
                "model": MODEL,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": text}],
                "tools": [tool],
                "tool_choice": {"type": "any"},
            },
        ).json()
        assert got["stop_reason"] == "max_tokens", got
        assert not [b for b in got["content"] if b.get("text") or b["type"] == "tool_use"], got
        got = httpx.post(
            s.url + "/v1/responses",
            json={
                "model": MODEL,
                "input": text,
                "tools": [{"type": "function", **TOOLS[0]["function"]}],
                "tool_choice": "required",
                "max_output_tokens": 4,
            },
        ).json()
        assert got["status"] == "incomplete", got
        assert got["incomplete_details"] == {"reason": "max_output_tokens"}
        kinds = [(o["type"], c.get("text")) for o in got["output"] for c in o.get("content") or []]
        assert not [o for o in got["output"] if o["type"] == "function_call"], got
        assert not [t for _, t in kinds if t], got


def test_langchain_with_structured_output() -> None:
    """LangChain's ``with_structured_output`` (JSON schema, function calling, JSON mode): the echo
    engine's output is the prompt when it satisfies the constraint."""
    lc = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel

    from tokenwire.runtime import Features

    class Weather(BaseModel):
        city: str
        days: int

    features = Features(chat_template="{{ messages[-1]['content'] }}<|im_end|>")
    question = '{"city": "巴黎", "days": 3}'
    with serve(SyntheticConfig(output="echo"), features=features) as s:
        llm = lc.ChatOpenAI(base_url=s.url + "/v1", api_key="none", model=MODEL, max_retries=0)
        for method in ("json_schema", "function_calling"):
            got = llm.with_structured_output(Weather, method=method).invoke(question)
            assert got == Weather(city="巴黎", days=3), method
        got = llm.with_structured_output(None, method="json_mode").invoke(question)
        assert got == {"city": "巴黎", "days": 3}


def test_openai_client_parse() -> None:
    """The openai client's ``.parse`` (a Pydantic model as response_format)."""
    from pydantic import BaseModel

    from tokenwire.runtime import Features

    class Weather(BaseModel):
        city: str
        days: int

    features = Features(chat_template="{{ messages[-1]['content'] }}<|im_end|>")
    messages = [{"role": "user", "content": '{"city": "Zürich", "days": 2}'}]
    with serve(SyntheticConfig(output="echo"), features=features) as s:
        r = s.client.chat.completions.parse(model=MODEL, messages=messages, response_format=Weather)
        assert r.choices[0].message.parsed == Weather(city="Zürich", days=2)
