"""The parser names peers use: SGLang's (``--tool-call-parser qwen25``, ``--reasoning-parser
deepseek-r1``), smg's (``qwen_coder``, ``cohere_cmd``) and vLLM's renames (``openai_gptoss``),
each an alias of the tokenwire parser (named as vLLM names it) that reads the same markup, so a
command line written for a peer starts tokenwire unchanged.

``resolve_tool_parser`` / ``resolve_reasoning_parser`` give the registered name for a name or
an alias (None when it is neither); the tables below say whose name each alias is.
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenwire.parsers.reasoning import REASONING_PARSERS
from tokenwire.parsers.tools import TOOL_CALL_PARSERS

__all__ = [
    "REASONING_PARSER_ALIASES",
    "TOOL_PARSER_ALIASES",
    "resolve_reasoning_parser",
    "resolve_tool_parser",
]

#: ``alias: (tokenwire's name, whose names use it)`` for ``--tool-call-parser``.
TOOL_PARSER_ALIASES: Mapping[str, tuple[str, str]] = {
    # SGLang 0.5.23 (function_call/parser_names.py)
    "apertus2509": ("apertus", "SGLang"),
    "beam": ("hf", "SGLang, vLLM"),
    "deepseekv3": ("deepseek_v3", "SGLang"),
    "deepseekv31": ("deepseek_v31", "SGLang"),
    "deepseekv32": ("deepseek_v32", "SGLang"),
    "deepseekv4": ("deepseek_v4", "SGLang"),
    "deepseekv41": ("deepseek_v41", "SGLang"),
    "glm": ("glm45", "SGLang, smg"),
    "gpt-oss": ("openai", "SGLang"),
    "hunyuan": ("hy_v3", "SGLang"),
    "interns1": ("internlm", "SGLang"),
    "llama3": ("llama3_json", "SGLang"),
    "minimax-m2": ("minimax_m2", "SGLang"),
    "minimax-m3": ("minimax_m3", "SGLang"),
    "muse": ("muse_glimmer", "SGLang, vLLM"),
    "musespark1x": ("muse_glimmer", "vLLM"),
    "nanbeige": ("qwen3_coder", "SGLang"),
    "qwen": ("hermes", "SGLang, smg"),
    "qwen25": ("hermes", "SGLang"),
    "response_template": ("hf", "SGLang"),
    "spark25": ("glm45", "SGLang"),
    "trinity": ("hermes", "SGLang"),
    # smg (crates/tool_parser/src/factory.rs)
    "cohere": ("cohere_command3", "smg"),
    "deepseek": ("deepseek_v3", "smg"),
    "deepseek31": ("deepseek_v31", "smg"),
    "dsml": ("deepseek_v4", "smg"),
    "glm45_moe": ("glm45", "smg"),
    "glm47_moe": ("glm47", "smg"),
    "json": ("llama3_json", "smg"),
    "kimi": ("kimi_k2", "smg"),
    "kimik2": ("kimi_k2", "smg"),
    "llama": ("llama3_json", "smg"),
    "minimax": ("minimax_m3", "smg"),
    "qwen_coder": ("qwen3_coder", "smg"),
    "qwen_json": ("hermes", "smg"),
    "qwen_xml": ("qwen3_coder", "smg"),
}

#: ``alias: (tokenwire's name, whose names use it)`` for ``--reasoning-parser``.
REASONING_PARSER_ALIASES: Mapping[str, tuple[str, str]] = {
    # vLLM 0.33's names for tokenwire's own
    "openai_gptoss": ("gpt_oss", "vLLM"),
    "beam": ("hf", "SGLang, vLLM"),
    "musespark1x": ("muse_glimmer", "vLLM"),
    # SGLang 0.5.23 (parser/reasoning_parser_names.py)
    "apertus2509": ("apertus", "SGLang"),
    "deepseek-r1": ("deepseek_r1", "SGLang"),
    "deepseek-v3": ("deepseek_v3", "SGLang"),
    "deepseek-v4": ("deepseek_v4", "SGLang"),
    "deepseek-v41": ("deepseek_v41", "SGLang"),
    "dots": ("qwen3", "SGLang"),
    "gigachat35": ("deepseek_r1", "SGLang"),
    "gpt-oss": ("gpt_oss", "SGLang"),
    "hunyuan": ("hy_v3", "SGLang"),
    "interns1": ("qwen3", "SGLang"),
    "iquest_q1": ("deepseek_r1", "SGLang"),
    "minimax": ("minimax_m2", "SGLang, smg"),
    "minimax-append-think": ("minimax_m2_append_think", "SGLang"),
    "minimax-m3": ("minimax_m3", "SGLang"),
    "muse": ("muse_glimmer", "SGLang, vLLM"),
    "nanbeige": ("qwen3", "SGLang"),
    "nemotron_3": ("nemotron_v3", "SGLang"),
    "qwen3-thinking": ("qwen3_thinking", "SGLang"),
    "response_template": ("hf", "SGLang"),
    # smg (crates/reasoning_parser/src/factory.rs)
    "base": ("qwen3", "smg"),
    "cohere_cmd": ("cohere_command3", "smg"),
    "deepseek_v31": ("deepseek_v3", "smg"),
    "kimi_k25": ("kimi_k2", "smg"),
    "kimi_thinking": ("kimi_k2", "smg"),
    "nano_v3": ("nemotron_v3", "smg"),
}


def _resolve(name: str, registry: Mapping[str, object], aliases: Mapping) -> str | None:
    if name in registry:
        return name
    target = aliases.get(name)
    return target[0] if target is not None and target[0] in registry else None


def resolve_tool_parser(name: str) -> str | None:
    """The registered tool-call parser a ``--tool-call-parser`` name selects, or None."""
    return _resolve(name, TOOL_CALL_PARSERS, TOOL_PARSER_ALIASES)


def resolve_reasoning_parser(name: str) -> str | None:
    """The registered reasoning parser a ``--reasoning-parser`` name selects, or None."""
    return _resolve(name, REASONING_PARSERS, REASONING_PARSER_ALIASES)
