"""MCP tools the server runs on ``/v1/responses``, against real MCP servers (the ``mcp`` SDK's
``MCPServer`` on loopback, streamable HTTP and SSE): the listing and the call items and their
events (each checked against the ``openai`` package's own types), approvals, ``--tool-server``
labels, the bounds (a server that hangs, floods or answers no MCP is an error item, never the
server's death, while other streams go on), and the OpenAI Agents SDK running an agent with a
hosted MCP tool."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from mcp_servers import CALLS, garbage_server, mcp_server
from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.runtime import Features
from tokenwire.server.config import ResponsesConfig

from api_echo import FEATURES, TEMPLATE, sse_events
from served import MODEL, serve

pytest.importorskip("mcp", reason="MCP tools need pip install 'tokenwire[mcp]'")

EVENTS = TypeAdapter(ResponseStreamEvent)


def call(name: str, **arguments) -> str:
    """The markup the echo engine emits: a call of tool ``name`` (hermes' format)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def mcp_urls():
    with mcp_server() as http, mcp_server("sse") as sse, garbage_server() as garbage:
        yield {"http": http, "sse": sse, "garbage": garbage}


@pytest.fixture(scope="module")
def server(mcp_urls):
    cfg = ResponsesConfig(
        mcp_allowed_urls=("http://127.0.0.1",),
        mcp_timeout=10,  # (a loaded 2-core machine: the hanging tool has its own test)
        mcp_max_output_bytes=1 << 20,
        tool_servers=(f"forecast={mcp_urls['sse']}",),
    )
    with serve(SyntheticConfig(output="echo"), features=FEATURES, responses=cfg) as s:
        s.client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        yield s


def tool(url: str, label: str = "weather", **more) -> dict:
    return {"type": "mcp", "server_label": label, "server_url": url, **more}


def _stream(server, body: dict) -> list[dict]:
    body = {"model": MODEL, "stream": True, **body}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=30) as resp:
        assert resp.status_code == 200, resp.read()
        raw = resp.read().decode()
    events = [data for _, data in sse_events(raw)]
    for e in events:
        EVENTS.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_the_model_calls_an_mcp_tool_and_answers_with_its_output(server, mcp_urls):
    before = CALLS.get("get_weather", 0)
    t = tool(mcp_urls["http"], require_approval="never", headers={"Authorization": "Bearer s"})
    r = server.client.responses.create(
        model=MODEL, input=call("get_weather", city="Paris"), tools=[t]
    )
    Response.model_validate(r.model_dump())
    listing, mcp_call, _ = r.output
    assert listing.type == "mcp_list_tools" and listing.server_label == "weather"
    assert {t.name for t in listing.tools} >= {"get_weather", "add", "hang"}
    assert mcp_call.type == "mcp_call" and mcp_call.name == "get_weather"
    assert json.loads(mcp_call.arguments) == {"city": "Paris"}
    assert mcp_call.output == "Sunny in Paris" and mcp_call.status == "completed"
    assert r.output_text == "Paris: Sunny in Paris"  # the model saw the tool's real answer
    assert CALLS["get_weather"] == before + 1
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    # The headers are the server's secret: the response gives the tool back without them.
    assert r.tools[0].headers is None


def test_the_events_of_a_streamed_response_with_mcp_calls(server, mcp_urls):
    t = tool(mcp_urls["http"], require_approval="never")
    events = _stream(server, {"input": call("get_weather", city="Oslo"), "tools": [t]})
    kinds = [e["type"] for e in events]
    want = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
        "response.output_item.added",
        "response.mcp_call_arguments.delta",
    ]
    assert kinds[: len(want)] == want
    at = kinds.index("response.mcp_call_arguments.done")
    assert kinds[at : at + 4] == [
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
        "response.output_item.done",
    ]
    args = "".join(e["delta"] for e in events if e["type"] == "response.mcp_call_arguments.delta")
    assert json.loads(args) == {"city": "Oslo"}
    final = events[-1]["response"]
    assert kinds[-1] == "response.completed"
    assert [i["type"] for i in final["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    assert final["output"][1]["output"] == "Sunny in Oslo"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "Oslo: Sunny in Oslo"
    # The whole response and the stream agree, and the kept one is the final one.
    kept = server.client.responses.retrieve(final["id"])
    assert [i.type for i in kept.output] == ["mcp_list_tools", "mcp_call", "message"]


def test_approvals_wait_for_the_client_then_run(server, mcp_urls):
    before = CALLS.get("add", 0)
    t = tool(mcp_urls["http"], require_approval={"always": {"tool_names": ["add"]}})
    first = server.client.responses.create(model=MODEL, input=call("add", a=2, b=3), tools=[t])
    assert [i.type for i in first.output] == ["mcp_list_tools", "mcp_approval_request"]
    ask = first.output[1]
    assert ask.name == "add" and json.loads(ask.arguments) == {"a": 2, "b": 3}
    assert CALLS.get("add", 0) == before  # nothing ran before the approval
    approve = {"type": "mcp_approval_response", "approval_request_id": ask.id, "approve": True}
    second = server.client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[approve], tools=[t]
    )
    # The listing in the context is reused (no new mcp_list_tools), the approved call runs.
    assert [i.type for i in second.output] == ["mcp_call", "message"]
    assert second.output[0].approval_request_id == ask.id and second.output[0].output == "5"
    assert CALLS["add"] == before + 1
    # A client that resends every item (store: false) gets the same, and a refusal runs nothing.
    items = [{"role": "user", "content": call("add", a=2, b=3)}] + [
        i.model_dump(exclude_none=True) for i in first.output
    ]
    again = server.client.responses.create(
        model=MODEL, input=[*items, approve], tools=[t], store=False
    )
    assert again.output[0].output == "5" and CALLS["add"] == before + 2
    refuse = {**approve, "approve": False}
    denied = server.client.responses.create(model=MODEL, input=[*items, refuse], tools=[t])
    assert [i.type for i in denied.output] == ["message"] and CALLS["add"] == before + 2


def test_a_tool_server_by_its_label_over_sse_and_urls_the_server_refuses(server, mcp_urls):
    t = {"type": "mcp", "server_label": "forecast", "require_approval": "never"}
    r = server.client.responses.create(
        model=MODEL, input=call("get_weather", city="Rome"), tools=[t]
    )
    assert r.output[1].output == "Sunny in Rome" and r.output_text == "Rome: Sunny in Rome"
    for bad, says in (
        ({"type": "mcp", "server_label": "nowhere"}, "no MCP server labelled"),
        (tool("http://10.1.2.3:80/mcp"), "not allowed"),
        (tool("file:///etc/passwd"), "http(s) URL"),
    ):
        with pytest.raises(openai.BadRequestError) as exc:
            server.client.responses.create(model=MODEL, input="x", tools=[bad])
        assert says in exc.value.body["message"] and exc.value.body["param"] == "tools"


def test_failing_servers_and_tools_are_error_items(server, mcp_urls):
    url = mcp_urls["http"]
    # A tool that raises: the model sees the error and answers.
    r = server.client.responses.create(
        model=MODEL, input=call("broken", city="Lima"), tools=[tool(url, require_approval="never")]
    )
    broken = r.output[1]
    assert broken.status == "failed" and broken.error.type == "mcp_tool_execution_error"
    assert "no weather station in Lima" in json.dumps(broken.error.content)
    assert r.status == "completed" and "no weather station" in r.output_text
    # An answer past --mcp-max-output-bytes.
    r = server.client.responses.create(
        model=MODEL, input=call("flood", city="x"), tools=[tool(url, require_approval="never")]
    )
    assert r.output[1].status == "failed" and r.output[1].error.type == "http_error"
    assert "more than" in r.output[1].error.message
    # A server that answers HTML: its listing fails, the model is offered none of its tools.
    r = server.client.responses.create(
        model=MODEL, input="hello", tools=[tool(mcp_urls["garbage"], label="junk")]
    )
    assert r.output[0].type == "mcp_list_tools" and r.output[0].error
    assert r.output_text == "hello" and r.status == "completed"
    # A server that does not exist.
    r = server.client.responses.create(
        model=MODEL, input="hi", tools=[tool("http://127.0.0.1:9/mcp", label="gone")]
    )
    assert r.output[0].error and r.output_text == "hi"


def test_max_tool_calls_and_the_rounds_are_bounded(server, mcp_urls):
    before = CALLS.get("add", 0)
    t = tool(mcp_urls["http"], require_approval="never")
    two = call("add", a=1, b=1) + "\n" + call("add", a=2, b=2)
    r = server.client.responses.create(model=MODEL, input=two, tools=[t], max_tool_calls=1)
    calls = [i for i in r.output if i.type == "mcp_call"]
    assert [c.status for c in calls] == ["completed", "failed"]
    assert "max_tool_calls" in calls[1].error.message and CALLS["add"] == before + 1


def test_a_hanging_mcp_server_is_an_error_item_after_the_timeout_while_other_streams_go_on(
    mcp_urls,
):
    cfg = ResponsesConfig(mcp_allowed_urls=("http://127.0.0.1",), mcp_timeout=1.5)
    with serve(
        SyntheticConfig(output="echo", step_time=0.01), features=FEATURES, responses=cfg
    ) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        words = " ".join(f"w{k}" for k in range(120))

        def other() -> tuple[float, float]:
            """Another client's stream: its duration, and its longest gap between events."""
            start = last = time.perf_counter()
            gap = 0.0
            with client.responses.stream(model=MODEL, input=words) as stream:
                for _ in stream:
                    now = time.perf_counter()
                    gap, last = max(gap, now - last), now
            return time.perf_counter() - start, gap

        quiet, quiet_gap = other()
        box: dict = {}

        def hung() -> None:
            t0 = time.perf_counter()
            box["r"] = client.responses.create(
                model=MODEL,
                input=call("hang", city="x"),
                tools=[tool(mcp_urls["http"], require_approval="never")],
            )
            box["took"] = time.perf_counter() - t0

        thread = threading.Thread(target=hung)
        thread.start()
        time.sleep(0.3)  # (the call is in flight)
        busy, busy_gap = other()
        thread.join(30)
        r = box["r"]
        assert r.output[1].status == "failed" and r.output[1].error.code == 504
        assert 1.4 < box["took"] < 10  # the timeout, not the tool's 120 s
        # The other stream did not wait on the hung call (margins for a loaded 2-core machine).
        assert busy < 3 * quiet + 0.5 and busy_gap < 5 * quiet_gap + 0.3, (quiet, busy)
        assert s.runtime.engine.alive


def test_background_responses_with_mcp_tools(server, mcp_urls):
    t = tool(mcp_urls["http"], require_approval="never")
    r = server.client.responses.create(
        model=MODEL, input=call("get_weather", city="Kyiv"), tools=[t], background=True
    )
    assert r.status in ("queued", "in_progress")
    deadline = time.monotonic() + 20
    while r.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.05)
        r = server.client.responses.retrieve(r.id)
    assert r.status == "completed" and r.output_text == "Kyiv: Sunny in Kyiv"


def test_an_engine_without_mcp_sdk_names_the_extra(monkeypatch, server, mcp_urls):
    import tokenwire.server.responses.routes as routes

    monkeypatch.setattr(routes, "missing_sdk", lambda: "MCP tools need tokenwire[mcp]")
    with pytest.raises(openai.BadRequestError) as exc:
        server.client.responses.create(model=MODEL, input="x", tools=[tool(mcp_urls["http"])])
    assert "tokenwire[mcp]" in exc.value.body["message"]


def test_the_openai_agents_sdk_runs_an_agent_with_a_hosted_mcp_tool(server, mcp_urls):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # (tracing would export to OpenAI's servers)
    approvals = []

    def approve(request) -> dict:
        approvals.append(request.data.name)
        return {"approve": True}

    def agent(approval: str) -> agents.Agent:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
        hosted = agents.HostedMCPTool(
            tool_config={
                "type": "mcp",
                "server_label": "weather",
                "server_url": mcp_urls["http"],
                "require_approval": approval,
            },
            on_approval_request=approve,
        )
        return agents.Agent(name="weather", instructions="Answer.", tools=[hosted], model=model)

    result = asyncio.run(agents.Runner.run(agent("never"), call("get_weather", city="Paris")))
    assert result.final_output == "Paris: Sunny in Paris"
    kinds = [type(i).__name__ for i in result.new_items]
    assert "MCPListToolsItem" in kinds and "ToolCallItem" in kinds
    # With approvals: the SDK asks the callback, sends the approval, the server runs the call.
    result = asyncio.run(agents.Runner.run(agent("always"), call("get_weather", city="Nice")))
    assert approvals == ["get_weather"] and result.final_output == "Nice: Sunny in Nice"


def test_tool_choice_names_an_mcp_tool_for_the_first_round_only(monkeypatch, mcp_urls):
    from tokenwire.engine.synthetic import SyntheticEngine

    # The engine constrains: the forced call's arguments are decoded within the tool's schema.
    monkeypatch.setattr(SyntheticEngine, "supports_structured_outputs", True, raising=False)
    cfg = ResponsesConfig(mcp_allowed_urls=("http://127.0.0.1",))
    features = Features(chat_template=TEMPLATE)
    with serve(SyntheticConfig(output="echo"), features=features, responses=cfg) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        r = client.responses.create(
            model=MODEL,
            input="Say hi",
            tools=[tool(mcp_urls["http"], require_approval="never")],
            tool_choice={"type": "mcp", "server_label": "weather", "name": "get_weather"},
            max_output_tokens=40,
        )
    kinds = [i.type for i in r.output]
    assert kinds[:2] == ["mcp_list_tools", "mcp_call"] and kinds.count("mcp_call") == 1
    assert r.output[1].name == "get_weather" and r.output[1].output.startswith("Sunny in")


def test_anthropics_mcp_connector_on_messages(server, mcp_urls):
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    servers = [{"type": "url", "url": mcp_urls["http"], "name": "weather"}]
    paris = call("get_weather", city="Paris")
    msg = client.beta.messages.create(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": paris}],
        mcp_servers=servers,
        betas=["mcp-client-2025-04-04"],
    )
    kinds = [b.type for b in msg.content]
    assert kinds == ["mcp_tool_use", "mcp_tool_result", "text"], kinds
    use, result, text = msg.content
    assert use.name == "get_weather" and use.server_name == "weather"
    assert use.input == {"city": "Paris"} and result.tool_use_id == use.id
    assert not result.is_error and result.content[0].text == "Sunny in Paris"
    assert text.text == "Paris: Sunny in Paris" and msg.stop_reason == "end_turn"
    # Streamed: the same blocks, as Anthropic's events, and the SDK's own accumulation.
    with client.beta.messages.stream(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": paris}],
        mcp_servers=servers,
        betas=["mcp-client-2025-04-04"],
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == kinds
    assert final.content[2].text == "Paris: Sunny in Paris"
    assert final.usage.input_tokens == msg.usage.input_tokens  # (every round's, both ways)
    assert final.usage.output_tokens == msg.usage.output_tokens
    assert events[0] == "message_start" and events[-1] == "message_stop"
    # The conversation resent with the MCP blocks in the assistant turn reads as it ran.
    again = client.beta.messages.create(
        model=MODEL,
        max_tokens=50,
        messages=[
            {"role": "user", "content": paris},
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in msg.content],
            },
            {"role": "user", "content": "thanks"},
        ],
        betas=["mcp-client-2025-04-04"],
    )
    assert again.content[0].text == "thanks"
    # A failing tool is an error result; a server URL the server refuses is a 400.
    broken = client.beta.messages.create(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": call("broken", city="Lima")}],
        mcp_servers=servers,
        betas=["mcp-client-2025-04-04"],
    )
    assert broken.content[1].type == "mcp_tool_result" and broken.content[1].is_error
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.beta.messages.create(
            model=MODEL,
            max_tokens=20,
            messages=[{"role": "user", "content": "x"}],
            mcp_servers=[{"type": "url", "url": "http://10.0.0.1/mcp", "name": "far"}],
            betas=["mcp-client-2025-04-04"],
        )
    assert "not allowed" in str(exc.value)


def test_mcp_items_in_a_conversation_and_a_client_gone_mid_call(server, mcp_urls):
    t = tool(mcp_urls["http"], require_approval="never")
    conv = server.client.conversations.create()
    first = server.client.responses.create(
        model=MODEL, input=call("get_weather", city="Bern"), tools=[t], conversation=conv.id
    )
    assert [i.type for i in first.output] == ["mcp_list_tools", "mcp_call", "message"]
    kinds = [i.type for i in server.client.conversations.items.list(conv.id, order="asc").data]
    assert kinds == ["message", "mcp_list_tools", "mcp_call", "message"]
    # The conversation's listing is reused: no new mcp_list_tools item.
    second = server.client.responses.create(
        model=MODEL, input=call("add", a=20, b=22), tools=[t], conversation=conv.id
    )
    assert [i.type for i in second.output] == ["mcp_call", "message"]
    assert second.output[0].output == "42"
    # A client that goes away while a call hangs: the response is kept cancelled.
    body = {"model": MODEL, "input": call("hang", city="x"), "tools": [t], "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=30) as resp:
        rid = None
        for line in resp.iter_lines():
            if line.startswith("data: ") and rid is None:
                rid = json.loads(line[6:])["response"]["id"]
            if "response.mcp_call.in_progress" in line:
                break
    deadline = time.monotonic() + 10
    while server.client.responses.retrieve(rid).status == "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert server.client.responses.retrieve(rid).status == "cancelled"


def test_tool_choice_required_with_only_mcp_tools(server, mcp_urls):
    # (the Agents SDK's ModelSettings(tool_choice="required") with a hosted MCP tool)
    t = tool(mcp_urls["http"], require_approval="never", allowed_tools=["get_weather"])
    r = server.client.responses.create(
        model=MODEL, input=call("get_weather", city="Rome"), tools=[t], tool_choice="required"
    )
    # (the call is decoded within the tool's schema: its city is whatever the engine gave)
    assert r.status == "completed" and r.output[1].output.startswith("Sunny in")
    # A server that lists nothing leaves nothing to choose: the model answers.
    r = server.client.responses.create(
        model=MODEL,
        input="hi",
        tools=[tool(mcp_urls["garbage"], label="junk")],
        tool_choice="required",
    )
    assert r.status == "completed" and r.output_text == "hi"
