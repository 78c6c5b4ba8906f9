"""Acceptance: structured output from ``tokenwire serve`` on its defaults (the bundled tokenizer,
the synthetic engine replaying text; no GPU, no vLLM), as application code asks for it: the
openai client's ``.parse`` with a Pydantic model, langchain's ``with_structured_output`` (all
three methods) and ``tool_choice`` ``required`` or a named function. Every answer is checked
against its schema with ``jsonschema``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

REPO = Path(__file__).resolve().parent.parent
MODEL = "Qwen/Qwen3-0.6B"


class Unit(str, Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Day(BaseModel):
    name: str
    high: float
    rain: bool


class Forecast(BaseModel):
    city: str
    country: str | None
    unit: Unit
    days: list[Day] = Field(min_length=1, max_length=3)
    summary: str
    confidence: Literal["low", "medium", "high"]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    """``tokenwire serve`` as a user starts it (defaults; a free port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenwire", "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line or line.startswith("tokenwire: serving"):
                break
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def _check(model: type[BaseModel], value: object) -> None:
    jsonschema.validate(value, model.model_json_schema())


@pytest.mark.parametrize("beta", [False, True])
def test_openai_parse_with_a_pydantic_model(client, beta) -> None:
    completions = client.beta.chat.completions if beta else client.chat.completions
    for k in range(1 if beta else 2):
        r = completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": f"The forecast for city {k}?"}],
            response_format=Forecast,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Forecast)
        _check(Forecast, json.loads(choice.message.content))


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_with_structured_output(base_url, method) -> None:
    lc = pytest.importorskip("langchain_openai")
    llm = lc.ChatOpenAI(base_url=base_url, api_key="unused", model=MODEL, max_retries=0)
    schema = None if method == "json_mode" else Forecast
    got = llm.with_structured_output(schema, method=method).invoke("The forecast in Paris?")
    if method == "json_mode":
        assert isinstance(got, dict)
    else:
        assert isinstance(got, Forecast)
        _check(Forecast, got.model_dump(mode="json"))


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "add"}}], ids=str
)
@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_calls(client, choice, stream) -> None:
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        tools=TOOLS,
        tool_choice=choice,
        stream=stream,
    )
    calls: dict[int, list[str]] = {}
    if stream:
        finish = None
        for chunk in r:
            for c in chunk.choices:
                finish = c.finish_reason or finish
                for tc in c.delta.tool_calls or []:
                    got = calls.setdefault(tc.index, ["", ""])
                    got[0] += tc.function.name or ""
                    got[1] += tc.function.arguments or ""
    else:
        finish = r.choices[0].finish_reason
        for i, tc in enumerate(r.choices[0].message.tool_calls or []):
            calls[i] = [tc.function.name, tc.function.arguments]
    assert finish == "tool_calls" and calls
    for name, args in calls.values():
        if isinstance(choice, dict):
            assert name == "add"
        jsonschema.validate(json.loads(args), params[name])
