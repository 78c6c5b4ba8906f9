"""End to end with the official ``openai`` client: tool calls and reasoning parsed from what "the
model" writes. The synthetic engine echoes its prompt and a chat template that renders only the
last message's text makes the prompt exactly the markup a test wants the model to emit."""

from __future__ import annotations

import httpx
import openai
import pytest

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.runtime import Features

from test_server_e2e import MODEL, serve

#: The last message's text, as is: the echo engine then "answers" with exactly that text.
ECHO_TEMPLATE = "{{ messages[-1]['content'] }}"
END = "<|im_end|>"  # Qwen3's EOS: the echo ends with it and the choice finishes with "stop"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ARGS = '{"city": "巴黎 🌧", "unit": "°C"}'
CALL = f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>'
THINK = "<think>\nThe user wants weather 🤔.\n</think>\n\n"


def _features(**kw) -> Features:
    return Features(chat_template=ECHO_TEMPLATE, **kw)


@pytest.fixture(scope="module")
def tools_server():
    features = _features(
        tool_call_parser="hermes", enable_auto_tool_choice=True, reasoning_parser="qwen3"
    )
    with serve(SyntheticConfig(output="echo"), features=features) as s:
        yield s


@pytest.fixture(scope="module")
def plain_server():
    with serve(SyntheticConfig(output="echo"), features=_features()) as s:
        yield s


def _chat(s, text: str, **kw):
    return s.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=200, **kw
    )


def _stream(s, text: str, **kw):
    """Content, reasoning, tool calls (merged from their deltas), finish reason, usage, and the
    raw deltas of a streamed chat."""
    content, reasoning, calls, finish, usage, deltas = "", "", {}, None, None, []
    for chunk in _chat(s, text, stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            deltas.append(d)
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning") or ""
            for tc in d.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.function.name, "a call's first delta has its id and name"
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, reasoning, [calls[k] for k in sorted(calls)], finish, usage, deltas


def test_tool_call_non_streaming(tools_server):
    r = _chat(tools_server, "Checking the weather." + CALL + END, tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking the weather."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather" and call.function.arguments == ARGS


def test_tool_call_streaming_matches(tools_server):
    text = "Checking the weather." + CALL + "\n" + CALL + END
    content, _, calls, finish, _, deltas = _stream(tools_server, text, tools=TOOLS)
    whole = _chat(tools_server, text, tools=TOOLS).choices[0]
    assert finish == "tool_calls" == whole.finish_reason
    assert content == whole.message.content == "Checking the weather."
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (t.function.name, t.function.arguments) for t in whole.message.tool_calls
    ]
    assert len(calls) == 2 and len({c["id"] for c in calls}) == 2
    assert not any("tool_call" in (d.content or "") for d in deltas)
    # The arguments came in fragments, after the call's first delta.
    assert sum(1 for d in deltas for tc in d.tool_calls or [] if tc.id is None) >= 2


def test_no_tools_no_parsing(tools_server):
    """Without tools in the request (tool_choice none), the markup is the answer."""
    r = _chat(tools_server, "x" + CALL + END)
    assert r.choices[0].message.content == "x" + CALL
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop"
    r = _chat(tools_server, "x" + CALL + END, tools=TOOLS, tool_choice="none")
    assert r.choices[0].message.content == "x" + CALL


def test_reasoning_non_streaming_and_usage(tools_server):
    r = _chat(tools_server, THINK + "It is sunny." + END)
    msg = r.choices[0].message
    assert msg.model_extra["reasoning"] == "\nThe user wants weather 🤔.\n"
    assert msg.content == "\n\nIt is sunny."
    tok = tools_server.tok
    thinking = len(tok.encode(THINK.rstrip("\n"), add_special_tokens=False))
    assert r.usage.completion_tokens_details.reasoning_tokens == thinking


def test_reasoning_streaming_matches(tools_server):
    text = THINK + "It is sunny." + END
    content, reasoning, calls, finish, usage, _ = _stream(tools_server, text)
    whole = _chat(tools_server, text)
    assert (reasoning, content) == (
        whole.choices[0].message.model_extra["reasoning"],
        whole.choices[0].message.content,
    )
    assert finish == "stop" and not calls
    assert (
        usage.completion_tokens_details.reasoning_tokens
        == whole.usage.completion_tokens_details.reasoning_tokens
        > 0
    )


def test_tool_calls_after_reasoning_only(tools_server):
    """A call inside the thinking is thinking; the one in the answer is the call."""
    text = "<think>maybe " + CALL + "</think>" + CALL + END
    r = _chat(tools_server, text, tools=TOOLS)
    msg = r.choices[0].message
    assert msg.model_extra["reasoning"] == "maybe " + CALL
    assert len(msg.tool_calls) == 1 and r.choices[0].finish_reason == "tool_calls"
    assert msg.content is None
    content, reasoning, calls, finish, _, _ = _stream(tools_server, text, tools=TOOLS)
    assert reasoning == "maybe " + CALL and len(calls) == 1 and not content
    assert finish == "tool_calls"


def test_enable_thinking_false_is_all_answer():
    features = _features(reasoning_parser="deepseek_r1", reasoning_field="both")
    with serve(SyntheticConfig(output="echo"), features=features) as s:
        r = _chat(s, "thinking?</think>answer" + END)
        extra = r.choices[0].message.model_extra
        assert extra["reasoning"] == extra["reasoning_content"] == "thinking?"
        r = _chat(
            s,
            "thinking?</think>answer" + END,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        assert r.choices[0].message.content == "thinking?</think>answer"
        assert r.usage.completion_tokens_details is None


def test_tool_choice_refusals(tools_server, plain_server):
    """(``required`` and a named function with an engine that cannot constrain decoding:
    ``test_structured``.)"""
    for server, kw, says in (
        (
            tools_server,
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "not in tools",
        ),
        (plain_server, {"tool_choice": "auto"}, "--enable-auto-tool-choice"),
    ):
        with pytest.raises(openai.BadRequestError) as exc:
            _chat(server, "hi" + END, tools=TOOLS, **kw)
        assert exc.value.body["param"] == "tool_choice" and says in exc.value.body["message"]


def test_request_chat_template_needs_trust(plain_server):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template": "{{ 'own' }}",
        "max_tokens": 3,
    }
    r = httpx.post(plain_server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template"
    with serve(
        SyntheticConfig(output="echo"), features=_features(trust_request_chat_template=True)
    ) as s:
        r = httpx.post(s.url + "/v1/chat/completions", json=body | {"max_tokens": 1})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "own"
        # The sandbox holds for request templates.
        evil = body | {"chat_template": "{{ ''.__class__.__mro__[1].__subclasses__() }}"}
        r = httpx.post(s.url + "/v1/chat/completions", json=evil)
        assert r.status_code == 400


def test_content_format_and_interleaved_thinking():
    template = (
        "{% for m in messages %}{% for part in m['content'] %}{{ part['text'] }}{% endfor %}"
        "[{{ m.reasoning_content or '' }}]{% endfor %}"
    )
    with serve(SyntheticConfig(output="echo"), features=Features(chat_template=template)) as s:
        messages = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning": "why"},
            {"role": "user", "content": [{"type": "text", "text": "q2"}]},
        ]
        r = s.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=50)
        assert r.choices[0].message.content == "q[]a[why]q2[]"


def test_gpt_oss_harmony_reasoning_and_calls():
    features = _features(
        reasoning_parser="gpt_oss", tool_call_parser="openai", enable_auto_tool_choice=True
    )
    text = (
        "<|channel|>analysis<|message|>Need weather 🌧.<|end|><|start|>assistant<|channel|>"
        f"commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}<|call|>"
    )
    with serve(SyntheticConfig(output="echo"), features=features) as s:
        r = _chat(s, text + END, tools=TOOLS)
        msg = r.choices[0].message
        assert msg.model_extra["reasoning"] == "Need weather 🌧."
        (call,) = msg.tool_calls
        assert call.function.name == "get_weather" and call.function.arguments == ARGS
        assert r.choices[0].finish_reason == "tool_calls"
        assert r.usage.completion_tokens_details.reasoning_tokens > 0
        content, reasoning, calls, finish, _, _ = _stream(s, text + END, tools=TOOLS)
        assert (content, reasoning, finish) == ("", "Need weather 🌧.", "tool_calls")
        assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", ARGS)]


def test_parallel_tool_calls_false_keeps_the_first(tools_server):
    text = "x" + CALL + "\n" + CALL.replace("get_weather", "other") + END
    r = _chat(tools_server, text, tools=TOOLS, parallel_tool_calls=False)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]
    _, _, calls, finish, _, _ = _stream(tools_server, text, tools=TOOLS, parallel_tool_calls=False)
    assert [c["name"] for c in calls] == ["get_weather"] and finish == "tool_calls"
    r = _chat(tools_server, text, tools=TOOLS)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather", "other"]
