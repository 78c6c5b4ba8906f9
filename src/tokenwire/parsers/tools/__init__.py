"""Tool-call parsers, by the names ``--tool-call-parser`` takes (vLLM's)."""

from __future__ import annotations

from tokenwire.parsers.tools.base import (
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolDelta,
    merge_tool_deltas,
)
from tokenwire.parsers.tools.deepseek_v3 import DeepSeekV3ToolParser
from tokenwire.parsers.tools.hermes import HermesToolParser
from tokenwire.parsers.tools.llama3_json import Llama3JsonToolParser
from tokenwire.parsers.tools.mistral import MistralToolParser
from tokenwire.parsers.tools.pythonic import PythonicToolParser

__all__ = [
    "TOOL_CALL_PARSERS",
    "DeepSeekV3ToolParser",
    "HermesToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "PythonicToolParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolDelta",
    "merge_tool_deltas",
]

TOOL_CALL_PARSERS: dict[str, type[ToolCallParser]] = {
    cls.name: cls
    for cls in (
        HermesToolParser,
        Llama3JsonToolParser,
        MistralToolParser,
        PythonicToolParser,
        DeepSeekV3ToolParser,
    )
}
