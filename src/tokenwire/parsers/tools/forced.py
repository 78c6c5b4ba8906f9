"""Tool calls under ``tool_choice: required`` or a named function: the engine constrained the
output to JSON (a list of ``{"name", "parameters"}`` objects, or the named function's arguments),
so the whole output is the calls. It is held until it is complete, then parsed. Output that is
not such JSON (one cut by ``max_tokens``) gives no content and no calls, as vLLM answers: the
finish reason (``length``) says why; the fragment is never shown as the answer."""

from __future__ import annotations

import json
from typing import Any

from tokenwire.parsers.tools.base import ToolCallParser, ToolDelta, strict_json

__all__ = ["ForcedToolParser", "required_schema"]


def required_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of ``tool_choice: required`` output: one or more calls of the tools."""
    return {
        "type": "array",
        "minItems": 1,
        "items": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [t["function"]["name"]]},
                        "parameters": t["function"].get("parameters") or {"type": "object"},
                    },
                    "required": ["name", "parameters"],
                }
                for t in tools
            ]
        },
    }


class ForcedToolParser(ToolCallParser):
    """The whole output as calls: a JSON list of calls, or (``function`` given) its arguments."""

    name = "forced"

    def __init__(self, function: str | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.function = function

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        if not final:
            return
        text, self._buf = self._buf, ""
        try:
            value = strict_json(text)
        except ValueError:
            return  # cut short (or unreadable): no content, no calls
        if self.function is not None:
            self._whole_call(out, self.function, json.dumps(value, ensure_ascii=False))
            return
        if not isinstance(value, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) for c in value
        ):
            return
        for call in value:
            args = call.get("parameters", call.get("arguments", {}))
            self._whole_call(out, call["name"], json.dumps(args, ensure_ascii=False))
