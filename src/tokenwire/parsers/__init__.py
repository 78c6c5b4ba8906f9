"""Parsers of model output, as plain incremental objects: reasoning (thinking text apart from the
answer) and tool calls (OpenAI ``tool_calls`` from a model's own markup). Each takes the output
text piece by piece and is exact whatever the split: streaming gives what one parse of the whole
text gives."""

from __future__ import annotations

from tokenwire.parsers.harmony import GptOssReasoningParser, OpenAIToolParser
from tokenwire.parsers.reasoning import (
    REASONING_PARSERS,
    ReasoningDelta,
    ReasoningParser,
    prompt_opens_reasoning,
)
from tokenwire.parsers.tools import (
    TOOL_CALL_PARSERS,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolDelta,
    merge_tool_deltas,
)

REASONING_PARSERS[GptOssReasoningParser.name] = GptOssReasoningParser
TOOL_CALL_PARSERS[OpenAIToolParser.name] = OpenAIToolParser

__all__ = [
    "REASONING_PARSERS",
    "TOOL_CALL_PARSERS",
    "ReasoningDelta",
    "ReasoningParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolDelta",
    "merge_tool_deltas",
    "prompt_opens_reasoning",
]
