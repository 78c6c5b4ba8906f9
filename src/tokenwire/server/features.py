"""What a chat request gets beyond plain text: reasoning split off, tool calls parsed, by the
server's options and the request's ``tools``/``tool_choice``/``chat_template_kwargs``.

Plain functions over the request body (no I/O); every refusal is a ``ValidationError`` naming
the field.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenwire.messages.errors import ValidationError
from tokenwire.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, prompt_opens_reasoning
from tokenwire.parsers.output import OutputSpec
from tokenwire.parsers.tools.forced import ForcedToolParser, required_schema
from tokenwire.server.chat import check_tools
from tokenwire.server.structured import check_schema
from tokenwire.server.templates import CONTENT_FORMATS, load_chat_template

__all__ = [
    "DEFAULT_FEATURES",
    "REASONING_FIELDS",
    "Features",
    "add_arguments",
    "forced_schema",
    "from_args",
    "output_spec",
    "tool_names",
]

#: ``--reasoning-field`` choices: vLLM's current field, SGLang's/DeepSeek's, or both.
REASONING_FIELDS = ("reasoning", "reasoning_content", "both")


@dataclass(frozen=True)
class Features:
    """Server options about model output (``tokenwire serve`` flags, vLLM's names)."""

    #: ``--reasoning-parser``: a name in ``REASONING_PARSERS``.
    reasoning_parser: str | None = None
    #: ``--reasoning-field``: where the thinking text goes in messages and deltas.
    reasoning_field: str = "reasoning"
    #: ``--tool-call-parser``: a name in ``TOOL_CALL_PARSERS``.
    tool_call_parser: str | None = None
    #: ``--enable-auto-tool-choice``: parse the model's own tool calls (``tool_choice: auto``).
    enable_auto_tool_choice: bool = False
    #: ``--max-logprobs``: most top logprobs a request may ask for per token (vLLM's 20).
    max_logprobs: int = 20
    #: Whether the engine constrains decoding (JSON schema, regex, grammar).
    structured_outputs: bool = False
    #: ``--chat-template``: replaces the tokenizer's template (the template text).
    chat_template: str | None = None
    #: ``--chat-template-content-format``: ``auto``, ``string`` or ``openai``.
    chat_template_content_format: str = "auto"
    #: ``--trust-request-chat-template``: a request's own ``chat_template`` is used.
    trust_request_chat_template: bool = False

    def __post_init__(self) -> None:
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"reasoning parser must be one of {', '.join(REASONING_PARSERS)}, "
                f"got {self.reasoning_parser!r}"
            )
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"tool-call parser must be one of {', '.join(TOOL_CALL_PARSERS)}, "
                f"got {self.tool_call_parser!r}"
            )
        if self.reasoning_field not in REASONING_FIELDS:
            raise ValueError(f"reasoning field must be one of {', '.join(REASONING_FIELDS)}")
        if self.max_logprobs < 0:
            raise ValueError("max logprobs must be at least 0")
        if self.chat_template_content_format not in CONTENT_FORMATS:
            raise ValueError(f"chat template content format must be one of {CONTENT_FORMATS}")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")

    def reasoning_fields(self) -> tuple[str, ...]:
        """The message/delta keys the thinking text goes under."""
        if self.reasoning_field == "both":
            return ("reasoning", "reasoning_content")
        return (self.reasoning_field,)


DEFAULT_FEATURES = Features()


def tool_names(tools: Any) -> list[str]:
    """The function names of a ``tools`` list (OpenAI's shape), checked."""
    check_tools(tools)
    return [tool["function"]["name"] for tool in tools]


def _tool_choice(
    body: Mapping[str, Any], names: list[str] | None, features: Features
) -> str | tuple[str, str]:
    """``none``, ``auto``, ``required`` or ``("function", name)``; a 400 for what this server
    cannot do (``required`` and a named function need an engine that constrains decoding)."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if names and features.enable_auto_tool_choice else "none"
    if choice == "none":
        return "none"
    if not names and (choice in ("auto", "required") or isinstance(choice, dict)):
        raise ValidationError("tool_choice needs tools", param="tool_choice")
    if choice == "auto":
        if not features.enable_auto_tool_choice:
            raise ValidationError(
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set on the server",
                param="tool_choice",
            )
        return "auto"
    if choice == "required" or isinstance(choice, dict):
        picked: str | tuple[str, str] = "required"
        if isinstance(choice, dict):
            fn = choice.get("function")
            name = fn.get("name") if isinstance(fn, dict) else None
            if choice.get("type") != "function" or not isinstance(name, str):
                raise ValidationError(
                    "tool_choice must be 'none', 'auto', 'required' or "
                    "{'type': 'function', 'function': {'name': ...}}",
                    param="tool_choice",
                )
            if names is not None and name not in names:
                raise ValidationError(
                    f"tool_choice names the function {name!r}, which is not in tools",
                    param="tool_choice",
                )
            picked = ("function", name)
        if not features.structured_outputs:
            what = "required" if choice == "required" else "a named function"
            raise ValidationError(
                f"tool_choice {what} needs an engine with structured output (constrained "
                "decoding) and this server's engine has none; use 'auto' or 'none'",
                param="tool_choice",
            )
        return picked
    raise ValidationError(
        f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}",
        param="tool_choice",
    )


def forced_schema(body: Mapping[str, Any]) -> str | None:
    """The JSON schema (text) an engine must constrain the output to for ``tool_choice``
    ``required`` or a named function (checked by ``output_spec`` first), else None."""
    choice = body.get("tool_choice")
    tools = body.get("tools") or []
    if choice == "required":
        for k in range(len(tools)):
            _check_parameters(tools, k)
        schema = required_schema(tools)
    elif isinstance(choice, dict):
        name = choice["function"]["name"]
        k = next(k for k, t in enumerate(tools) if t["function"]["name"] == name)
        _check_parameters(tools, k)
        schema = tools[k]["function"].get("parameters") or {"type": "object"}
    else:
        return None
    return json.dumps(schema, ensure_ascii=False)


def _check_parameters(tools: list[Any], k: int) -> None:
    """A forced tool's ``parameters`` become the engine's grammar: a JSON schema object (or
    absent), checked as ``response_format``'s schema is."""
    params = tools[k]["function"].get("parameters")
    if params is None:
        return
    where = f"tools[{k}].function.parameters"
    if not isinstance(params, dict):
        raise ValidationError(f"{where} must be a JSON schema object", param=where)
    check_schema(params, where)


def output_spec(
    body: Mapping[str, Any],
    features: Features,
    prompt_text: str,
    template_kwargs: Mapping[str, Any],
) -> OutputSpec | None:
    """How a chat request's outputs are parsed, or None for plain text."""
    tools = body.get("tools")
    names = tool_names(tools) if tools is not None else None
    choice = _tool_choice(body, names, features)
    tool_cls: Any = None
    if choice == "auto":
        tool_cls = TOOL_CALL_PARSERS[features.tool_call_parser]
    elif choice == "required":
        tool_cls = ForcedToolParser
    elif isinstance(choice, tuple):
        tool_cls = functools.partial(ForcedToolParser, choice[1])
    reasoning_cls = None
    if features.reasoning_parser is not None and not (
        template_kwargs.get("enable_thinking") is False or template_kwargs.get("thinking") is False
    ):
        reasoning_cls = REASONING_PARSERS[features.reasoning_parser]
    if tool_cls is None and reasoning_cls is None:
        return None
    opens = reasoning_cls is not None and prompt_opens_reasoning(prompt_text, reasoning_cls)
    return OutputSpec(reasoning_cls, opens, tool_cls)


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
    group = parser.add_argument_group("model output (reasoning, tool calls)")
    group.add_argument(
        "--max-logprobs",
        type=int,
        default=20,
        help="most top logprobs a request may ask for per token; more is a 400 "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--reasoning-parser",
        choices=sorted(REASONING_PARSERS),
        default=None,
        help="split the model's thinking from its answer into message.reasoning",
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
        choices=sorted(TOOL_CALL_PARSERS),
        default=None,
        help="the model's tool-call markup, parsed into message.tool_calls",
    )
    group.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="parse tool calls the model chooses to make (tool_choice auto, the default when "
        "a request has tools); needs --tool-call-parser",
    )


def from_args(args: argparse.Namespace) -> Features:
    """``Features`` from parsed ``tokenwire serve`` options (``ValueError`` if inconsistent)."""
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
    )
