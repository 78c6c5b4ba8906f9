"""tokenwire's Messages API checked against Anthropic's published contract: every message body and
streamed event of a representative request set is read with the ``anthropic`` SDK's own types
and validated with ``jsonschema`` against Anthropic's API reference (its OpenAPI document,
vendored in ``conformance/anthropic-openapi.json``): every field the reference marks required
is present (``stop_details``, ``container``, ``cache_creation_input_tokens``, a text block's
``citations``, a tool use's ``caller``...), null where there is nothing to say."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from pydantic import TypeAdapter

from tokenwire.engine.synthetic import SyntheticConfig

from api_echo import CALL, FEATURES, SCHEMA, THINK, sse_events
from schema_check import Document
from served import MODEL, serve

#: Where Anthropic's own API answers outside its reference, tokenwire does as the API does: the
#: stream's ``ping`` events (the SDK reads and skips them) are no event of the reference's.
ANTHROPIC = Document("anthropic-openapi.json", [])
EVENTS = TypeAdapter(RawMessageStreamEvent)
ERRORS = TypeAdapter(ErrorResponse)
TOOL = {"name": "get_weather", "description": "The weather.", "input_schema": SCHEMA}
USER = [{"role": "user", "content": "Hello, world! 你好"}]

REQUESTS = {
    "plain": {"messages": USER},
    "cut by max_tokens": {"messages": USER, "max_tokens": 2},
    "tool use": {"messages": [{"role": "user", "content": CALL}], "tools": [TOOL]},
    "thinking": {"messages": [{"role": "user", "content": THINK + "Sunny."}]},
    "thinking then a tool use": {
        "messages": [{"role": "user", "content": THINK + CALL}],
        "tools": [TOOL],
    },
    "system and a stop sequence": {
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "one two three"}],
        "stop_sequences": [" three"],
    },
}


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with serve(SyntheticConfig(output="echo"), features=FEATURES) as s:
        yield s


def _post(s, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(s.url + path, json={"model": MODEL, "max_tokens": 200, **body}, timeout=30)


@pytest.mark.parametrize("case", list(REQUESTS))
def test_messages_conform(server, case):
    got = _post(server, "/v1/messages", REQUESTS[case])
    assert got.status_code == 200, got.text
    body = got.json()
    Message.model_validate(body)
    ANTHROPIC.conforms("Message", body)
    assert body["stop_details"] is None and body["container"] is None
    assert body["usage"]["cache_creation_input_tokens"] is None
    with httpx.stream(
        "POST",
        server.url + "/v1/messages",
        json={"model": MODEL, "max_tokens": 200, "stream": True, **REQUESTS[case]},
        timeout=30,
    ) as r:
        assert r.status_code == 200
        events = sse_events(r.read().decode())
    kinds = []
    for name, event in events:
        assert name == event["type"]
        if name != "ping":
            EVENTS.validate_python(event)
            ANTHROPIC.conforms("MessageStreamEvent", event)
        kinds.append(name)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"


def test_the_request_set_covers_tool_use_and_thinking(server):
    got = _post(server, "/v1/messages", REQUESTS["thinking then a tool use"]).json()
    kinds = [b["type"] for b in got["content"]]
    assert kinds == ["thinking", "tool_use"]
    stop = _post(server, "/v1/messages", REQUESTS["system and a stop sequence"]).json()
    assert stop["stop_reason"] == "stop_sequence" and stop["stop_sequence"] == " three"


def test_count_tokens_conforms(server):
    got = _post(server, "/v1/messages/count_tokens", {"messages": USER})
    MessageTokensCount.model_validate(got.json())
    ANTHROPIC.conforms("CountMessageTokensResponse", got.json())


@pytest.mark.parametrize(
    ("body", "status"),
    [({"model": "nope", "messages": USER}, 404), ({"messages": "x"}, 400)],
)
def test_errors_conform(server, body, status):
    got = _post(server, "/v1/messages", body)
    assert got.status_code == status
    ERRORS.validate_python(got.json())
    ANTHROPIC.conforms("ErrorResponse", got.json())
