"""Tool-call parsers, by the names ``--tool-call-parser`` takes (vLLM's).

Families that write calls the same way share one parser, the per-family part being data: JSON
calls after a marker (``json_calls``), XML-style parameters (``xml``), delimited sections of raw
JSON arguments (``deepseek_v3``), blocks read whole (``blocks``); Llama 3 JSON, Mistral, pythonic
and harmony (``tokenwire.parsers.harmony``) have parsers of their own.
"""

from __future__ import annotations

from tokenwire.parsers.tools.base import (
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolDelta,
    merge_tool_deltas,
)
from tokenwire.parsers.tools.blocks import FunctionGemmaToolParser, Olmo3ToolParser
from tokenwire.parsers.tools.deepseek_v3 import (
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
    KimiK2ToolParser,
)
from tokenwire.parsers.tools.json_calls import (
    GigaChat3ToolParser,
    Granite20bFCToolParser,
    GraniteToolParser,
    HermesToolParser,
    HunyuanA13BToolParser,
    InternLMToolParser,
    JambaToolParser,
    LongcatToolParser,
    Phi4MiniJsonToolParser,
    XLAMToolParser,
)
from tokenwire.parsers.tools.llama3_json import Llama3JsonToolParser
from tokenwire.parsers.tools.mistral import MistralToolParser
from tokenwire.parsers.tools.pythonic import PythonicToolParser
from tokenwire.parsers.tools.xml import (
    DeepSeekV32ToolParser,
    Glm45ToolParser,
    Glm47ToolParser,
    MinimaxM2ToolParser,
    Qwen3CoderToolParser,
    Qwen3XmlToolParser,
    SeedOssToolParser,
    Step3ToolParser,
)

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
        DeepSeekV31ToolParser,
        DeepSeekV32ToolParser,
        KimiK2ToolParser,
        Qwen3CoderToolParser,
        Qwen3XmlToolParser,
        SeedOssToolParser,
        Glm45ToolParser,
        Glm47ToolParser,
        MinimaxM2ToolParser,
        Step3ToolParser,
        GraniteToolParser,
        Granite20bFCToolParser,
        InternLMToolParser,
        JambaToolParser,
        HunyuanA13BToolParser,
        Phi4MiniJsonToolParser,
        XLAMToolParser,
        LongcatToolParser,
        GigaChat3ToolParser,
        FunctionGemmaToolParser,
        Olmo3ToolParser,
    )
}
