"""Flags about model output (vLLM's names): chat templates, logprob bounds, and the reasoning
and tool-call parsers; read into the runtime's ``Features``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from tokenwire.chat import CONTENT_FORMATS, load_chat_template
from tokenwire.generation_config import GenerationDefaults, load_generation_defaults
from tokenwire.parsers import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ResponseTemplate,
    ResponseTemplateReasoningParser,
    ResponseTemplateToolParser,
)
from tokenwire.parsers.names import REASONING_PARSER_ALIASES, TOOL_PARSER_ALIASES
from tokenwire.parsers.plugins import load_parser_plugin
from tokenwire.runtime.features import REASONING_FIELDS, STRICT_LEVELS, Features
from tokenwire.tokenizer import Tokenizer

__all__ = ["add_arguments", "features", "generation_defaults", "with_response_template"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``tokenwire serve`` options behind ``Features`` (vLLM's names)."""
    chat = parser.add_argument_group("chat templates")
    chat.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE_OR_INLINE",
        help="a jinja2 chat template (a file, or the template itself) replacing the "
        "tokenizer's; base models ship none",
    )
    chat.add_argument(
        "--chat-template-content-format",
        choices=CONTENT_FORMATS,
        default="auto",
        help="message content as the template gets it: a string, or OpenAI's list of parts; "
        "auto looks at the template (default: %(default)s)",
    )
    chat.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="honour a request's own chat_template (otherwise it is a 400); it renders in the "
        "jinja2 sandbox either way",
    )
    chat.add_argument(
        "--default-chat-template-kwargs",
        type=_json_object("--default-chat-template-kwargs"),
        default=None,
        metavar="JSON",
        help="chat template arguments every request gets unless its chat_template_kwargs say "
        "otherwise, e.g. '{\"enable_thinking\": false}'",
    )
    gen = parser.add_argument_group("generation defaults")
    gen.add_argument(
        "--generation-config",
        default="auto",
        metavar="auto|vllm|DIR",
        help="sampling defaults for requests that omit them (temperature, top_p, top_k, min_p, "
        "repetition, presence and frequency penalties, chat max_tokens): auto takes the model's "
        "generation_config.json (the model folder's, else the tokenizer folder's), vllm none, "
        "DIR that folder's (default: %(default)s)",
    )
    gen.add_argument(
        "--override-generation-config",
        type=_json_object("--override-generation-config"),
        default=None,
        metavar="JSON",
        help="generation defaults over those of --generation-config, e.g. '{\"temperature\": 0.5}'",
    )
    parser.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="usage carries prompt_tokens_details.cached_tokens (the prompt tokens the engine "
        "found in its prefix cache) in every response, as vLLM's flag does",
    )
    group = parser.add_argument_group("model output (reasoning, tool calls)")
    group.add_argument(
        "--max-logprobs",
        type=int,
        default=20,
        help="most top logprobs a request may ask for per token; more is a 400 "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--return-tokens-as-token-ids",
        action="store_true",
        help="logprob tokens as 'token_id:N' (the token's id) unless a request's "
        "return_tokens_as_token_ids says otherwise, as vLLM's flag does",
    )
    group.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help="split the model's thinking from its answer into message.reasoning: "
        f"{', '.join(sorted(REASONING_PARSERS))}; SGLang's, smg's and vLLM 0.33's names for "
        f"them: {_aliases(REASONING_PARSER_ALIASES)}; or one a --reasoning-parser-plugin "
        "registers",
    )
    group.add_argument(
        "--reasoning-field",
        choices=REASONING_FIELDS,
        default="reasoning",
        help="the message/delta field for the thinking text: vLLM's reasoning, SGLang's and "
        "DeepSeek's reasoning_content, or both (default: %(default)s)",
    )
    group.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help="the model's tool-call markup, parsed into message.tool_calls: "
        f"{', '.join(sorted(TOOL_CALL_PARSERS))}; SGLang's and smg's names for them: "
        f"{_aliases(TOOL_PARSER_ALIASES)}; or one a --tool-parser-plugin registers",
    )
    group.add_argument(
        "--tool-parser-plugin",
        action="append",
        default=[],
        metavar="FILE",
        help="a Python file that registers tool-call parsers (tokenwire.parsers."
        "register_tool_parser), then named by --tool-call-parser (repeatable)",
    )
    group.add_argument(
        "--reasoning-parser-plugin",
        action="append",
        default=[],
        metavar="FILE",
        help="a Python file that registers reasoning parsers (tokenwire.parsers."
        "register_reasoning_parser), then named by --reasoning-parser (repeatable)",
    )
    group.add_argument(
        "--tool-strict-level",
        choices=STRICT_LEVELS[:3],
        default=None,
        help="how a tool_choice auto call is constrained (the engine's grammar, once the model "
        "starts a call): auto, the arguments of tools marked strict to their schema; function, "
        "every call to one of the request's functions; parameter, also every tool's arguments "
        "to its schema; for the tool-call formats whose arguments are one JSON value after a "
        "fixed head (hermes, internlm, llama3_json, mistral, deepseek_v31, kimi_k2, ...) "
        "(default: SGLang's SGLANG_TOOL_STRICT_LEVEL 0, 1 or 2 when set, else auto; "
        "VLLM_ENFORCE_STRICT_TOOL_CALLING=0 turns it off)",
    )
    group.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="parse tool calls the model chooses to make (tool_choice auto, the default when "
        "a request has tools); needs --tool-call-parser",
    )


def _aliases(table: Any) -> str:
    """``alias (name)`` for each peer's name, for --help (% escaped for argparse)."""
    return ", ".join(f"{alias} ({name})" for alias, (name, _) in sorted(table.items()))


def _json_object(flag: str) -> Any:
    def parse(text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{flag} must be a JSON object: {exc}") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag} must be a JSON object")
        return value

    return parse


def generation_defaults(args: argparse.Namespace, tok: Tokenizer) -> GenerationDefaults:
    """The sampling defaults ``--generation-config`` and ``--override-generation-config`` put in
    force (``auto``: the model folder's, else the tokenizer folder's ``generation_config.json``);
    ``ValueError`` when they are not values a request could carry."""
    folder = getattr(args, "model", None) or args.tokenizer
    return load_generation_defaults(
        args.generation_config,
        folder,
        args.override_generation_config,
        model_generation_config=tok.generation_config,
    )


def features(args: argparse.Namespace) -> Features:
    """``Features`` from parsed ``tokenwire serve`` options, the parser plugins loaded first
    (``ValueError`` if inconsistent or a plugin fails)."""
    for path in [*args.tool_parser_plugin, *args.reasoning_parser_plugin]:
        load_parser_plugin(path)
    template = load_chat_template(args.chat_template) if args.chat_template else None
    return Features(
        reasoning_parser=args.reasoning_parser,
        max_logprobs=args.max_logprobs,
        reasoning_field=args.reasoning_field,
        tool_call_parser=args.tool_call_parser,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        chat_template=template,
        chat_template_content_format=args.chat_template_content_format,
        trust_request_chat_template=args.trust_request_chat_template,
        default_chat_template_kwargs=args.default_chat_template_kwargs or {},
        prompt_tokens_details=args.enable_prompt_tokens_details,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        tool_strict_level=tool_strict_level(args.tool_strict_level),
    )


def tool_strict_level(flag: str | None, env: Mapping[str, str] | None = None) -> str:
    """``--tool-strict-level``, else SGLang's ``SGLANG_TOOL_STRICT_LEVEL`` (0: strict tools
    only, 1 function, 2 parameter), else ``auto``; ``off`` when vLLM's
    ``VLLM_ENFORCE_STRICT_TOOL_CALLING`` is set to neither true nor 1 and no level is given."""
    if flag is not None:
        return flag
    env = os.environ if env is None else env
    enforce = env.get("VLLM_ENFORCE_STRICT_TOOL_CALLING", "true").lower() in ("true", "1")
    if not enforce and "SGLANG_TOOL_STRICT_LEVEL" not in env:  # vLLM's reading of it
        return "off"
    raw = env.get("SGLANG_TOOL_STRICT_LEVEL")
    if raw is None or not raw.strip():
        return "auto"
    try:
        return STRICT_LEVELS[int(raw)]
    except (ValueError, IndexError):
        raise ValueError(f"SGLANG_TOOL_STRICT_LEVEL must be 0, 1 or 2, got {raw!r}") from None


def with_response_template(features: Features, tok: Tokenizer) -> Features:
    """``features`` with the checkpoint's ``response_template`` when an ``hf`` parser reads
    it; ``ValueError`` when the tokenizer has none or tokenwire cannot serve it."""
    if "hf" not in (features.tool_call_parser, features.reasoning_parser):
        return features
    spec = tok.config.get("response_template")
    if spec is None:
        raise ValueError(
            "the hf parsers read the checkpoint's response_template, and this tokenizer's "
            "tokenizer_config.json has none"
        )
    template = ResponseTemplate.load(spec)
    if features.tool_call_parser == "hf":
        ResponseTemplateToolParser.for_template(template)
    if features.reasoning_parser == "hf":
        ResponseTemplateReasoningParser.for_template(template)
    return dataclasses.replace(features, response_template=template)
