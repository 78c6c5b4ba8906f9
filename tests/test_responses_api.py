"""OpenAI's Responses API (``/v1/responses``): requests read as the chat request they amount to,
the response object, the streamed semantic events (each validated against the ``openai``
package's own event types), function tools over several turns, the kept responses (retrieve,
delete, ``previous_response_id``, background responses and their cancel), structured output,
errors in OpenAI's shape naming the Responses fields, metrics and the access log. The real
clients run against it too: the ``openai`` package, the OpenAI Agents SDK and langchain-openai."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import threading

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.messages.errors import ValidationError
from tokenwire.runtime import Features
from tokenwire.server import ServerConfig, create_app
from tokenwire.server.responses.request import input_messages, read_request

from api_echo import CALL, FEATURES, SCHEMA, TEMPLATE, THINK, sse_events
from conftest import REPO, real_tokenizer
from served import MODEL, run_tokenwire, serve, wait_until

EVENTS = TypeAdapter(ResponseStreamEvent)
DEEP = "[" * 5000 + "]" * 5000
TOOL = {"type": "function", "name": "get_weather", "parameters": SCHEMA}


@pytest.fixture(scope="module")
def server():
    with serve(SyntheticConfig(output="echo"), features=FEATURES) as s:
        s.client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        yield s


def _tokens(text: str) -> list[int]:
    """The echo's tokens for a last message ``text`` (the template renders it, then EOS)."""
    tok = real_tokenizer("default")
    return tok.encode(text + tok.eos_token, add_special_tokens=False)


def _stream(server, body: dict) -> list[dict]:
    """A raw stream's events, each checked against the client's own types and numbered in
    order."""
    body = {"model": MODEL, "stream": True, **body}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=30) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"] == "text/event-stream"
        raw = resp.read().decode()
    events = []
    for name, data in sse_events(raw):
        assert name == data["type"]  # the event line names the event
        EVENTS.validate_python(data)  # raises on any event the client would reject
        events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def _same_output(a: list, b: list) -> None:
    """Two responses' output items are the same but for their ids."""

    def strip(items):
        return [{k: v for k, v in item.items() if k != "id"} for item in items]

    assert strip(a) == strip(b)


# ---- requests read as chat requests --------------------------------------------------------------


def test_input_items_become_the_chat_messages_they_amount_to():
    assert input_messages("Hi") == [{"role": "user", "content": "Hi"}]
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "think"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "b", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "not json"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "two"}],
        },
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
    ]
    call = lambda i, n, a: {"id": i, "type": "function", "function": {"name": n, "arguments": a}}  # noqa: E731
    assert input_messages(items) == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "a"},
        {
            "role": "assistant",
            "content": "b",
            "reasoning_content": "think",
            # (arguments as the template gets them: an object, or the text as sent)
            "tool_calls": [call("c1", "f", {"x": 1}), call("c2", "g", "not json")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "content": "", "reasoning_content": "s"},
    ]


def test_a_request_translates_to_the_chat_request():
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": "Hi",
        "tools": [{**TOOL, "description": "weather", "strict": True}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": SCHEMA}},
        "reasoning": {"effort": "low", "summary": "auto"},
        "max_output_tokens": 7,
        "temperature": 0.5,
        "parallel_tool_calls": False,
        "metadata": {"k": "v"},
        "user": "ana",
        "store": False,
        "top_k": 3,
    }
    req = read_request(body)
    assert req.chat == {
        "model": "m",
        "temperature": 0.5,
        "parallel_tool_calls": False,
        "top_k": 3,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
        "stream": False,
        "max_tokens": 7,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "weather",
                    "parameters": SCHEMA,
                    "strict": True,
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}},
        "reasoning_effort": "low",
    }
    assert not req.store and req.history == [{"role": "user", "content": "Hi"}]
    assert req.echo["text"] == body["text"] and req.echo["metadata"] == {"k": "v"}
    assert req.echo_chars == len(json.dumps(req.echo, separators=(",", ":"), ensure_ascii=False))


@pytest.mark.parametrize(
    ("body", "param", "names"),
    [
        ({"input": 5}, "input", "input must be"),
        ({"input": []}, "input", "input must not be empty"),
        ({}, "input", "input is required"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input",
            "input[0].content[0]",
        ),
        ({"input": [{"role": "robot", "content": "x"}]}, "input", "input[0].role"),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input",
            "input[0].call_id",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input", "input[0].output"),
        (
            {
                "instructions": "Be brief.",
                "input": [
                    {"role": "user", "content": "x"},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": DEEP},
                ],
            },
            "input",
            "input[1].arguments nests too deeply",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input", "input[0].type"),
        ({"input": [{"type": "reasoning", "summary": "x"}]}, "input", "input[0].summary"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "tools[0].type"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools", "tools[0].name"),
        ({"input": "x", "tool_choice": {"type": "allowed_tools"}}, "tool_choice", "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format", "text.format"),
        ({"input": "x", "text": "json"}, "text", "text must be"),
        ({"input": "x", "reasoning": {"effort": "max"}}, "reasoning.effort", "reasoning.effort"),
        ({"input": "x", "truncation": "left"}, "truncation", "truncation"),
        ({"input": "x", "include": ["message.output_text.logprobs"]}, "include", "include"),
        ({"input": "x", "top_logprobs": 2}, "top_logprobs", "top_logprobs"),
        ({"input": "x", "prompt": {"id": "p"}}, "prompt", "prompt"),
        ({"input": "x", "conversation": 3}, "conversation", "conversation"),
        (
            {"input": "x", "conversation": "c", "previous_response_id": "r"},
            "conversation",
            "both",
        ),
        ({"input": "x", "metadata": {"k": "v" * 513}}, "metadata", "at most 512"),
        ({"input": "x", "max_tool_calls": 0}, "max_tool_calls", "max_tool_calls"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c" * 300, "output": ""}]},
            "input",
            "input[0].call_id",
        ),
        ({"input": "x", "tools": [{"type": "mcp"}]}, "tools", "tools[0].server_label"),
        (
            {"input": "x", "tools": [{"type": "mcp", "server_label": "a", "connector_id": "x"}]},
            "tools",
            "tools[0].connector_id",
        ),
        ({"input": "x", "background": True, "stream": True}, "background", "background"),
        ({"input": "x", "background": True, "store": False}, "store", "store"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
        ({"input": "x", "metadata": {"k": 1}}, "metadata", "metadata"),
        ({"input": "x", "stream": "yes"}, "stream", "stream"),
    ],
)
def test_bad_requests_name_their_field(body, param, names):
    with pytest.raises(ValidationError) as exc:
        read_request(body)
    assert exc.value.param == param and names in exc.value.detail


# ---- the official client -------------------------------------------------------------------------


def test_create_gives_the_echo_as_a_message_with_usage(server):
    r = server.client.responses.create(model=MODEL, input="Hello, world! 你好", instructions="x")
    Response.model_validate(r.model_dump())
    assert r.status == "completed" and r.output_text == "Hello, world! 你好"
    assert r.id.startswith("resp_") and r.object == "response" and r.instructions == "x"
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    n = len(_tokens("Hello, world! 你好"))
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (n, n, 2 * n)
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_a_stream_has_every_event_in_order_and_ends_as_the_whole_response(server):
    text = THINK + "Sunny ☀ today"
    events = _stream(server, {"input": text})
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * kinds.count("response.reasoning_text.delta"),
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * kinds.count("response.output_text.delta"),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    thinking = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert thinking == "\nThe user wants the weather 🌧.\n" and deltas == "\n\nSunny ☀ today"
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][1]["content"][0]["text"] == deltas
    # The reasoning tokens: those of the thinking through its closing tag.
    tok = real_tokenizer("default")
    think_tokens = len(tok.encode(THINK.rstrip("\n"), add_special_tokens=False))
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == think_tokens
    whole = server.client.responses.create(model=MODEL, input=text)
    _same_output(
        whole.model_dump()["output"], Response.model_validate(final).model_dump()["output"]
    )
    assert whole.usage.model_dump() == Response.model_validate(final).usage.model_dump()


def test_the_clients_own_stream_helpers(server):
    got = list(server.client.responses.create(model=MODEL, input="streamed words", stream=True))
    assert got[0].type == "response.created" and got[-1].type == "response.completed"
    assert "".join(e.delta for e in got if e.type == "response.output_text.delta") == (
        "streamed words"
    )
    with server.client.responses.stream(model=MODEL, input=THINK + "done") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "\n\ndone"


def test_a_function_tool_round_trip_with_previous_response_id_and_by_resending(server):
    client = server.client
    first = client.responses.create(model=MODEL, input=CALL, tools=[TOOL])
    (call,) = first.output
    assert call.type == "function_call" and call.status == "completed"
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.id.startswith("fc_") and call.call_id
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}
    # The server keeps the conversation: the tool's result alone continues it.
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[result], tools=[TOOL]
    )
    assert second.output_text == "Paris: Sunny" and second.previous_response_id == first.id
    # Or the client resends every item (store: false, as agents do).
    items = [{"role": "user", "content": CALL}, call.model_dump(exclude_none=True), result]
    again = client.responses.create(model=MODEL, input=items, tools=[TOOL], store=False)
    assert again.output_text == "Paris: Sunny"
    # Streamed: the call's arguments in deltas, then done.
    events = _stream(server, {"input": CALL, "tools": [TOOL]})
    args = "".join(
        e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
    )
    (done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert args == done["arguments"] == call.arguments
    assert events[-1]["response"]["output"][0]["type"] == "function_call"


def test_cut_by_the_token_limit_is_incomplete(server):
    r = server.client.responses.create(
        model=MODEL, input="one two three four five", max_output_tokens=2
    )
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete" and r.usage.output_tokens == 2
    events = _stream(server, {"input": "one two three four five", "max_output_tokens": 2})
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_kept_responses_retrieve_delete_and_404s(server):
    client = server.client
    r = client.responses.create(model=MODEL, input="keep me", metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    # A streamed response is kept as its last event said.
    events = _stream(server, {"input": "kept too"})
    assert client.responses.retrieve(events[-1]["response"]["id"]).output_text == "kept too"
    assert client.responses.delete(r.id) is None
    for ask in (lambda: client.responses.retrieve(r.id), lambda: client.responses.delete(r.id)):
        with pytest.raises(openai.NotFoundError) as exc:
            ask()
        assert exc.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(model=MODEL, input="x", previous_response_id=r.id)
    assert exc.value.body["param"] == "previous_response_id"
    unkept = client.responses.create(model=MODEL, input="forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(client.responses.create(model=MODEL, input="x").id)
    bad = httpx.get(server.url + f"/v1/responses/{unkept.id}/nothing")
    assert bad.status_code == 404
    assert httpx.put(server.url + f"/v1/responses/{unkept.id}").status_code == 405
    stream_again = httpx.get(
        server.url + f"/v1/responses/{events[-1]['response']['id']}?stream=true"
    )
    assert stream_again.status_code == 400 and stream_again.json()["error"]["param"] == "stream"


def test_an_engine_that_cannot_constrain_refuses_text_format_and_forced_tools(monkeypatch):
    from test_structured import _Unconstrained

    import served

    monkeypatch.setattr(served, "SyntheticEngine", _Unconstrained)
    with serve(SyntheticConfig(output="echo"), features=FEATURES) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError) as exc:
            client.responses.create(
                model=MODEL,
                input="x",
                text={"format": {"type": "json_schema", "name": "w", "schema": SCHEMA}},
            )
        assert exc.value.body["param"] == "text.format"
        with pytest.raises(openai.BadRequestError) as exc:
            client.responses.create(model=MODEL, input="x", tools=[TOOL], tool_choice="required")
        assert exc.value.body["param"] == "tool_choice"


def test_text_format_on_the_synthetic_engine_is_valid_for_its_schema(server):
    import jsonschema

    r = server.client.responses.create(
        model=MODEL,
        input="Paris?",
        text={"format": {"type": "json_schema", "name": "w", "schema": SCHEMA}},
        max_output_tokens=200,
    )
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    assert r.status == "completed"


def test_errors_are_openais_and_name_the_responses_fields(server):
    client = server.client
    with pytest.raises(openai.BadRequestError) as exc:  # the context left for the output
        client.responses.create(model=MODEL, input="x", max_output_tokens=10**9)
    assert (
        exc.value.body["param"] == "max_output_tokens" and "max_output_tokens" in exc.value.message
    )
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(
            model=MODEL,
            input="x",
            tools=[{**TOOL, "parameters": 5}],
            tool_choice={"type": "function", "name": "get_weather"},
        )
    assert exc.value.body["param"] == "tools[0].parameters"  # (the Responses API's own path)
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(model="other", input="x")
    assert exc.value.body["code"] == "model_not_found"


def test_background_responses_are_polled_and_cancelled():
    with serve(SyntheticConfig(output="echo", step_time=0.02), features=FEATURES) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        quick = client.responses.create(model=MODEL, input="quick one", background=True)
        assert quick.background and quick.status == "in_progress" and quick.output == []
        assert wait_until(lambda: client.responses.retrieve(quick.id).status == "completed")
        assert client.responses.retrieve(quick.id).output_text == "quick one"
        assert client.responses.cancel(quick.id).status == "completed"  # over: as it is
        long = client.responses.create(model=MODEL, input="word " * 2000, background=True)
        assert wait_until(lambda: s.engine.running == 1)
        cancelled = client.responses.cancel(long.id)
        assert cancelled.status == "cancelled" and cancelled.usage.output_tokens < 2000
        assert client.responses.retrieve(long.id).status == "cancelled"
        assert wait_until(lambda: s.engine.running == 0 and len(s.runtime.shard) == 0)
        # Deleting a running background response ends it too.
        gone = client.responses.create(model=MODEL, input="word " * 2000, background=True)
        assert wait_until(lambda: s.engine.running == 1)
        client.responses.delete(gone.id)
        assert wait_until(lambda: s.engine.running == 0 and len(s.runtime.shard) == 0)
    with serve(SyntheticConfig(output="echo"), features=FEATURES, responses_store_size=0) as s:
        r = httpx.post(s.url + "/v1/responses", json={"input": "x", "background": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "background"
        r = httpx.post(s.url + "/v1/responses", json={"input": "not kept"})
        assert r.status_code == 200
        assert httpx.get(s.url + f"/v1/responses/{r.json()['id']}").status_code == 404


def test_an_engine_failure_mid_stream_is_response_failed():
    with serve(SyntheticConfig(output="echo", step_time=0.01), features=FEATURES) as s:
        out: dict = {}

        def read() -> None:
            body = {"model": MODEL, "input": "word " * 500, "stream": True}
            with httpx.stream("POST", s.url + "/v1/responses", json=body, timeout=30) as resp:
                out["raw"] = resp.read().decode()

        t = threading.Thread(target=read)
        t.start()
        assert wait_until(lambda: s.engine.running == 1)
        s.engine.inject("malformed")
        t.join(30)
        events = [data for _, data in sse_events(out["raw"])]
        for e in events:
            EVENTS.validate_python(e)
        assert events[-1]["type"] == "response.failed"
        failed = events[-1]["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
        assert all(i["status"] == "incomplete" for i in failed["output"][-1:])
        assert wait_until(lambda: len(s.runtime.shard) == 0)
        kept = httpx.get(s.url + f"/v1/responses/{failed['id']}").json()
        assert kept["status"] == "failed"


def test_a_background_response_that_fails_is_kept_failed(monkeypatch):
    with serve(SyntheticConfig(output="echo", step_time=0.01), features=FEATURES) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        r = client.responses.create(model=MODEL, input="word " * 500, background=True)
        assert wait_until(lambda: s.engine.running == 1)
        s.engine.inject("malformed")
        assert wait_until(lambda: client.responses.retrieve(r.id).status == "failed")
        failed = client.responses.retrieve(r.id)
        assert failed.error.code == "server_error" and "malformed" in failed.error.message
        # A bug while shaping it: failed too, with nothing of the bug told.
        from tokenwire.server.responses import routes

        def broken(*args, **kwargs):
            raise RuntimeError("a bug in response shaping")

        monkeypatch.setattr(routes, "output_items", broken)
        r = client.responses.create(model=MODEL, input="short", background=True)
        assert wait_until(lambda: client.responses.retrieve(r.id).status == "failed")
        assert "bug" not in client.responses.retrieve(r.id).error.message
        assert wait_until(lambda: len(s.runtime.shard) == 0)


def test_a_client_gone_mid_stream_leaves_its_kept_response_cancelled():
    with serve(SyntheticConfig(output="echo", step_time=0.01), features=FEATURES) as s:
        body = {"model": MODEL, "input": "word " * 500, "stream": True}
        with httpx.stream("POST", s.url + "/v1/responses", json=body, timeout=30) as resp:
            lines = resp.iter_lines()
            first = next(lines)
            rid = None
            for line in lines:
                if line.startswith("data: "):
                    rid = json.loads(line[6:])["response"]["id"]
                    break
        assert first == "event: response.created" and rid
        assert wait_until(lambda: len(s.runtime.shard) == 0)
        assert wait_until(
            lambda: httpx.get(s.url + f"/v1/responses/{rid}").json()["status"] == "cancelled"
        )


# ---- structured output and forced calls, with an engine that constrains --------------------------


def test_an_engine_that_constrains_gets_the_schema_and_the_forced_call(monkeypatch):
    from test_structured import _Constraining

    import served

    monkeypatch.setattr(served, "SyntheticEngine", _Constraining)
    with serve(SyntheticConfig(output="echo"), features=Features(chat_template=TEMPLATE)) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        r = client.responses.create(
            model=MODEL,
            input='{"city": "Paris"}',
            text={"format": {"type": "json_schema", "name": "w", "schema": SCHEMA}},
        )
        assert json.loads(s.engine.seen[-1].json_schema) == SCHEMA
        assert json.loads(r.output_text) == {"city": "Paris"}
        r = client.responses.create(
            model=MODEL,
            input='{"city": "Lyon"}',
            tools=[TOOL],
            tool_choice={"type": "function", "name": "get_weather"},
        )
        assert json.loads(s.engine.seen[-1].json_schema) == SCHEMA
        (call,) = r.output
        assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Lyon"})


# ---- metrics and the access log ------------------------------------------------------------------


def test_metrics_per_route_and_the_access_log(server, caplog):
    with caplog.at_level(logging.INFO, "tokenwire.access"):
        r = server.client.responses.create(model=MODEL, input="counted")
        server.client.responses.retrieve(r.id)
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "tokenwire.access"]
    assert any('"POST /v1/responses HTTP/1.1" 200' in line for line in lines)
    assert any(f'"GET /v1/responses/{r.id} HTTP/1.1" 200' in line for line in lines)
    metrics = httpx.get(server.url + "/metrics").text
    assert 'tokenwire_requests_total{route="responses",status="200"}' in metrics
    assert 'tokenwire_requests_total{route="responses_by_id",status="200"}' in metrics
    assert "v1_responses_resp" not in metrics  # ids never become labels


# ---- the agent frameworks ------------------------------------------------------------------------


def test_the_openai_agents_sdk_runs_an_agent_with_a_tool_to_completion(server):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # (tracing would export to OpenAI's servers)
    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    def agent() -> agents.Agent:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
        return agents.Agent(
            name="weather", instructions="Answer.", tools=[get_weather], model=model
        )

    result = asyncio.run(agents.Runner.run(agent(), CALL))
    assert result.final_output == "Paris: Sunny in Paris" and calls == ["Paris"]

    async def streamed() -> tuple[str, list[str]]:
        run = agents.Runner.run_streamed(agent(), CALL)
        kinds = [e.type async for e in run.stream_events()]
        return run.final_output, kinds

    final, kinds = asyncio.run(streamed())
    assert final == "Paris: Sunny in Paris" and calls == ["Paris", "Paris"]
    assert "raw_response_event" in kinds


def test_langchain_openai_with_the_responses_api(server):
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    chat = lc.ChatOpenAI(
        model=MODEL,
        base_url=server.url + "/v1",
        api_key="none",
        use_responses_api=True,
        max_tokens=60,
    )
    assert chat.invoke("Bonjour à tous").text == "Bonjour à tous"
    assert "".join(c.text for c in chat.stream("streamed words")) == "streamed words"
    thought = chat.invoke(THINK + "Done")
    assert thought.text == "\n\nDone"
    assert [b["type"] for b in thought.content] == ["reasoning", "text"]

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"Rain in {city}"

    bound = chat.bind_tools([get_weather])
    history: list = [HumanMessage(CALL)]
    reply = bound.invoke(history)
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    history += [reply, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    assert bound.invoke(history).text == "Paris: Rain in Paris"
    # The same loop streamed.
    chunks = list(bound.stream([HumanMessage(CALL)]))
    merged = chunks[0]
    for c in chunks[1:]:
        merged += c
    assert merged.tool_calls[0]["args"] == {"city": "Paris"}


# ---- the flag ---------------------------------------------------------------------------------


def test_tokenwire_serve_keeps_as_many_responses_as_its_flag_says():
    from tokenwire.entrypoints.cli import build_parser
    from tokenwire.server.config import DEFAULT_RESPONSES_STORE_SIZE

    parser = build_parser()
    assert parser.parse_args(["serve"]).responses_store_size == DEFAULT_RESPONSES_STORE_SIZE
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--responses-store-size", "-1"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = ["serve", "--port", str(port), "--step-time-ms", "0", "--synthetic-output", "echo"]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenwire", *argv, "--responses-store-size", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None

    try:
        assert wait_until(up, 120) and proc.poll() is None
        first, second = (
            httpx.post(url + "/v1/responses", json={"input": text}).json()["id"]
            for text in ("one", "two")
        )
        assert httpx.get(f"{url}/v1/responses/{first}").status_code == 404  # evicted
        assert httpx.get(f"{url}/v1/responses/{second}").json()["output"][0]["type"] == "message"
    finally:
        proc.terminate()
        proc.wait(10)


# ---- the reference's examples (docs/apis.md) ----------------------------------------------------


def test_the_references_examples_of_both_apis_run(capsys):
    readme = (REPO / "docs" / "apis.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    examples = [b for b in blocks if "responses.create" in b or "messages.create" in b]
    assert len(examples) == 2
    tok = real_tokenizer("default")
    engine = SyntheticEngine(tok, SyntheticConfig())  # (the replay engine, as served by default)
    app = create_app(tok, engine, ServerConfig(model_name="Qwen/Qwen3-0.6B"))
    with run_tokenwire(app) as url:
        for code in examples:
            exec(compile(code.replace("http://127.0.0.1:8000", url), "README", "exec"), {})
            printed = capsys.readouterr().out
            assert printed.split()[0] in ("completed", "incomplete", "end_turn", "max_tokens")
            # the answer, then the streamed one (passages in a dozen languages: count characters)
            assert len(printed) > 40
