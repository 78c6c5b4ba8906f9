"""A Responses API request (``POST /v1/responses``) read as the chat completions request it amounts
to: ``instructions`` and ``input`` (a string, or items: messages with text parts,
``function_call``, ``function_call_output`` and ``reasoning`` items) as chat messages, after the
conversation of ``previous_response_id``; function ``tools`` and ``tool_choice`` in the chat
shape; ``text.format`` as ``response_format``; ``reasoning.effort`` as ``reasoning_effort``;
``max_output_tokens`` as ``max_tokens``. Each item is checked here, naming its field
(``input[2].call_id``); what the chat route checks (sampling, the template, the tools' schemas,
structured output) it checks, and its errors name the Responses fields. Plain functions, no
I/O."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tokenwire.chat.messages import check_count
from tokenwire.messages.errors import ValidationError
from tokenwire.multimodal.parts import responses_media_part
from tokenwire.server.as_chat import Renames
from tokenwire.server.fields import flag, is_int, warn_unknown_fields
from tokenwire.server.openai.parse import REASONING_EFFORTS

__all__ = [
    "RENAMES",
    "RESPONSES_KEYS",
    "ResponsesRequest",
    "input_messages",
    "read_request",
]

#: Chat field names as the Responses API spells them (in error messages and ``param``).
RENAMES = Renames(
    {
        "messages": "input",
        "max_tokens": "max_output_tokens",
        "response_format": "text.format",
        "reasoning_effort": "reasoning.effort",
        ".function.parameters": ".parameters",
    }
)

#: Request fields passed to the chat request as they are (vLLM's sampling extras among them).
_SAME = (
    "model",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "logit_bias",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "chat_template_kwargs",
    "priority",
)

#: Fields that only annotate the request: accepted, no effect.
_INFORMATIONAL = {
    "user",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "max_tool_calls",
    "stream_options",
}

RESPONSES_KEYS = (
    set(_SAME)
    | _INFORMATIONAL
    | {
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "reasoning",
        "max_output_tokens",
        "text",
        "store",
        "previous_response_id",
        "stream",
        "background",
        "include",
        "truncation",
        "top_logprobs",
        "prompt",
        "conversation",
    }
)

#: Text content part types, and the key their text is under.
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
_ROLES = ("user", "assistant", "system", "developer")
#: ``include`` values this server cannot honour (the others ask for what it never makes).
_UNSUPPORTED_INCLUDES = {"message.output_text.logprobs"}


@dataclass
class ResponsesRequest:
    """A Responses request, checked: the chat request it amounts to, and what the response
    object gives back."""

    #: The chat completions request (``parse_chat`` makes its plan).
    chat: dict[str, Any]
    #: The conversation before this turn's output, without ``instructions`` (what a later
    #: ``previous_response_id`` continues).
    history: list[dict[str, Any]]
    #: How many messages of ``history`` are the previous response's conversation.
    carried: int = 0
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    #: The request's fields the response object echoes (``instructions``, ``tools``...).
    echo: dict[str, Any] = field(default_factory=dict)
    #: How large ``echo`` is, in characters of JSON (what keeping the response costs).
    echo_chars: int = 0
    id: str = field(default_factory=lambda: "resp_" + uuid.uuid4().hex)


def _string(value: Any, where: str, param: str, *, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{where} must be a string", param=param)
    return value


def _text(content: Any, where: str, param: str, *, media: bool = False) -> Any:
    """A message's or a tool output's ``content``: a string, or text parts (joined by newlines,
    as chat content parts are). With ``media`` (a message), ``input_image`` parts and image
    ``input_file`` parts are taken too: the content is then the chat parts, in order."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValidationError(f"{where} must be a string or a list of text parts", param=param)
    if media and any(
        isinstance(p, dict) and p.get("type") in ("input_image", "input_file") for p in content
    ):
        return _media_parts(content, where, param)
    texts = []
    for k, part in enumerate(content):
        at = f"{where}[{k}]"
        kind = part.get("type") if isinstance(part, dict) else None
        key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if key is None:
            shown = kind if isinstance(kind, str) else type(part).__name__
            raise ValidationError(
                f"{at} of type {shown[:40]!r} is not supported (text parts only: "
                "input_text, output_text, refusal)",
                param=param,
            )
        texts.append(_string(part.get(key), f"{at}.{key}", param))
    return "\n".join(t for t in texts if t is not None)


def _media_parts(content: list, where: str, param: str) -> list[dict[str, Any]]:
    """Text and image parts as chat content parts (images as ``image_url``)."""
    out: list[dict[str, Any]] = []
    for k, part in enumerate(content):
        at = f"{where}[{k}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "input_file"):
            item = responses_media_part(part, at, param)
            out.append({"type": "image_url", "image_url": {"url": item.url}, "_field": at})
            continue
        key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if key is None:
            shown = kind if isinstance(kind, str) else type(part).__name__
            raise ValidationError(
                f"{at} of type {shown[:40]!r} is not supported (input_text, input_image, "
                "input_file, output_text, refusal)",
                param=param,
            )
        out.append({"type": "text", "text": _string(part.get(key), f"{at}.{key}", param)})
    return out


def _reasoning_text(item: Mapping[str, Any], where: str, param: str) -> str:
    """A reasoning item's text: its ``reasoning_text`` content, else its summaries."""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise ValidationError(f"{where}.{key} must be a list", param=param)
        texts = []
        for k, part in enumerate(parts):
            if not isinstance(part, dict) or part.get("type") != kind:
                raise ValidationError(f"{where}.{key}[{k}] must be a {kind} part", param=param)
            texts.append(_string(part.get("text"), f"{where}.{key}[{k}].text", param))
        if texts:
            return "\n".join(t for t in texts if t is not None)
    return ""


def _arguments(value: Any, where: str, param: str) -> Any:
    """A call's ``arguments`` (JSON text) as the chat template gets them: an object when they are
    one, else the text as sent."""
    text = _string(value, where, param)
    try:
        parsed = json.loads(text) if text else {}
    except ValueError:
        return text
    except RecursionError:
        raise ValidationError(f"{where} nests too deeply", param=param) from None
    return parsed if isinstance(parsed, dict) else text


def input_messages(items: Any, where: str = "input") -> list[dict[str, Any]]:
    """Responses input items as chat messages: messages as they are (text parts joined), a
    ``function_call`` as a tool call of the assistant message it follows (or of a new one),
    a ``function_call_output`` as a ``tool`` message, a ``reasoning`` item as the
    ``reasoning_content`` of the assistant message after it."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ValidationError(f"{where} must be a string or a list of items", param=where)
    check_count(items, where, "items")
    out: list[dict[str, Any]] = []
    reasoning: list[str] | None = None  # reasoning items' texts, for the assistant message after
    joinable = False  # the last message is an assistant turn a function call belongs to

    def assistant(message: dict[str, Any]) -> dict[str, Any]:
        nonlocal reasoning
        if reasoning is not None:
            message["reasoning_content"] = "\n".join(reasoning)  # (joined once: linear)
            reasoning = None
        return message

    for k, item in enumerate(items):
        at = f"{where}[{k}]"
        if not isinstance(item, dict):
            raise ValidationError(f"{at} must be an object", param=where)
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise ValidationError(
                    f"{at}.role must be one of {', '.join(_ROLES)}, got {str(role)[:40]!r}",
                    param=where,
                )
            content = _text(item.get("content"), f"{at}.content", where, media=role == "user")
            message = {"role": role, "content": content}
            out.append(assistant(message) if role == "assistant" else message)
            joinable = role == "assistant"
        elif kind == "function_call":
            call_id = _string(item.get("call_id"), f"{at}.call_id", where)
            name = _string(item.get("name"), f"{at}.name", where)
            arguments = _arguments(item.get("arguments"), f"{at}.arguments", where)
            function = {"name": name, "arguments": arguments}
            call = {"id": call_id, "type": "function", "function": function}
            if joinable and reasoning is None:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append(assistant({"role": "assistant", "content": "", "tool_calls": [call]}))
                joinable = True
        elif kind == "function_call_output":
            call_id = _string(item.get("call_id"), f"{at}.call_id", where)
            output = _text(item.get("output"), f"{at}.output", where)
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
            joinable = False
        elif kind == "reasoning":
            text = _reasoning_text(item, at, where)
            if reasoning is None:
                reasoning = []
            reasoning.append(text)
            joinable = False
        else:
            shown = kind if isinstance(kind, str) else type(kind).__name__
            raise ValidationError(
                f"{at}.type {shown[:40]!r} is not supported (message, function_call, "
                "function_call_output, reasoning)",
                param=where,
            )
    if reasoning is not None:
        out.append(assistant({"role": "assistant", "content": ""}))
    return out


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses function tools (``{"type": "function", "name", "parameters"...}``) in the
    chat shape."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ValidationError("tools must be a list", param="tools")
    out = []
    for k, tool in enumerate(tools):
        at = f"tools[{k}]"
        if not isinstance(tool, dict):
            raise ValidationError(f"{at} must be an object", param="tools")
        kind = tool.get("type")
        if kind != "function":
            shown = kind if isinstance(kind, str) else type(kind).__name__
            raise ValidationError(
                f"{at}.type {shown[:40]!r} is not supported: this server runs function tools only",
                param="tools",
            )
        function: dict[str, Any] = {"name": _string(tool.get("name"), f"{at}.name", "tools")}
        if tool.get("description") is not None:
            function["description"] = _string(tool["description"], f"{at}.description", "tools")
        if tool.get("parameters") is not None:
            function["parameters"] = tool["parameters"]
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    """``none``, ``auto``, ``required`` or ``{"type": "function", "name"}``, in the chat shape."""
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = _string(choice.get("name"), "tool_choice.name", "tool_choice")
        return {"type": "function", "function": {"name": name}}
    raise ValidationError(
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...} "
        "(this server runs function tools only)",
        param="tool_choice",
    )


def _text_format(text: Any) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``text.format`` as a chat ``response_format`` (None for plain text), and as echoed."""
    if text is None:
        return None, {"type": "text"}
    if not isinstance(text, dict):
        raise ValidationError("text must be an object", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None, {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None, fmt
    if kind == "json_object":
        return {"type": "json_object"}, fmt
    if kind == "json_schema":
        schema: dict[str, Any] = {
            "name": _string(fmt.get("name"), "text.format.name", "text.format"),
            "schema": fmt.get("schema"),
        }
        for key in ("strict", "description"):
            if fmt.get(key) is not None:
                schema[key] = fmt[key]
        return {"type": "json_schema", "json_schema": schema}, fmt
    raise ValidationError(
        "text.format must be {'type': 'text'}, {'type': 'json_object'} or "
        "{'type': 'json_schema', 'name': ..., 'schema': ...}",
        param="text.format",
    )


def _echoed_tool(tool: Any) -> Any:
    """A tool as the response echoes it: a function tool with ``strict`` and ``parameters``
    (null when not given; OpenAI's document requires both)."""
    if isinstance(tool, dict) and tool.get("type") == "function":
        return {**tool, "strict": tool.get("strict"), "parameters": tool.get("parameters")}
    return tool


def _reasoning(reasoning: Any) -> tuple[str | None, dict[str, Any]]:
    """``reasoning.effort`` (passed to the chat template), and the reasoning object echoed."""
    if reasoning is None:
        return None, {"effort": None, "summary": None}
    if not isinstance(reasoning, dict):
        raise ValidationError("reasoning must be an object", param="reasoning")
    effort = reasoning.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise ValidationError(
            f"reasoning.effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}",
            param="reasoning.effort",
        )
    summary = reasoning.get("summary", reasoning.get("generate_summary"))
    if summary not in (None, "auto", "concise", "detailed"):
        raise ValidationError(
            "reasoning.summary must be one of auto, concise, detailed", param="reasoning.summary"
        )
    return effort, {"effort": effort, "summary": summary}


def _check_unsupported(body: Mapping[str, Any], stream: bool, background: bool) -> None:
    """Fields this server understands but cannot honour: a 400 naming them, not ignored."""
    for key in ("prompt", "conversation"):
        if body.get(key) is not None:
            raise ValidationError(f"{key} is not supported by this server", param=key)
    truncation = body.get("truncation")
    if truncation not in (None, "disabled"):
        raise ValidationError(
            f"truncation={truncation!r} is not supported by this server (only 'disabled')",
            param="truncation",
        )
    top = body.get("top_logprobs")
    if top is not None and top != 0:
        raise ValidationError("top_logprobs is not supported by this server", param="top_logprobs")
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
            raise ValidationError("include must be a list of strings", param="include")
        for value in include:
            if value in _UNSUPPORTED_INCLUDES:
                raise ValidationError(
                    f"include {value!r} is not supported by this server", param="include"
                )
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise ValidationError("metadata must be an object of strings", param="metadata")
    if background and stream:
        raise ValidationError(
            "background responses are not streamed by this server: poll "
            "GET /v1/responses/{id} instead",
            param="background",
        )


def read_request(body: Any, history_of: Callable[[str], list[dict[str, Any]]]) -> ResponsesRequest:
    """A Responses request checked and translated; ``history_of(previous_response_id)`` gives
    the conversation a previous response continues (or raises its 404)."""
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", param=None)
    warn_unknown_fields(body, RESPONSES_KEYS)
    if body.get("input") is None:
        raise ValidationError("input is required", param="input")
    stream = flag(body, "stream", False)
    store = flag(body, "store", True)
    background = flag(body, "background", False)
    if background and not store:
        raise ValidationError("background responses must be stored (store: true)", param="store")
    _check_unsupported(body, stream, background)
    instructions = _string(body.get("instructions"), "instructions", "instructions", required=False)
    previous = _string(
        body.get("previous_response_id"),
        "previous_response_id",
        "previous_response_id",
        required=False,
    )
    max_out = body.get("max_output_tokens")
    if max_out is not None and (not is_int(max_out) or max_out < 1):
        raise ValidationError(
            f"max_output_tokens must be a positive integer, got {max_out!r}",
            param="max_output_tokens",
        )
    turn = input_messages(body["input"])
    if not turn:
        raise ValidationError("input must not be empty", param="input")
    before = history_of(previous) if previous is not None else []
    history = before + turn
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + history
    tools = _tools(body.get("tools"))
    response_format, fmt = _text_format(body.get("text"))
    effort, reasoning = _reasoning(body.get("reasoning"))
    chat: dict[str, Any] = {key: body[key] for key in _SAME if body.get(key) is not None}
    chat |= {"messages": messages, "stream": stream, "max_tokens": max_out}
    if tools is not None:
        chat["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None:
        chat["tool_choice"] = choice
    if response_format is not None:
        chat["response_format"] = response_format
    if effort is not None:
        chat["reasoning_effort"] = effort
    echo = {
        "instructions": instructions,
        "max_output_tokens": max_out,
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": previous,
        "reasoning": reasoning,
        "temperature": body.get("temperature"),
        "text": {"format": fmt},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": [_echoed_tool(t) for t in body.get("tools") or []],
        "top_p": body.get("top_p"),
        "truncation": "disabled",
    }
    if body.get("user") is not None:  # (a string in OpenAI's document, never null)
        echo["user"] = body["user"]
    return ResponsesRequest(
        chat,
        history,
        echo_chars=len(msgspec.json.encode(echo)),
        carried=len(before),
        stream=stream,
        store=store,
        background=background,
        previous_response_id=previous,
        echo=echo,
    )
