"""Regenerate the captured request bodies of this folder: run the real clients against a local
tokenwire server (echo engine) that records every request body it gets.

    pip install -e ".[test]" openai langchain-openai litellm
    python tests/clients/capture.py   # rewrites openai.json, langchain-openai.json, litellm.json

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
def server() -> Iterator[tuple[str, Recorder]]:
    tok = Tokenizer.default()
    engine = SyntheticEngine(tok, SyntheticConfig(output="echo", step_time=0.0))
    config = ServerConfig(model_name=MODEL, access_log=False, features=FEATURES)
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


def main() -> int:
    clients = {
        "openai": ("openai", openai_scenarios),
        "langchain-openai": ("langchain-openai", langchain_scenarios),
        "litellm": ("litellm", litellm_scenarios),
    }
    for name, (dist, scenarios) in clients.items():
        with server() as (url, recorder):
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
    sys.exit(main())
