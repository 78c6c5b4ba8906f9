"""Regenerate the captured request bodies of this folder: run the real clients against a local
tokenwire server (echo engine) that records every request body it gets.

    pip install -e ".[test]" litellm
    python tests/clients/capture.py   # rewrites openai.json, langchain-openai.json, litellm.json,
                                      # anthropic.json, openai-agents.json
    python tests/clients/capture.py anthropic   # ... only those named

The other files of this folder were reconstructed from the clients' public source (each says
which client, version and function); ``tests/test_clients.py`` replays them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import uvicorn

from tokenwire import Tokenizer
from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.runtime import Features
from tokenwire.server import ServerConfig, create_app

HERE = Path(__file__).resolve().parent
MODEL = "Qwen/Qwen3-0.6B"
#: As vLLM serves Qwen3 for agents: ``--enable-auto-tool-choice --tool-call-parser hermes``.
FEATURES = Features(tool_call_parser="hermes", enable_auto_tool_choice=True)
#: The same with a template that renders only the last message (after a tool result: the call's
#: city, then the result): the echo engine then "calls" the tool when asked in hermes' markup, so
#: an agent framework goes through its whole loop.
ECHO_FEATURES = Features(
    tool_call_parser="hermes",
    enable_auto_tool_choice=True,
    chat_template=(
        "{% if messages[-1].role == 'tool' %}"
        "{{ messages[-2].tool_calls[0].function.arguments.city }}: {% endif %}"
        "{{ messages[-1].content }}{{ eos_token }}"
    ),
)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


class Recorder:
    """ASGI wrapper: every request's method, path and JSON body, under the current scenario."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.scenario = ""
        self.records: list[dict[str, Any]] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        if raw:
            self.records.append(
                {
                    "name": self.scenario,
                    "method": scope["method"],
                    "path": scope["path"],
                    "body": json.loads(raw),
                }
            )
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


@contextlib.contextmanager
def server(features: Features = FEATURES) -> Iterator[tuple[str, Recorder]]:
    tok = Tokenizer.default()
    engine = SyntheticEngine(tok, SyntheticConfig(output="echo", step_time=0.0))
    config = ServerConfig(model_name=MODEL, access_log=False, features=features)
    recorder = Recorder(create_app(tok, engine, config))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(recorder, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", recorder
    finally:
        srv.should_exit = True
        thread.join(10)


def run(recorder: Recorder, scenarios: dict[str, Callable[[], Any]]) -> None:
    for name, fn in scenarios.items():
        recorder.scenario = name
        fn()


def openai_scenarios(url: str) -> dict[str, Callable[[], Any]]:
    import openai
    from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageToolCall

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    user = {"role": "user", "content": "What is the weather in Paris?"}
    # What an agent loop appends: the SDK's own message object with its tool call.
    call = ChatCompletionMessage(
        role="assistant",
        content=None,
        tool_calls=[
            ChatCompletionMessageToolCall(
                id="call_0",
                type="function",
                function={"name": "get_weather", "arguments": '{"city": "Paris"}'},
            )
        ],
    )

    def stream_chat() -> None:
        for _ in client.chat.completions.create(
            model=MODEL,
            messages=[user],
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        ):
            pass

    def stream_completion() -> None:
        for _ in client.completions.create(
            model=MODEL, prompt=[785, 3974, 13876, 38835], max_tokens=8, stream=True
        ):
            pass

    async def async_chat() -> None:
        aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        async with aclient:
            await asyncio.gather(
                *(
                    aclient.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"Say {k}"}],
                        max_tokens=8,
                    )
                    for k in range(2)
                )
            )

    return {
        "completion": lambda: client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=16
        ),
        "completion-token-ids-stream": stream_completion,
        "chat": lambda: client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": "Be brief."}, user],
            max_tokens=32,
            temperature=0,
        ),
        "chat-stream-usage": stream_chat,
        "chat-n-seed": lambda: client.chat.completions.create(
            model=MODEL, messages=[user], max_tokens=8, n=2, seed=7
        ),
        "chat-async": lambda: asyncio.run(async_chat()),
        "chat-tools": lambda: client.chat.completions.create(
            model=MODEL, messages=[user], tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=32
        ),
        "chat-tool-result": lambda: client.chat.completions.create(
            model=MODEL,
            messages=[
                user,
                call,
                {"role": "tool", "tool_call_id": "call_0", "content": "Sunny, 24 °C"},
            ],
            tools=[WEATHER_TOOL],
            max_tokens=32,
        ),
        "chat-content-parts": lambda: client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
                {"role": "user", "content": [{"type": "text", "text": "Hello!"}], "name": "ana"},
            ],
            max_completion_tokens=16,
            user="ana",
            metadata={"session": "s1"},
            store=False,
        ),
        **responses_scenarios(client),
    }


RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": WEATHER_TOOL["function"]["parameters"],
}


def responses_scenarios(client: Any) -> dict[str, Callable[[], Any]]:
    """The ``openai`` package's Responses API calls."""
    question = "What is the weather in Paris?"
    # What an agent loop resends: the user's turn, the model's call, the tool's result.
    items = [
        {"role": "user", "content": question},
        {
            "type": "function_call",
            "call_id": "call_3",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_3", "output": "Sunny, 24 °C"},
    ]

    def stream_helper() -> None:
        with client.responses.stream(model=MODEL, input=question, max_output_tokens=16) as s:
            for _ in s:
                pass

    return {
        "responses": lambda: client.responses.create(
            model=MODEL, input=question, instructions="Be brief.", max_output_tokens=32
        ),
        "responses-stream": lambda: list(
            client.responses.create(model=MODEL, input=question, max_output_tokens=24, stream=True)
        ),
        "responses-stream-helper": stream_helper,
        "responses-tools": lambda: client.responses.create(
            model=MODEL, input=question, tools=[RESPONSES_TOOL], tool_choice="auto"
        ),
        "responses-tool-result": lambda: client.responses.create(
            model=MODEL, input=items, tools=[RESPONSES_TOOL], store=False
        ),
        "responses-items": lambda: client.responses.create(
            model=MODEL,
            input=[
                {"role": "developer", "content": [{"type": "input_text", "text": "In French."}]},
                {"role": "user", "content": [{"type": "input_text", "text": "Hello!"}]},
            ],
            max_output_tokens=16,
            temperature=0,
            top_p=1,
            reasoning={"effort": "low"},
            user="ana",
            metadata={"session": "s1"},
        ),
    }


def langchain_scenarios(url: str) -> dict[str, Callable[[], Any]]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI, OpenAI

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "Sunny"

    chat = ChatOpenAI(model=MODEL, base_url=url + "/v1", api_key="unused", max_tokens=32)
    llm = OpenAI(model=MODEL, base_url=url + "/v1", api_key="unused", max_tokens=16)
    history = [
        HumanMessage("What is the weather in Paris?"),
        AIMessage(
            "",
            tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}],
        ),
        ToolMessage("Sunny, 24 °C", tool_call_id="call_1"),
    ]
    return {
        "invoke": lambda: chat.invoke([SystemMessage("Be brief."), HumanMessage("Hi there")]),
        "stream": lambda: list(
            ChatOpenAI(
                model=MODEL,
                base_url=url + "/v1",
                api_key="unused",
                max_tokens=16,
                stream_usage=True,
            ).stream("Tell me a story")
        ),
        "batch": lambda: chat.batch(["One", "Two"]),
        "tools": lambda: chat.bind_tools([get_weather]).invoke(history[:1]),
        "tool-result": lambda: chat.bind_tools([get_weather]).invoke(history),
        "completion-llm": lambda: llm.invoke("The capital of France is"),
        **langchain_responses_scenarios(url),
    }


def langchain_responses_scenarios(url: str) -> dict[str, Callable[[], Any]]:
    """langchain-openai over the Responses API (``use_responses_api=True``)."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "Sunny"

    chat = ChatOpenAI(
        model=MODEL, base_url=url + "/v1", api_key="unused", max_tokens=32, use_responses_api=True
    )
    history = [
        HumanMessage("What is the weather in Paris?"),
        AIMessage(
            "", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_4"}]
        ),
        ToolMessage("Sunny, 24 °C", tool_call_id="call_4"),
    ]
    return {
        "responses-invoke": lambda: chat.invoke("Hi there"),
        "responses-stream": lambda: list(chat.stream("Tell me a story")),
        "responses-tools": lambda: chat.bind_tools([get_weather]).invoke(history[:1]),
        "responses-tool-result": lambda: chat.bind_tools([get_weather]).invoke(history),
    }


def anthropic_scenarios(url: str) -> dict[str, Callable[[], Any]]:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    tool = {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "input_schema": WEATHER_TOOL["function"]["parameters"],
    }
    question = {"role": "user", "content": "What is the weather in Paris?"}

    def stream() -> None:
        with client.messages.stream(model=MODEL, max_tokens=24, messages=[question]) as s:
            "".join(s.text_stream)
            s.get_final_message()

    def tool_loop() -> None:
        # The model calls the tool (the echo template), then gets its result.
        first = client.messages.create(
            model=MODEL, max_tokens=64, tools=[tool], messages=[{"role": "user", "content": CALL}]
        )
        use = first.content[-1]
        client.messages.create(
            model=MODEL,
            max_tokens=64,
            tools=[tool],
            messages=[
                {"role": "user", "content": CALL},
                {"role": "assistant", "content": first.content},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}],
                },
            ],
        )

    return {
        "messages": lambda: client.messages.create(model=MODEL, max_tokens=32, messages=[question]),
        "messages-stream": stream,
        "messages-system-stop": lambda: client.messages.create(
            model=MODEL,
            max_tokens=32,
            system=[{"type": "text", "text": "Be brief."}],
            stop_sequences=["\n\n"],
            metadata={"user_id": "ana"},
            # (sampling fields this client version no longer names, as older ones sent them)
            extra_body={"temperature": 0, "top_p": 1, "top_k": 5},
            messages=[question],
        ),
        "messages-thinking-off": lambda: client.messages.create(
            model=MODEL, max_tokens=16, thinking={"type": "disabled"}, messages=[question]
        ),
        "messages-tool-loop": tool_loop,
        "count-tokens": lambda: client.messages.count_tokens(
            model=MODEL, system="Be brief.", tools=[tool], messages=[question]
        ),
    }


def agents_scenarios(url: str) -> dict[str, Callable[[], Any]]:
    """The OpenAI Agents SDK running an agent with one function tool (its loop: the call, then
    the result), plainly and streamed."""
    import agents
    import openai

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"Sunny in {city}"

    def agent() -> Any:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
        tools = [get_weather]
        return agents.Agent(name="weather", instructions="Answer.", tools=tools, model=model)

    async def streamed() -> None:
        run = agents.Runner.run_streamed(agent(), CALL)
        async for _ in run.stream_events():
            pass

    return {
        "agent-run": lambda: asyncio.run(agents.Runner.run(agent(), CALL)),
        "agent-run-streamed": lambda: asyncio.run(streamed()),
    }


def litellm_scenarios(url: str) -> dict[str, Callable[[], Any]]:
    import litellm

    base = {"api_base": url + "/v1", "api_key": "unused"}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    history = [
        *messages,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "Sunny, 24 °C"},
    ]

    def stream() -> None:
        for _ in litellm.completion(
            model=f"openai/{MODEL}", messages=messages, max_tokens=16, stream=True, **base
        ):
            pass

    return {
        "completion-openai": lambda: litellm.completion(
            model=f"openai/{MODEL}", messages=messages, max_tokens=16, **base
        ),
        "completion-hosted-vllm": lambda: litellm.completion(
            model=f"hosted_vllm/{MODEL}", messages=messages, max_tokens=16, **base
        ),
        "stream": stream,
        "tool-result": lambda: litellm.completion(
            model=f"openai/{MODEL}", messages=history, tools=[WEATHER_TOOL], max_tokens=16, **base
        ),
        "text-completion": lambda: litellm.text_completion(
            model=f"text-completion-openai/{MODEL}", prompt="Once upon a time", max_tokens=8, **base
        ),
    }


def main(argv: list[str]) -> int:
    clients = {
        "openai": ("openai", openai_scenarios, FEATURES),
        "langchain-openai": ("langchain-openai", langchain_scenarios, FEATURES),
        "litellm": ("litellm", litellm_scenarios, FEATURES),
        "anthropic": ("anthropic", anthropic_scenarios, ECHO_FEATURES),
        "openai-agents": ("openai-agents", agents_scenarios, ECHO_FEATURES),
    }
    for name in argv:
        if name not in clients:
            print(f"no client {name!r}: one of {', '.join(clients)}", file=sys.stderr)
            return 2
    for name, (dist, scenarios, features) in clients.items():
        if argv and name not in argv:
            continue
        with server(features) as (url, recorder):
            run(recorder, scenarios(url))
        version = importlib.metadata.version(dist)
        out = {
            "client": f"{dist} {version}",
            "source": "captured from the client by tests/clients/capture.py",
            "requests": recorder.records,
        }
        (HERE / f"{name}.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
        print(f"{name}: {len(recorder.records)} requests", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
