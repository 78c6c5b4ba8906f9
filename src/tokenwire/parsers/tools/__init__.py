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
from tokenwire.parsers.tools.blocks import (
    FunctionGemmaToolParser,
    Gemma4ToolParser,
    Lfm2ToolParser,
    MinimaxM3ToolParser,
    Olmo3ToolParser,
)
from tokenwire.parsers.tools.deepseek_v3 import (
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
    KimiK2ToolParser,
    Plamo3ToolParser,
)
from tokenwire.parsers.tools.json_calls import (
    ApertusToolParser,
    CohereCommand3ToolParser,
    CohereCommand4ToolParser,
    Ernie45ToolParser,
    GigaChat3ToolParser,
    Granite4ToolParser,
    Granite20bFCToolParser,
    GraniteToolParser,
    HermesToolParser,
    HunyuanA13BToolParser,
    InklingToolParser,
    InternLMToolParser,
    JambaToolParser,
    LongcatToolParser,
    Phi4MiniJsonToolParser,
    Qwen3JsonToolParser,
    XLAMToolParser,
)
from tokenwire.parsers.tools.llama3_json import Llama3JsonToolParser, Llama4JsonToolParser
from tokenwire.parsers.tools.mistral import MistralToolParser
from tokenwire.parsers.tools.passthrough import PassthroughToolParser
from tokenwire.parsers.tools.pythonic import Llama4PythonicToolParser, PythonicToolParser
from tokenwire.parsers.tools.xml import (
    DeepSeekV4ToolParser,
    DeepSeekV32ToolParser,
    DeepSeekV41ToolParser,
    DotsToolParser,
    GigaChat35ToolParser,
    Glm45ToolParser,
    Glm47ToolParser,
    HYV3ToolParser,
    HYV4ToolParser,
    IQuestQ1ToolParser,
    K2HorizonToolParser,
    KimiK3ToolParser,
    Ling3ToolParser,
    MiMoToolParser,
    MiniCPM5ToolParser,
    MinimaxM2ToolParser,
    PoolsideV1ToolParser,
    Qwen3CoderToolParser,
    Qwen3XmlToolParser,
    SeedOssToolParser,
    Step3p5ToolParser,
    Step3ToolParser,
    Step5ToolParser,
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
        # vLLM 0.32 / 0.33's newer families
        Qwen3JsonToolParser,
        Llama4JsonToolParser,
        Llama4PythonicToolParser,
        Granite4ToolParser,
        Ernie45ToolParser,
        ApertusToolParser,
        CohereCommand3ToolParser,
        CohereCommand4ToolParser,
        InklingToolParser,
        Step3p5ToolParser,
        Step5ToolParser,
        MiMoToolParser,
        Ling3ToolParser,
        PoolsideV1ToolParser,
        HYV3ToolParser,
        HYV4ToolParser,
        K2HorizonToolParser,
        DotsToolParser,
        MiniCPM5ToolParser,
        DeepSeekV4ToolParser,
        DeepSeekV41ToolParser,
        KimiK3ToolParser,
        Gemma4ToolParser,
        Lfm2ToolParser,
        MinimaxM3ToolParser,
        Plamo3ToolParser,
        # SGLang's and smg's own families
        GigaChat35ToolParser,
        IQuestQ1ToolParser,
        PassthroughToolParser,
    )
}
