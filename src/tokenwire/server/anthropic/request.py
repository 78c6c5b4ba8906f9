"""An Anthropic Messages request (``POST /v1/messages``, ``/v1/messages/count_tokens``) read as the
chat completions request it amounts to: ``system`` (a string or text blocks) as a system message;
``messages`` with ``text``, ``tool_use``, ``tool_result`` and ``thinking`` blocks as chat
messages (an assistant's tool uses as its tool calls, a user's tool results as ``tool``
messages, its thinking as ``reasoning_content``); ``tools`` (``input_schema``) and
``tool_choice`` (``auto``, ``any``, ``tool``, ``none``) in the chat shape; ``stop_sequences`` as
``stop``; ``thinking`` as the template's ``enable_thinking``. Each block is checked here, naming
its field (``messages[1].content[0].tool_use_id``); what the chat route checks it checks, and its
errors name Anthropic's fields. Plain functions, no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenwire.chat.messages import check_count
from tokenwire.messages.errors import ValidationError
from tokenwire.multimodal.parts import anthropic_image
from tokenwire.server.as_chat import Renames
from tokenwire.server.fields import is_int, warn_unknown_fields

__all__ = [
    "COUNT_TOKENS_KEYS",
    "MESSAGES_KEYS",
    "RENAMES",
    "McpServer",
    "MessagesRequest",
    "read_count_tokens",
    "read_messages",
]

#: Chat field names as Anthropic's API spells them (in error messages and ``param``).
RENAMES = Renames({"stop": "stop_sequences", ".function.parameters": ".input_schema"})

_SAME = ("model", "temperature", "top_p", "top_k")
_INFORMATIONAL = {"metadata", "service_tier", "container", "context_management"}
COUNT_TOKENS_KEYS = {"model", "messages", "system", "tools", "tool_choice", "thinking"}
MESSAGES_KEYS = (
    COUNT_TOKENS_KEYS
    | set(_SAME)
    | _INFORMATIONAL
    | {"max_tokens", "stop_sequences", "stream", "mcp_servers"}
)
_ROLES = ("user", "assistant", "system")


@dataclass
class McpServer:
    """One of ``mcp_servers`` (Anthropic's MCP connector): a server the server itself calls."""

    name: str
    url: str | None
    headers: dict[str, str] = field(default_factory=dict)
    #: The tools of the server the model is offered (None: all).
    allowed_tools: frozenset[str] | None = None


@dataclass
class MessagesRequest:
    """A Messages request, checked: the chat request it amounts to."""

    chat: dict[str, Any]
    stream: bool = False
    mcp_servers: list[McpServer] = field(default_factory=list)


def _mcp_servers(value: Any) -> list[McpServer]:
    """``mcp_servers``: ``{"type": "url", "url", "name", "authorization_token",
    "tool_configuration": {"enabled", "allowed_tools"}}`` each."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValidationError("mcp_servers must be a list", param="mcp_servers")
    out: list[McpServer] = []
    for k, server in enumerate(value):
        at = f"mcp_servers[{k}]"
        if not isinstance(server, dict) or server.get("type", "url") != "url":
            raise ValidationError(f"{at} must be an object of type url", param="mcp_servers")
        name = server.get("name")
        if not isinstance(name, str) or not name:
            raise ValidationError(f"{at}.name must be a non-empty string", param="mcp_servers")
        if any(s.name == name for s in out):
            raise ValidationError(f"{at}.name {name[:40]!r} is given twice", param="mcp_servers")
        url = server.get("url")
        if url is not None and not isinstance(url, str):
            raise ValidationError(f"{at}.url must be a string", param="mcp_servers")
        headers = {}
        token = server.get("authorization_token")
        if token is not None:
            if not isinstance(token, str):
                raise ValidationError(
                    f"{at}.authorization_token must be a string", param="mcp_servers"
                )
            headers["Authorization"] = f"Bearer {token}"
        config = server.get("tool_configuration") or {}
        if not isinstance(config, dict):
            raise ValidationError(f"{at}.tool_configuration must be an object", param="mcp_servers")
        if config.get("enabled") is False:
            continue
        allowed = config.get("allowed_tools")
        if allowed is not None and (
            not isinstance(allowed, list) or not all(isinstance(t, str) for t in allowed)
        ):
            raise ValidationError(
                f"{at}.tool_configuration.allowed_tools must be a list of names",
                param="mcp_servers",
            )
        out.append(
            McpServer(name, url, headers, frozenset(allowed) if allowed is not None else None)
        )
    return out


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{where} must be a string", param=where.split("[")[0].split(".")[0])
    return value


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """``content``: a string (one text block) or a list of blocks."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ValidationError(f"{where} must be a string or a list of content blocks", param=where)
    check_count(content, where.split("[")[0], "content blocks")
    for k, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ValidationError(f"{where}[{k}] must be a content block with a type", param=where)
    return content


def _texts(content: Any, where: str) -> str:
    """Text blocks (or a string) as one string (joined by newlines, as chat text parts are)."""
    texts = []
    for k, block in enumerate(_blocks(content, where)):
        if block["type"] != "text":
            raise ValidationError(
                f"{where}[{k}] of type {block['type'][:40]!r} is not supported here (text only)",
                param=where,
            )
        texts.append(_string(block.get("text"), f"{where}[{k}].text"))
    return "\n".join(texts)


def _tool_use(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    arguments = block.get("input")
    if not isinstance(arguments, dict):
        raise ValidationError(f"{where}.input must be an object", param="messages")
    return {
        "id": _string(block.get("id"), f"{where}.id"),
        "type": "function",
        "function": {"name": _string(block.get("name"), f"{where}.name"), "arguments": arguments},
    }


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    content = block.get("content")
    if content is None:
        content = ""
    text = _texts(content, f"{where}.content")
    if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
        raise ValidationError(f"{where}.is_error must be a boolean", param="messages")
    call_id = _string(block.get("tool_use_id"), f"{where}.tool_use_id")
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results as ``tool`` messages, then its text and images (as chat
    ``image_url`` parts, in order)."""
    tools, texts, parts = [], [], []
    for k, block in enumerate(_blocks(content, f"{where}.content")):
        at = f"{where}.content[{k}]"
        kind = block["type"]
        if kind == "text":
            texts.append(_string(block.get("text"), f"{at}.text"))
            parts.append({"type": "text", "text": texts[-1]})
        elif kind == "image":
            item = anthropic_image(block, at)
            parts.append({"type": "image_url", "image_url": {"url": item.url}, "_field": at})
        elif kind == "tool_result":
            tools.append(_tool_result(block, at))
        else:
            raise ValidationError(
                f"{at} of type {kind[:40]!r} is not supported in a user turn (text, image, "
                "tool_result)",
                param="messages",
            )
    if len(parts) > len(texts):  # images: the parts as they came
        return tools + [{"role": "user", "content": parts}]
    return tools + ([{"role": "user", "content": "\n".join(texts)}] if texts or not tools else [])


def _assistant(content: Any, where: str) -> list[dict[str, Any]]:
    """An assistant turn: its text, its tool uses as tool calls, its thinking; an MCP tool's
    result in it (``mcp_tool_result``, the server ran the call) ends the assistant message
    there and is the call's ``tool`` message."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []

    def flush() -> None:
        if not (texts or calls or thinking):
            return
        message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
        if calls:
            message["tool_calls"] = list(calls)
        if thinking:
            message["reasoning_content"] = "\n".join(thinking)
        out.append(message)
        texts.clear()
        calls.clear()
        thinking.clear()

    for k, block in enumerate(_blocks(content, f"{where}.content")):
        at = f"{where}.content[{k}]"
        kind = block["type"]
        if kind == "text":
            texts.append(_string(block.get("text"), f"{at}.text"))
        elif kind in ("tool_use", "mcp_tool_use"):
            calls.append(_tool_use(block, at))
        elif kind == "mcp_tool_result":
            flush()
            out.append(_tool_result(block, at))
        elif kind == "thinking":
            thinking.append(_string(block.get("thinking"), f"{at}.thinking"))
        elif kind != "redacted_thinking":  # (opaque: nothing a template can show)
            raise ValidationError(
                f"{at} of type {kind[:40]!r} is not supported in an assistant turn (text, "
                "tool_use, thinking, mcp_tool_use, mcp_tool_result)",
                param="messages",
            )
    flush()
    return out or [{"role": "assistant", "content": ""}]


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``system`` and ``messages`` as chat messages."""
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        text = _texts(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValidationError("messages must be a non-empty list", param="messages")
    check_count(messages, "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ValidationError(f"{where} must be an object", param="messages")
        role = message.get("role")
        if role not in _ROLES:
            raise ValidationError(
                f"{where}.role must be user or assistant, got {str(role)[:40]!r}",
                param="messages",
            )
        if role == "user":
            out += _user(message.get("content"), where)
        elif role == "assistant":
            out += _assistant(message.get("content"), where)
        else:
            out.append({"role": "system", "content": _texts(message.get("content"), where)})
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Anthropic's client tools (``name``, ``description``, ``input_schema``) in the chat shape."""
    if not isinstance(tools, list):
        raise ValidationError("tools must be a list", param="tools")
    out = []
    for k, tool in enumerate(tools):
        at = f"tools[{k}]"
        if not isinstance(tool, dict):
            raise ValidationError(f"{at} must be an object", param="tools")
        if tool.get("type") not in (None, "custom"):
            raise ValidationError(
                f"{at}.type {str(tool['type'])[:40]!r} is not supported: this server runs "
                "client tools only",
                param="tools",
            )
        function: dict[str, Any] = {"name": _string(tool.get("name"), f"{at}.name")}
        if tool.get("description") is not None:
            function["description"] = _string(tool["description"], f"{at}.description")
        if not isinstance(tool.get("input_schema"), dict):
            raise ValidationError(f"{at}.input_schema must be a JSON schema object", param="tools")
        function["parameters"] = tool["input_schema"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> tuple[Any, bool | None]:
    """``tool_choice`` in the chat shape, and whether parallel tool calls are allowed."""
    if not isinstance(choice, dict):
        raise ValidationError("tool_choice must be an object with a type", param="tool_choice")
    kind = choice.get("type")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise ValidationError(
            "tool_choice.disable_parallel_tool_use must be a boolean", param="tool_choice"
        )
    allowed = None if parallel is None else not parallel
    if kind == "auto":
        return "auto", allowed
    if kind == "any":
        return "required", allowed
    if kind == "none":
        return "none", allowed
    if kind == "tool":
        name = _string(choice.get("name"), "tool_choice.name")
        return {"type": "function", "function": {"name": name}}, allowed
    raise ValidationError(
        "tool_choice.type must be one of auto, any, tool, none", param="tool_choice"
    )


def _thinking(thinking: Any) -> bool | None:
    """``thinking``: whether the template is asked to think (None: the template's default)."""
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        return False
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if not is_int(budget) or budget < 1:
            raise ValidationError(
                "thinking.budget_tokens must be a positive integer", param="thinking"
            )
        return True
    if kind == "adaptive":
        return None
    raise ValidationError(
        "thinking must be {'type': 'enabled', 'budget_tokens': N}, {'type': 'disabled'} or "
        "{'type': 'adaptive'}",
        param="thinking",
    )


def _chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a Messages and a count_tokens request share: the conversation and the tools."""
    chat: dict[str, Any] = {"messages": _messages(body)}
    if body.get("model") is not None:
        chat["model"] = body["model"]
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"], parallel = _tool_choice(body["tool_choice"])
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    thinking = _thinking(body.get("thinking"))
    if thinking is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": thinking}
    return chat


def read_messages(body: Any) -> MessagesRequest:
    """A Messages request checked and translated."""
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", param=None)
    warn_unknown_fields(body, MESSAGES_KEYS)
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise ValidationError("max_tokens is required", param="max_tokens")
    if not is_int(max_tokens) or max_tokens < 1:
        raise ValidationError(
            f"max_tokens must be a positive integer, got {json.dumps(max_tokens)[:40]}",
            param="max_tokens",
        )
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ValidationError(f"stream must be a boolean, got {stream!r}", param="stream")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise ValidationError("metadata must be an object", param="metadata")
    chat = _chat(body)
    for key in _SAME:
        if body.get(key) is not None:
            chat[key] = body[key]
    chat["max_tokens"] = max_tokens
    chat["stream"] = bool(stream)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list):
            raise ValidationError(
                "stop_sequences must be a list of strings", param="stop_sequences"
            )
        chat["stop"] = stops
    return MessagesRequest(
        chat, stream=bool(stream), mcp_servers=_mcp_servers(body.get("mcp_servers"))
    )


def read_count_tokens(body: Any) -> dict[str, Any]:
    """A count_tokens request checked and translated (its chat request)."""
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", param=None)
    warn_unknown_fields(body, COUNT_TOKENS_KEYS)
    return _chat(body)
