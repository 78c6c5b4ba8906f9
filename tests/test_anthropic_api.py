"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``): requests read as the
chat request they amount to, the message object and its stop reasons, the streamed events (each
validated against the ``anthropic`` package's own event types), tool use over two turns,
thinking blocks, errors in Anthropic's shape (planned or not, before or during a stream), the API
key in ``x-api-key``, metrics and the access log; with the ``anthropic`` client itself."""

from __future__ import annotations

import json
import logging
import threading

import anthropic
import httpx
import pytest
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from pydantic import TypeAdapter

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.messages.errors import ValidationError
from tokenwire.runtime import Features
from tokenwire.server.anthropic.errors import error_type
from tokenwire.server.anthropic.request import read_count_tokens, read_messages
from tokenwire.server.security import SecurityConfig

from api_echo import CALL, FEATURES, SCHEMA, TEMPLATE, THINK, sse_events
from conftest import real_tokenizer
from served import MODEL, serve, wait_until

EVENTS = TypeAdapter(RawMessageStreamEvent)
ERRORS = TypeAdapter(ErrorResponse)
TOOL = {"name": "get_weather", "description": "The weather.", "input_schema": SCHEMA}
USER = [{"role": "user", "content": "Hello, world! 你好"}]


@pytest.fixture(scope="module")
def server():
    with serve(SyntheticConfig(output="echo"), features=FEATURES) as s:
        s.client = anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0)
        yield s


def _tokens(text: str) -> list[int]:
    tok = real_tokenizer("default")
    return tok.encode(text + tok.eos_token, add_special_tokens=False)


def _stream(url: str, body: dict, headers: dict | None = None) -> list[tuple[str, dict]]:
    """A raw stream's events, each checked against the client's own types."""
    body = {"model": MODEL, "max_tokens": 200, "stream": True, **body}
    with httpx.stream("POST", url + "/v1/messages", json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200, r.read()
        raw = r.read().decode()
    events = sse_events(raw)
    for name, data in events:
        assert name == data["type"]  # the anthropic client goes by the event line
        if name == "error":
            ERRORS.validate_python(data)
        elif name != "ping":
            EVENTS.validate_python(data)  # raises on any event the client would reject
    return events


# ---- requests read as chat requests -----------------------------------------------------------


def test_messages_become_the_chat_messages_they_amount_to():
    body = {
        "model": "m",
        "max_tokens": 9,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": ""},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"c": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"},
                    {"type": "text", "text": "Thanks"},
                ],
            },
        ],
        "tools": [TOOL],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "temperature": 0.2,
        "top_k": 5,
        "thinking": {"type": "disabled"},
        "metadata": {"user_id": "u"},
    }
    req = read_messages(body)
    call = {
        "id": "t1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"c": 1}},
    }
    assert req.chat == {
        "messages": [
            {"role": "system", "content": "Be brief.\nBe kind."},
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [call],
                "reasoning_content": "hmm",
            },
            {"role": "tool", "tool_call_id": "t1", "content": "Sunny"},
            {"role": "user", "content": "Thanks"},
        ],
        "model": "m",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "The weather.",
                    "parameters": SCHEMA,
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "chat_template_kwargs": {"enable_thinking": False},
        "temperature": 0.2,
        "top_k": 5,
        "max_tokens": 9,
        "stream": False,
        "stop": ["END"],
    }
    assert read_messages({**body, "tool_choice": {"type": "any"}}).chat["tool_choice"] == "required"
    counted = read_count_tokens({k: body[k] for k in ("model", "messages", "system", "tools")})
    assert counted["messages"] == req.chat["messages"] and "max_tokens" not in counted


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"messages": USER}, "max_tokens is required"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 5, "messages": []}, "messages must be a non-empty list"),
        ({"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages[0].content[0]",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}
                ],
            },
            "messages[0].content[0].input",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "tool_result"}]}],
            },
            "messages[0].content[0].tool_use_id",
        ),
        ({"max_tokens": 5, "messages": USER, "system": [{"type": "image"}]}, "system[0]"),
        ({"max_tokens": 5, "messages": USER, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
        (
            {"max_tokens": 5, "messages": USER, "tools": [{"type": "bash_20250124", "name": "b"}]},
            "tools[0].type",
        ),
        ({"max_tokens": 5, "messages": USER, "tool_choice": {"type": "some"}}, "tool_choice.type"),
        ({"max_tokens": 5, "messages": USER, "thinking": {"type": "enabled"}}, "budget_tokens"),
        ({"max_tokens": 5, "messages": USER, "stop_sequences": "END"}, "stop_sequences"),
        ({"max_tokens": 5, "messages": USER, "stream": 1}, "stream"),
    ],
)
def test_bad_requests_name_their_field(body, names):
    with pytest.raises(ValidationError) as exc:
        read_messages(body)
    assert names in exc.value.detail


# ---- the official client -------------------------------------------------------------------------


def test_create_gives_the_echo_as_a_text_block(server):
    m = server.client.messages.create(model=MODEL, max_tokens=100, messages=USER)
    Message.model_validate(m.model_dump())
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == USER[0]["content"]
    assert m.id.startswith("msg_") and m.role == "assistant" and m.model == MODEL
    assert (m.stop_reason, m.stop_sequence) == ("end_turn", None)
    n = len(_tokens(USER[0]["content"]))
    assert (m.usage.input_tokens, m.usage.output_tokens) == (n, n)
    # anthropic-version (and the client's other headers) are accepted.
    raw = httpx.post(
        server.url + "/v1/messages",
        json={"model": MODEL, "max_tokens": 5, "messages": USER},
        headers={"anthropic-version": "2023-06-01", "anthropic-beta": "x"},
    )
    assert raw.status_code == 200 and raw.json()["stop_reason"] == "max_tokens"


def test_the_clients_stream_gives_the_text_and_the_final_message(server):
    with server.client.messages.stream(
        model=MODEL, max_tokens=200, messages=[{"role": "user", "content": THINK + "Sunny ☀"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "\n\nSunny ☀"
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "\nThe user wants the weather 🌧.\n"
    assert final.content[1].text == text and final.stop_reason == "end_turn"
    whole = server.client.messages.create(
        model=MODEL, max_tokens=200, messages=[{"role": "user", "content": THINK + "Sunny ☀"}]
    )
    assert [b.model_dump() for b in whole.content] == [b.model_dump() for b in final.content]
    assert whole.usage.output_tokens == final.usage.output_tokens


def test_a_raw_stream_has_every_event_in_order(server):
    events = _stream(server.url, {"messages": [{"role": "user", "content": THINK + "Hi"}]})
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == [
        "message_delta",
        "message_stop",
    ]
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]
    assert set(deltas) == {"thinking_delta", "text_delta"}
    assert [d["index"] for n, d in events if n == "content_block_stop"] == [0, 1]
    start = events[0][1]["message"]
    n = len(_tokens(THINK + "Hi"))
    assert start["usage"]["input_tokens"] == n and start["content"] == []
    delta = events[-2][1]
    assert delta["usage"]["output_tokens"] == n and delta["delta"]["stop_reason"] == "end_turn"


def test_a_tool_use_round_trip(server):
    client = server.client
    first = client.messages.create(
        model=MODEL, max_tokens=200, tools=[TOOL], messages=[{"role": "user", "content": CALL}]
    )
    (use,) = first.content
    assert use.type == "tool_use" and (use.name, use.input) == ("get_weather", {"city": "Paris"})
    assert first.stop_reason == "tool_use"
    history = [
        {"role": "user", "content": CALL},
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Rain"}],
        },
    ]
    second = client.messages.create(model=MODEL, max_tokens=200, tools=[TOOL], messages=history)
    assert second.content[0].text == "Paris: Rain" and second.stop_reason == "end_turn"
    # Streamed: the input as JSON deltas, then the stop reason.
    with client.messages.stream(
        model=MODEL, max_tokens=200, tools=[TOOL], messages=[{"role": "user", "content": CALL}]
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].input == {"city": "Paris"} and final.stop_reason == "tool_use"
    events = _stream(server.url, {"tools": [TOOL], "messages": [{"role": "user", "content": CALL}]})
    partial = "".join(
        d["delta"]["partial_json"]
        for n, d in events
        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    )
    assert json.loads(partial) == {"city": "Paris"}


def test_stop_reasons(server):
    client = server.client
    cut = client.messages.create(model=MODEL, max_tokens=2, messages=USER)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
    stopped = client.messages.create(
        model=MODEL, max_tokens=100, stop_sequences=["world"], messages=USER
    )
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "world")
    assert stopped.content[0].text == "Hello, "
    events = _stream(server.url, {"stop_sequences": ["world"], "messages": USER})
    assert events[-2][1]["delta"] == {
        "stop_reason": "stop_sequence",
        "stop_sequence": "world",
        "stop_details": None,
        "container": None,
    }
    # Thinking turned off: the template is told, and no thinking block is parsed.
    plain = client.messages.create(
        model=MODEL,
        max_tokens=100,
        thinking={"type": "disabled"},
        messages=[{"role": "user", "content": THINK + "x"}],
    )
    assert [b.type for b in plain.content] == ["text"] and plain.content[0].text.startswith(
        "<think>"
    )


def test_count_tokens_counts_the_prompt_the_messages_route_renders(server):
    body = {"model": MODEL, "system": "Be brief.", "tools": [TOOL], "messages": USER}
    counted = server.client.messages.count_tokens(**body)
    MessageTokensCount.model_validate(counted.model_dump())
    m = server.client.messages.create(max_tokens=3, **body)
    assert counted.input_tokens == m.usage.input_tokens == len(_tokens(USER[0]["content"]))
    with pytest.raises(anthropic.BadRequestError) as exc:
        server.client.messages.count_tokens(model=MODEL, messages=[])
    ERRORS.validate_python(exc.value.body)
    with pytest.raises(anthropic.NotFoundError):
        server.client.messages.count_tokens(model="claude-x", messages=USER)


def test_errors_are_anthropics(server):
    client = server.client
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(model=MODEL, max_tokens=5, messages=[])
    ERRORS.validate_python(exc.value.body)
    assert exc.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as exc:  # a forced tool that is no schema
        client.messages.create(
            model=MODEL,
            max_tokens=5,
            tools=[{**TOOL, "input_schema": {"type": "nonsense"}}],
            tool_choice={"type": "any"},
            messages=USER,
        )
    assert "tools" in exc.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as exc:  # a chat check, in Anthropic's words
        client.messages.create(model=MODEL, max_tokens=5, stop_sequences=[""], messages=USER)
    assert exc.value.body["error"]["message"].startswith("stop_sequences")
    body = {"model": MODEL, "max_tokens": 10**9, "messages": USER}  # past the context left
    r = httpx.post(server.url + "/v1/messages", json=body)
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as exc:
        client.messages.create(model="claude-x", max_tokens=5, messages=USER)
    assert exc.value.body["error"]["type"] == "not_found_error"
    for raw in (b"{", b"[]"):
        r = httpx.post(server.url + "/v1/messages", content=raw)
        assert r.status_code == 400 and r.json()["type"] == "error"
    r = httpx.get(server.url + "/v1/messages")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    assert error_type(413) == "request_too_large" and error_type(503) == "overloaded_error"
    assert error_type(502) == "api_error" and error_type(418) == "invalid_request_error"


def test_the_api_key_in_x_api_key_or_as_a_bearer_token():
    security = SecurityConfig(api_keys=("s3cret",))
    with serve(SyntheticConfig(output="echo"), features=FEATURES, security=security) as s:
        body = {"model": MODEL, "max_tokens": 5, "messages": USER}
        for headers in ({}, {"x-api-key": "wrong"}, {"authorization": "Bearer wrong"}):
            r = httpx.post(s.url + "/v1/messages", json=body, headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "authentication_error"
            r = httpx.post(s.url + "/v1/responses", json={"input": "x"}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == 401  # OpenAI's shape
        client = anthropic.Anthropic(base_url=s.url, api_key="s3cret", max_retries=0)
        assert client.messages.create(**body).content[0].text == "Hello, world! "
        r = httpx.post(
            s.url + "/v1/messages", json=body, headers={"authorization": "Bearer s3cret"}
        )
        assert r.status_code == 200
        r = httpx.post(
            s.url + "/v1/completions", json={"prompt": "x"}, headers={"x-api-key": "s3cret"}
        )
        assert r.status_code == 200


def test_failures_mid_stream_end_with_an_error_event(monkeypatch):
    with serve(SyntheticConfig(output="echo", step_time=0.01), features=FEATURES) as s:
        out: dict = {}

        def read() -> None:
            body = {
                "model": MODEL,
                "max_tokens": 4000,
                "messages": [{"role": "user", "content": "w " * 500}],
            }
            try:
                out["events"] = _stream(s.url, body)
            except Exception as exc:  # (reported below)
                out["error"] = exc

        t = threading.Thread(target=read)
        t.start()
        assert wait_until(lambda: s.engine.running == 1)
        s.engine.inject("malformed")
        t.join(30)
        assert "error" not in out, out.get("error")
        name, data = out["events"][-1]
        assert name == "error" and data["error"]["type"] == "api_error"
        assert "malformed" in data["error"]["message"]
        # The client raises it.
        client = anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0)

        def fail_soon() -> None:
            assert wait_until(lambda: s.engine.running == 1)
            s.engine.inject("malformed")

        t = threading.Thread(target=fail_soon)
        t.start()
        with (
            pytest.raises(anthropic.APIStatusError),
            client.messages.stream(
                model=MODEL, max_tokens=4000, messages=[{"role": "user", "content": "w " * 500}]
            ) as stream,
        ):
            for _ in stream.text_stream:
                pass
        t.join(30)
        assert wait_until(lambda: len(s.runtime.shard) == 0)


def test_unplanned_failures_are_in_anthropics_shape(monkeypatch):
    from tokenwire.server.anthropic import output, routes

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in response shaping")

    with serve(SyntheticConfig(output="echo"), features=FEATURES) as s:
        monkeypatch.setattr(routes, "message_object", broken)
        r = httpx.post(
            s.url + "/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": USER}
        )
        assert r.status_code == 500 and "bug" not in r.text
        ERRORS.validate_python(r.json())
        assert r.json()["error"]["type"] == "api_error"
        monkeypatch.setattr(output.MessageEvents, "finish", broken)
        events = _stream(s.url, {"messages": USER})
        name, data = events[-1]
        assert name == "error" and data["error"]["type"] == "api_error" and "bug" not in str(data)
        assert wait_until(lambda: len(s.runtime.shard) == 0)


def test_an_engine_that_constrains_gets_the_forced_tool(monkeypatch):
    from test_structured import _Constraining

    import served

    monkeypatch.setattr(served, "SyntheticEngine", _Constraining)
    with serve(SyntheticConfig(output="echo"), features=Features(chat_template=TEMPLATE)) as s:
        client = anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0)
        m = client.messages.create(
            model=MODEL,
            max_tokens=100,
            tools=[TOOL],
            tool_choice={"type": "tool", "name": "get_weather"},
            messages=[{"role": "user", "content": '{"city": "Lyon"}'}],
        )
        assert json.loads(s.engine.seen[-1].json_schema) == SCHEMA
        (use,) = m.content
        assert (use.name, use.input, m.stop_reason) == ("get_weather", {"city": "Lyon"}, "tool_use")


def test_metrics_per_route_and_the_access_log(server, caplog):
    with caplog.at_level(logging.INFO, "tokenwire.access"):
        server.client.messages.create(model=MODEL, max_tokens=5, messages=USER)
        server.client.messages.count_tokens(model=MODEL, messages=USER)
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "tokenwire.access"]
    assert any('"POST /v1/messages HTTP/1.1" 200' in line for line in lines)
    assert any('"POST /v1/messages/count_tokens HTTP/1.1" 200' in line for line in lines)
    metrics = httpx.get(server.url + "/metrics").text
    assert 'tokenwire_requests_total{route="messages",status="200"}' in metrics
    assert 'tokenwire_requests_total{route="messages_count_tokens",status="200"}' in metrics


async def test_refusals_before_the_handler_are_anthropics_too():
    from tokenwire.engine.synthetic import SyntheticEngine
    from tokenwire.server import ServerConfig, create_app

    from asgi_client import call

    tok = real_tokenizer("default")
    app = create_app(
        tok, SyntheticEngine(tok, SyntheticConfig()), ServerConfig(max_request_bytes=64)
    )
    await app.runtime.start()
    try:
        big = json.dumps({"max_tokens": 5, "messages": [{"role": "user", "content": "x" * 100}]})
        for headers, status in (
            ([(b"content-type", b"application/json")], 413),
            ([(b"content-type", b"text/plain")], 415),
        ):
            resp = await call(app, "POST", "/v1/messages", big.encode(), headers)
            assert resp.status == status
            body = resp.json()
            assert body["type"] == "error" and body["error"]["type"] == error_type(status)
            if status != 413:  # (request_too_large: Anthropic's word, its client's types lack it)
                ERRORS.validate_python(body)
        # OpenAI's routes keep OpenAI's shape.
        resp = await call(app, "POST", "/v1/responses", big.encode())
        assert resp.status == 413 and resp.error()["code"] == 413
    finally:
        await app.runtime.close()
