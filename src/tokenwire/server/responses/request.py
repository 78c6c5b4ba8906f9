"""A Responses API request (``POST /v1/responses``) read as the chat completions request it amounts
to: ``instructions`` and ``input`` (a string, or items: messages with text parts,
``function_call``, ``function_call_output``, ``reasoning`` and the MCP items) as chat messages,
after the context a ``previous_response_id`` or a ``conversation`` gives; function ``tools``
and ``tool_choice`` in the chat shape, ``mcp`` tools read (``McpTool``: the server runs them);
``text.format`` as ``response_format``; ``reasoning.effort`` as ``reasoning_effort``;
``max_output_tokens`` as ``max_tokens``. Each item is checked here, naming its field
(``input[2].call_id``); what the chat route checks (sampling, the template, the tools' schemas,
structured output) it checks, and its errors name the Responses fields. Plain functions, no
I/O."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
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
    "McpTool",
    "ResponsesRequest",
    "check_metadata",
    "conversation_id",
    "input_messages",
    "item_id",
    "normalize_items",
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
        "max_tool_calls",
    }
)

#: Text content part types, and the key their text is under.
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
_ROLES = ("user", "assistant", "system", "developer")
#: ``include`` values this server cannot honour (the others ask for what it never makes).
_UNSUPPORTED_INCLUDES = {"message.output_text.logprobs"}
#: Item id prefixes, per item type (an item the client sends without an id is given one).
_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "mcp_list_tools": "mcpl",
    "mcp_call": "mcp",
    "mcp_approval_request": "mcpr",
    "mcp_approval_response": "mcpa",
}
#: OpenAI's bounds on ``metadata``.
_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = 16, 64, 512
#: Longest id a client may give an item, a call or a tool (ids are kept and looked up).
MAX_ID_CHARS = 256


def item_id(kind: str) -> str:
    """A new id for an item of type ``kind``."""
    return f"{_ID_PREFIX.get(kind, 'item')}_{uuid.uuid4().hex}"


@dataclass
class McpTool:
    """A request's ``{"type": "mcp"}`` tool: an MCP server the server itself calls."""

    server_label: str
    #: Its URL (None: the ``--tool-server`` of that label).
    server_url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: The tools of the server the model is offered (None: all).
    allowed_tools: frozenset[str] | None = None
    #: ``always``, ``never``, or per tool: tools that need the client's approval first.
    always: frozenset[str] | None = None
    never: frozenset[str] | None = None
    default_approval: bool = True

    def needs_approval(self, name: str) -> bool:
        """Whether calling tool ``name`` waits for an ``mcp_approval_response``."""
        if self.never is not None and name in self.never:
            return False
        if self.always is not None and name in self.always:
            return True
        return self.default_approval


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
    #: This turn's input items, as kept (each with an id).
    input_items: list[dict[str, Any]] = field(default_factory=list)
    #: The items before them (a previous response's context, or a conversation's).
    context_items: list[dict[str, Any]] = field(default_factory=list)
    #: The conversation the response goes in (its items are the context; the turn is added).
    conversation: str | None = None
    #: The MCP servers the request offers the model.
    mcp: list[McpTool] = field(default_factory=list)
    #: ``max_tool_calls``: most built-in (MCP) tool calls the response makes.
    max_tool_calls: int | None = None
    #: ``truncation: "auto"``: drop the oldest items to fit the context.
    truncate: bool = False
    #: ``instructions``, kept apart (each round's messages start with it).
    instructions: str | None = None


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
        elif kind in ("mcp_call", "mcp_approval_request"):
            # A call the server ran (or asks to run): the assistant's tool call, then (a run
            # call) its output; a call run after an approval is that request's output.
            name = _string(item.get("name"), f"{at}.name", where)
            arguments = _arguments(item.get("arguments"), f"{at}.arguments", where)
            call_id = _string(item.get("id"), f"{at}.id", where, required=False) or item_id(kind)
            approved = _string(
                item.get("approval_request_id"), f"{at}.approval_request_id", where, required=False
            )
            if kind == "mcp_approval_request" or approved is None:
                function = {"name": name, "arguments": arguments}
                call = {"id": call_id, "type": "function", "function": function}
                if joinable and reasoning is None and not out[-1].get("tool_calls"):
                    out[-1]["tool_calls"] = [call]  # (the text the model wrote before it)
                else:
                    message = {"role": "assistant", "content": "", "tool_calls": [call]}
                    out.append(assistant(message))
            if kind == "mcp_call":
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": approved or call_id,
                        "content": _mcp_output(item),
                    }
                )
            joinable = False
        elif kind == "mcp_approval_response":
            request = _string(item.get("approval_request_id"), f"{at}.approval_request_id", where)
            if not isinstance(item.get("approve"), bool):
                raise ValidationError(f"{at}.approve must be a boolean", param=where)
            if not item["approve"]:
                declined = "The user declined this tool call."
                out.append({"role": "tool", "tool_call_id": request, "content": declined})
            joinable = False
        elif kind == "mcp_list_tools":
            _string(item.get("server_label"), f"{at}.server_label", where)
            if not isinstance(item.get("tools"), list):
                raise ValidationError(f"{at}.tools must be a list", param=where)
        else:
            shown = kind if isinstance(kind, str) else type(kind).__name__
            raise ValidationError(
                f"{at}.type {shown[:40]!r} is not supported (message, function_call, "
                "function_call_output, reasoning, mcp_list_tools, mcp_call, "
                "mcp_approval_request, mcp_approval_response)",
                param=where,
            )
    if reasoning is not None:
        out.append(assistant({"role": "assistant", "content": ""}))
    return out


def _mcp_output(item: Mapping[str, Any]) -> str:
    """What an ``mcp_call`` gave the model: its output, else its error."""
    if isinstance(item.get("output"), str):
        return item["output"]
    error = item.get("error")
    if error is None:
        return ""
    if isinstance(error, str):
        return "Error: " + error
    return "Error: " + json.dumps(error, ensure_ascii=False)


def _content_parts(content: Any, role: str) -> list[dict[str, Any]]:
    """A message's content as parts (a string as one text part, typed for its role)."""
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        part: dict[str, Any] = {"type": kind, "text": content}
        if kind == "output_text":
            part["annotations"] = []
        return [part]
    return content


def normalize_items(items: Any) -> list[dict[str, Any]]:
    """Input items as kept (``input_messages`` has checked them): a string as a user message,
    each item with its ``type``, an ``id`` (the client's, else a new one) and, for a message,
    its content as parts and a ``status``."""
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    out = []
    for item in items:
        kind = item.get("type") or ("message" if "role" in item else None)
        kept = {**item, "type": kind}
        if not isinstance(kept.get("id"), str) or not kept["id"]:
            kept["id"] = item_id(kind)
        if kind == "message":
            kept["content"] = _content_parts(item.get("content"), item.get("role", "user"))
            kept.setdefault("status", "completed")
        out.append(kept)
    return out


def check_ids(items: Any, where: str = "input") -> None:
    """Ids the client gives (an item's, a call's) are at most ``MAX_ID_CHARS``: they are kept
    and looked up, and no template renders them, so no context check bounds them."""
    if not isinstance(items, list):
        return
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        for key in ("id", "call_id", "approval_request_id"):
            value = item.get(key)
            if isinstance(value, str) and len(value) > MAX_ID_CHARS:
                raise ValidationError(
                    f"{where}[{k}].{key} is {len(value)} characters long (at most {MAX_ID_CHARS})",
                    param=where,
                )


def check_metadata(metadata: Any, param: str = "metadata") -> dict[str, str]:
    """``metadata``: at most 16 pairs of strings, keys up to 64 characters, values up to 512
    (OpenAI's bounds)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ValidationError(f"{param} must be an object of strings", param=param)
    if len(metadata) > _METADATA_PAIRS:
        raise ValidationError(
            f"{param} has {len(metadata)} pairs (at most {_METADATA_PAIRS})", param=param
        )
    for k, v in metadata.items():
        if len(k) > _METADATA_KEY or len(v) > _METADATA_VALUE:
            raise ValidationError(
                f"{param} keys are at most {_METADATA_KEY} characters and values at most "
                f"{_METADATA_VALUE}",
                param=param,
            )
    return metadata


def conversation_id(value: Any) -> str | None:
    """``conversation``: an id, or ``{"id": ...}``."""
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("id")
    if not isinstance(value, str) or not value:
        raise ValidationError(
            "conversation must be a conversation id or {'id': ...}", param="conversation"
        )
    return value


def _names(value: Any, where: str) -> frozenset[str] | None:
    """A list of tool names, or ``{"tool_names": [...]}``."""
    if value is None:
        return None
    if isinstance(value, dict):
        if value.get("read_only"):
            raise ValidationError(
                f"{where}.read_only is not supported by this server", param="tools"
            )
        value = value.get("tool_names", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError(f"{where} must be a list of tool names", param="tools")
    return frozenset(value)


def _mcp_tool(tool: Mapping[str, Any], at: str) -> McpTool:
    """A ``{"type": "mcp"}`` tool, checked."""
    label = _string(tool.get("server_label"), f"{at}.server_label", "tools")
    if not label:
        raise ValidationError(f"{at}.server_label must not be empty", param="tools")
    for key in ("connector_id", "tunnel_id"):
        if tool.get(key) is not None:
            raise ValidationError(f"{at}.{key} is not supported by this server", param="tools")
    url = _string(tool.get("server_url"), f"{at}.server_url", "tools", required=False)
    headers = tool.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ValidationError(f"{at}.headers must be an object of strings", param="tools")
    auth = _string(tool.get("authorization"), f"{at}.authorization", "tools", required=False)
    if auth:
        headers = {**headers, "Authorization": f"Bearer {auth}"}
    spec = McpTool(
        label, url, dict(headers), _names(tool.get("allowed_tools"), f"{at}.allowed_tools")
    )
    approval = tool.get("require_approval", "always")
    if approval in (None, "always", "never"):
        spec.default_approval = approval != "never"
    elif isinstance(approval, dict):
        for key in approval:
            if key not in ("always", "never"):
                raise ValidationError(
                    f"{at}.require_approval has only 'always' and 'never' filters", param="tools"
                )
        spec.always = _names(approval.get("always"), f"{at}.require_approval.always")
        spec.never = _names(approval.get("never"), f"{at}.require_approval.never")
        # (tools neither filter names need approval, as OpenAI's default)
    else:
        raise ValidationError(
            f"{at}.require_approval must be 'always', 'never' or an object of filters",
            param="tools",
        )
    return spec


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
        if kind == "mcp":
            continue  # (read by _mcp_tools)
        if kind != "function":
            shown = kind if isinstance(kind, str) else type(kind).__name__
            raise ValidationError(
                f"{at}.type {shown[:40]!r} is not supported: this server runs function and mcp "
                "tools only",
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


def _mcp_tools(tools: Any) -> list[McpTool]:
    """The request's ``mcp`` tools (one per server label)."""
    out: list[McpTool] = []
    for k, tool in enumerate(tools or ()):
        if isinstance(tool, dict) and tool.get("type") == "mcp":
            spec = _mcp_tool(tool, f"tools[{k}]")
            if any(t.server_label == spec.server_label for t in out):
                raise ValidationError(
                    f"tools[{k}].server_label {spec.server_label[:40]!r} is given twice",
                    param="tools",
                )
            out.append(spec)
    return out


def _tool_choice(choice: Any) -> Any:
    """``none``, ``auto``, ``required``, ``{"type": "function", "name"}`` or ``{"type": "mcp",
    "server_label", "name"}``, in the chat shape (an MCP tool is offered as a function)."""
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = _string(choice.get("name"), "tool_choice.name", "tool_choice")
        return {"type": "function", "function": {"name": name}}
    if isinstance(choice, dict) and choice.get("type") == "mcp":
        _string(choice.get("server_label"), "tool_choice.server_label", "tool_choice")
        name = _string(choice.get("name"), "tool_choice.name", "tool_choice", required=False)
        return {"type": "function", "function": {"name": name}} if name else "required"
    raise ValidationError(
        "tool_choice must be 'none', 'auto', 'required', {'type': 'function', 'name': ...} or "
        "{'type': 'mcp', 'server_label': ..., 'name': ...}",
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
    if body.get("prompt") is not None:
        raise ValidationError("prompt is not supported by this server", param="prompt")
    truncation = body.get("truncation")
    if truncation not in (None, "disabled", "auto"):
        raise ValidationError(
            f"truncation must be 'auto' or 'disabled', got {str(truncation)[:40]!r}",
            param="truncation",
        )
    if body.get("conversation") is not None and body.get("previous_response_id") is not None:
        raise ValidationError(
            "previous_response_id and conversation cannot both be given", param="conversation"
        )
    most = body.get("max_tool_calls")
    if most is not None and (not is_int(most) or most < 1):
        raise ValidationError(
            f"max_tool_calls must be a positive integer, got {most!r}", param="max_tool_calls"
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
    check_metadata(body.get("metadata"))
    if background and stream:
        raise ValidationError(
            "background responses are not streamed by this server: poll "
            "GET /v1/responses/{id} instead",
            param="background",
        )


def _echoed_tools(tools: Any) -> list[Any]:
    """The request's tools as the response gives them back: an MCP tool's headers and token
    left out (secrets the server keeps)."""
    out = []
    for tool in tools or []:
        if isinstance(tool, dict) and tool.get("type") == "mcp":
            tool = {k: v for k, v in tool.items() if k not in ("headers", "authorization")}
        out.append(_echoed_tool(tool))
    return out


def read_request(body: Any, context: list[dict[str, Any]] | None = None) -> ResponsesRequest:
    """A Responses request checked and translated; ``context`` is the items before its input
    (what its ``previous_response_id`` or ``conversation`` gives)."""
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
    conversation = conversation_id(body.get("conversation"))
    max_out = body.get("max_output_tokens")
    if max_out is not None and (not is_int(max_out) or max_out < 1):
        raise ValidationError(
            f"max_output_tokens must be a positive integer, got {max_out!r}",
            param="max_output_tokens",
        )
    check_ids(body["input"])
    turn = input_messages(body["input"])
    if not turn and not _only_approvals(body["input"]):
        raise ValidationError("input must not be empty", param="input")
    context = list(context or [])
    before = input_messages(context, "context")
    history = before + turn
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + history
    tools = _tools(body.get("tools"))
    mcp = _mcp_tools(body.get("tools"))
    response_format, fmt = _text_format(body.get("text"))
    effort, reasoning = _reasoning(body.get("reasoning"))
    chat: dict[str, Any] = {key: body[key] for key in _SAME if body.get(key) is not None}
    chat |= {"messages": messages, "stream": stream, "max_tokens": max_out}
    if tools:
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
        "max_tool_calls": body.get("max_tool_calls"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": previous,
        "conversation": {"id": conversation} if conversation else None,
        "reasoning": reasoning,
        "temperature": body.get("temperature"),
        "text": {"format": fmt},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": _echoed_tools(body.get("tools")),
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation") or "disabled",
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
        input_items=normalize_items(body["input"]),
        context_items=context,
        conversation=conversation,
        mcp=mcp,
        max_tool_calls=body.get("max_tool_calls"),
        truncate=body.get("truncation") == "auto",
        instructions=instructions,
    )


def _only_approvals(items: Any) -> bool:
    """Whether ``items`` are approval responses alone (a turn that only approves a call)."""
    return (
        isinstance(items, list)
        and bool(items)
        and all(isinstance(i, dict) and i.get("type") == "mcp_approval_response" for i in items)
    )
