"""What the Responses API and Messages API tests share: a server whose echo engine "answers" with
the last message (its chat template renders only that, then EOS), so a test writes the markup
the model emits (tool calls in hermes' format, thinking in Qwen3's); after a tool result the
template renders the city the call asked about before the result, so a tool round trip ends in a
known answer. And the server-sent events of a raw stream, read."""

from __future__ import annotations

import json
from typing import Any

from tokenwire.runtime import Features

#: The last message's text (after a tool result: the call's city, then the result), then EOS.
TEMPLATE = (
    "{% if messages[-1].role == 'tool' %}"
    "{{ messages[-2].tool_calls[0].function.arguments.city }}: {% endif %}"
    "{{ messages[-1].content }}{{ eos_token }}"
)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THINK = "<think>\nThe user wants the weather 🌧.\n</think>\n\n"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
#: As vLLM serves Qwen3 for agents, with the echo template.
FEATURES = Features(
    tool_call_parser="hermes",
    enable_auto_tool_choice=True,
    reasoning_parser="qwen3",
    chat_template=TEMPLATE,
)


def sse_events(raw: str) -> list[tuple[str | None, Any]]:
    """A stream's events: ``(event name or None, decoded data)`` each (``[DONE]`` as is)."""
    out = []
    for block in raw.split("\n\n"):
        if not block:
            continue
        name = None
        data = None
        for line in block.split("\n"):
            key, _, value = line.partition(": ")
            if key == "event":
                name = value
            elif key == "data":
                data = value if value == "[DONE]" else json.loads(value)
        out.append((name, data))
    return out
