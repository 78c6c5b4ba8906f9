"""A chat request's tools: ``tool_choice`` read against the server's options, the JSON schema a
forced call is constrained to, and how the choice's output is parsed (reasoning split off, tool
calls parsed). Plain functions over the request body; every refusal is a ``ValidationError``
naming the field."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from tokenwire.chat import check_tools
from tokenwire.messages.errors import ValidationError
from tokenwire.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, prompt_opens_reasoning
from tokenwire.parsers.output import OutputSpec
from tokenwire.parsers.tools.forced import ForcedToolParser, required_schema
from tokenwire.runtime.features import Features
from tokenwire.structured import check_schema

__all__ = ["forced_schema", "output_spec", "strict_tag", "tool_names"]


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


def strict_tag(body: Mapping[str, Any], features: Features, tool_cls: Any) -> str | None:
    """The structural tag that constrains a ``tool_choice: auto`` call (``--tool-strict-level``):
    free text until the format's call trigger, then one call of the request's functions, its
    arguments pinned to the schema of a ``strict`` tool (every tool at ``parameter``) and any
    JSON object for the others; None when nothing is to be constrained or the format's calls
    are not JSON after a fixed head."""
    tools = body.get("tools") or []
    level = features.tool_strict_level
    strict = {t["function"]["name"] for t in tools if t["function"].get("strict") is True}
    if not tools or level == "off" or (level == "auto" and not strict) or tool_cls is None:
        return None
    structures, triggers = [], []
    for k, tool in enumerate(tools):
        name = tool["function"]["name"]
        call = tool_cls.strict_call(name) if hasattr(tool_cls, "strict_call") else None
        if call is None:
            return None
        trigger, begin, end = call
        schema: Any = {"type": "object"}
        if level == "parameter" or name in strict:
            _check_parameters(tools, k)
            schema = tool["function"].get("parameters") or {"type": "object"}
        structures.append({"begin": begin, "schema": schema, "end": end})
        if trigger not in triggers:
            triggers.append(trigger)
    return json.dumps(
        {"type": "structural_tag", "structures": structures, "triggers": triggers},
        ensure_ascii=False,
    )


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
    if getattr(tool_cls, "needs_template", False):
        tool_cls = tool_cls.for_template(features.response_template)
    if getattr(reasoning_cls, "needs_template", False):
        reasoning_cls = reasoning_cls.for_template(features.response_template)
    if tool_cls is None and reasoning_cls is None:
        return None
    opens = reasoning_cls is not None and prompt_opens_reasoning(prompt_text, reasoning_cls)
    return OutputSpec(reasoning_cls, opens, tool_cls, tool_schemas=tools)
