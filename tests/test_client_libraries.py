"""End to end with the client libraries themselves: the ``openai`` package and
``langchain-openai`` (invoke, stream, batch, async, a tool-calling loop) against a live server.

The engine echoes its prompt; the server's chat template (``--chat-template``) renders the last
message (then EOS), and, after a tool call, the city the assistant asked about: so the "model"
calls the tool when the user's message is a tool call, and answers with the tool's result once it
has it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.runtime import Features
from tokenwire.server import ServerConfig, create_app

from conftest import real_tokenizer
from served import run_tokenwire

MODEL = "Qwen/Qwen3-0.6B"
TEMPLATE = (
    "{% if messages | length > 1 and messages[-2].tool_calls %}"
    "{{ messages[-2].tool_calls[0].function.arguments.city }}: {% endif %}"
    "{{ messages[-1].content }}{{ eos_token }}"
)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {
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


@contextlib.contextmanager
def _serve() -> Iterator[str]:
    tok = real_tokenizer("default")
    engine = SyntheticEngine(tok, SyntheticConfig(output="echo", step_time=0.0))
    features = Features(
        tool_call_parser="hermes", enable_auto_tool_choice=True, chat_template=TEMPLATE
    )
    app = create_app(tok, engine, ServerConfig(model_name=MODEL, features=features))
    with run_tokenwire(app) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with _serve() as url:
        yield url


# ---- openai --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def test_openai_invoke_and_stream(client):
    messages = [{"role": "user", "content": "Hello, world! 你好"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20)
    assert full.choices[0].message.content == "Hello, world! 你好"
    assert full.choices[0].finish_reason == "stop"  # the echo reached the EOS
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "Hello, world! 你好"
    )
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    text = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3)
    assert text.choices[0].text == "Once upon a"


def test_openai_batch_and_async(client, base_url):
    prompts = [f"Request number {k}" for k in range(8)]

    def one(p: str) -> str:
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=10
        )
        return r.choices[0].message.content

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(one, prompts)) == prompts

    async def main() -> list[str]:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as ac:
            outs = await asyncio.gather(
                *(
                    ac.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=10
                    )
                    for p in prompts
                )
            )
            stream = await ac.completions.create(
                model=MODEL, prompt="async stream", max_tokens=5, stream=True
            )
            pieces = [c.choices[0].text async for c in stream]
        return [o.choices[0].message.content for o in outs] + ["".join(pieces)]

    assert asyncio.run(main()) == [*prompts, "async stream"]


def test_openai_tool_calling_loop(client):
    messages: list = [{"role": "user", "content": CALL}]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice="auto", max_tokens=64
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert call.function.arguments == '{"city": "Paris"}'
    # The agent loop: the SDK's own message object back, then the tool's answer.
    messages += [choice.message, {"role": "tool", "tool_call_id": call.id, "content": "Sunny"}]
    second = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], max_tokens=64
    )
    assert second.choices[0].message.content == "Paris: Sunny"
    assert second.choices[0].message.tool_calls in (None, [])


# ---- langchain-openai ----------------------------------------------------------------------------


def test_langchain_invoke_stream_batch_async_and_tools(base_url):
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    chat = lc.ChatOpenAI(model=MODEL, base_url=base_url, api_key="unused", max_tokens=20)
    assert chat.invoke("Bonjour à tous").content == "Bonjour à tous"
    assert "".join(c.content for c in chat.stream("streamed words")) == "streamed words"
    assert [m.content for m in chat.batch(["one", "two", "three"])] == ["one", "two", "three"]
    assert asyncio.run(chat.ainvoke("async")).content == "async"
    llm = lc.OpenAI(model=MODEL, base_url=base_url, api_key="unused", max_tokens=3)
    assert llm.invoke("The capital of France") == "The capital of"

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
    assert bound.invoke(history).content == "Paris: Rain in Paris"
