"""Parsers of model output, as plain incremental objects: reasoning (thinking text apart from the
answer) and tool calls (OpenAI ``tool_calls`` from a model's own markup). Each takes the output
text piece by piece and is exact whatever the split: streaming gives what one parse of the whole
text gives.

Parsers of one's own subclass ``ToolCallParser`` (or a family's shared parser, ``JsonToolParser``
/ ``XmlToolParser`` with their markup as data) or ``ReasoningParser``, and register under a name
with ``register_tool_parser`` / ``register_reasoning_parser``; ``load_parser_plugin`` runs a file
that does so (see docs/output.md, "Parsers of one's own")."""

from __future__ import annotations

from tokenwire.parsers.harmony import GptOssReasoningParser, OpenAIToolParser
from tokenwire.parsers.muse import MuseReasoningParser, MuseToolParser
from tokenwire.parsers.reasoning import (
    REASONING_PARSERS,
    ReasoningDelta,
    ReasoningParser,
    ReasoningStream,
    prompt_opens_reasoning,
)
from tokenwire.parsers.response_template import (
    ResponseTemplate,
    ResponseTemplateError,
    ResponseTemplateReasoningParser,
    ResponseTemplateToolParser,
)
from tokenwire.parsers.tools import (
    TOOL_CALL_PARSERS,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolDelta,
    merge_tool_deltas,
)
from tokenwire.parsers.tools.json_calls import JsonMarkup, JsonToolParser
from tokenwire.parsers.tools.xml import XmlMarkup, XmlToolParser

REASONING_PARSERS[GptOssReasoningParser.name] = GptOssReasoningParser
TOOL_CALL_PARSERS[OpenAIToolParser.name] = OpenAIToolParser
REASONING_PARSERS[MuseReasoningParser.name] = MuseReasoningParser
TOOL_CALL_PARSERS[MuseToolParser.name] = MuseToolParser
REASONING_PARSERS[ResponseTemplateReasoningParser.name] = ResponseTemplateReasoningParser
TOOL_CALL_PARSERS[ResponseTemplateToolParser.name] = ResponseTemplateToolParser

from tokenwire.parsers.plugins import (  # noqa: E402  (the registries are complete first)
    ParserPluginError,
    load_parser_plugin,
    register_reasoning_parser,
    register_tool_parser,
)

__all__ = [
    "REASONING_PARSERS",
    "TOOL_CALL_PARSERS",
    "JsonMarkup",
    "JsonToolParser",
    "ParserPluginError",
    "ReasoningDelta",
    "ReasoningParser",
    "ReasoningStream",
    "ResponseTemplate",
    "ResponseTemplateError",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolDelta",
    "XmlMarkup",
    "XmlToolParser",
    "load_parser_plugin",
    "merge_tool_deltas",
    "prompt_opens_reasoning",
    "register_reasoning_parser",
    "register_tool_parser",
]
