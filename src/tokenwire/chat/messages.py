"""A chat request's ``messages`` and ``tools`` checked and shaped as Hugging Face chat templates
expect them (content parts joined, tool-call arguments as objects, ``developer`` as ``system`` for
templates without that role). Every problem is a ``ValidationError`` naming the field."""

from __future__ import annotations

import functools
import json
from typing import Any

from tokenwire.messages.errors import ValidationError
from tokenwire.multimodal.parts import MEDIA_PART_TYPES, MediaItem, chat_media_part

__all__ = [
    "MAX_MESSAGES",
    "ROLES",
    "check_count",
    "check_tools",
    "normalize_messages",
    "template_roles",
]

#: OpenAI's roles (and the older ``function``). Any other role a message names (vLLM's custom
#: roles, such as ``my-custom-role``) goes to the chat template as it is, as vLLM passes it.
ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})


#: Content part types that carry plain text (``refusal`` parts carry it in ``refusal``).
#: Most messages (chat), input items (Responses) or messages and system blocks (Messages) one
#: request may carry: checked before anything is rendered. Each renders to at least a few tokens
#: of markup, so more than this cannot fit any context a model of today has.
MAX_MESSAGES = 10_000


def check_count(items: Any, field: str, what: str = "messages") -> None:
    """Refuse a list of more than ``MAX_MESSAGES`` entries (a 400 naming ``field``), before any
    of them is looked at."""
    if isinstance(items, list) and len(items) > MAX_MESSAGES:
        raise ValidationError(
            f"{field} has {len(items)} {what}: at most {MAX_MESSAGES} are accepted", param=field
        )


_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}


def _content_text(
    content: Any, where: str, media: list[MediaItem] | None = None
) -> str | list[dict[str, Any]] | None:
    """A message's ``content`` as one string (text parts joined by newlines, as vLLM does).
    Media parts are read into ``media`` (None: refused, the model is text-only) and the content
    is then a list of parts: ``{"type": "text", "text": ...}`` and ``{"type": <modality>}``, in
    order (``chat.templates.shape_messages`` renders them for the template)."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValidationError(
            f"{where}.content must be a string, a list of parts or null", param="messages"
        )
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    for k, part in enumerate(content):
        if isinstance(part, str):  # a bare string part (accepted by vLLM)
            texts.append(part)
            parts.append({"type": "text", "text": part})
            continue
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if key is None:
            if isinstance(kind, str) and kind in MEDIA_PART_TYPES:
                at = part.get("_field") or f"{where}.content[{k}]"
                if media is None:
                    raise ValidationError(
                        f"{at} of type {kind!r} is not supported: this model is text-only",
                        param="messages",
                    )
                item = chat_media_part(part, at)
                media.append(item)
                parts.append({"type": item.modality})
                continue
            raise ValidationError(
                f"{where}.content[{k}] of type {kind!r} is not supported", param="messages"
            )
        if not isinstance(part.get(key), str):
            raise ValidationError(f"{where}.content[{k}].{key} must be a string", param="messages")
        texts.append(part[key])
        parts.append({"type": "text", "text": part[key]})
    if len(parts) > len(texts):
        return parts
    return "\n".join(texts)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as chat templates expect them: ``arguments`` as an
    object (OpenAI clients send a JSON string), left a string when it is not JSON."""
    _check_tool_calls(calls, f"{where}.tool_calls")
    out = []
    for k, call in enumerate(calls):
        if not isinstance(call, dict):
            raise ValidationError(f"{where}.tool_calls[{k}] must be an object", param="messages")
        call = dict(call)
        fn = call.get("function")
        if isinstance(fn, dict):
            fn = dict(fn)
            args = fn.get("arguments")
            if args is None or args == "":
                fn["arguments"] = {}
            elif isinstance(args, str):
                try:
                    fn["arguments"] = json.loads(args)
                except ValueError:  # not JSON: the string as sent
                    pass
                except RecursionError:
                    raise ValidationError(
                        f"{where}.tool_calls[{k}].function.arguments nests too deeply",
                        param="messages",
                    ) from None
            call["function"] = fn
        out.append(call)
    return out


def normalize_messages(
    messages: Any, *, roles: frozenset[str] | None = None, media: list[MediaItem] | None = None
) -> list[dict]:
    """Check the ``messages`` field and shape every message as Hugging Face chat templates expect
    it: content parts joined into one string, a null ``content`` (an assistant's tool calls or
    refusal) as the refusal or ``""``, tool-call arguments as objects. ``roles``, when given, are
    the roles the template knows: a ``developer`` message becomes ``system`` when the template
    has no ``developer`` role (OpenAI treats them alike). ``media`` collects the media parts
    (``_content_text``); without it they are refused."""
    if not isinstance(messages, list) or not messages:
        raise ValidationError("messages must be a non-empty list", param="messages")
    check_count(messages, "messages")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise ValidationError(f"{where} must be an object", param="messages")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise ValidationError(
                f"{where}.role must be a non-empty string (one of {', '.join(sorted(ROLES))}, "
                f"or a role of the chat template's own), got {role!r:.60}",
                param="messages",
            )
        for key in ("name", "tool_call_id"):
            if msg.get(key) is not None and not isinstance(msg[key], str):
                raise ValidationError(f"{where}.{key} must be a string", param="messages")
        content = _content_text(msg.get("content"), where, media)
        norm = {k: v for k, v in msg.items() if v is not None}
        if role == "assistant":
            if msg.get("tool_calls") is not None:
                norm["tool_calls"] = _tool_calls(msg["tool_calls"], where)
            refusal = msg.get("refusal")
            if content is None and isinstance(refusal, str):
                content = refusal
            if content is None:
                content = ""
        elif content is None:
            raise ValidationError(f"{where}.content is missing", param="messages")
        if role == "developer" and roles is not None and "developer" not in roles:
            role = "system"
        norm["role"] = role
        norm["content"] = content
        out.append(norm)
    return out


@functools.lru_cache(maxsize=16)
def template_roles(template: str | None) -> frozenset[str]:
    """The roles a chat template names (by a plain substring test; asked for every chat request,
    of the same few templates: each is searched once)."""
    return frozenset(r for r in ROLES if template and r in template)


def _check_tool_calls(calls: Any, where: str) -> None:
    """OpenAI's shape: a list of ``{"type": "function", "function": {"name", "arguments"}}``."""
    if not isinstance(calls, list):
        raise ValidationError(f"{where} must be a list", param="messages")
    for k, call in enumerate(calls):
        at = f"{where}[{k}]"
        if not isinstance(call, dict):
            raise ValidationError(f"{at} must be an object", param="messages")
        if call.get("type", "function") != "function":
            raise ValidationError(f"{at}.type must be 'function'", param="messages")
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise ValidationError(f"{at}.id must be a string", param="messages")
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise ValidationError(f"{at}.function must be an object", param="messages")
        if fn.get("name") is not None and not isinstance(fn["name"], str):
            raise ValidationError(f"{at}.function.name must be a string", param="messages")
        if fn.get("arguments") is not None and not isinstance(fn["arguments"], (str, dict)):
            raise ValidationError(
                f"{at}.function.arguments must be a string (or an object)", param="messages"
            )


def check_tools(tools: Any) -> None:
    """The ``tools`` field: a list of ``{"type": "function", "function": {"name", ...}}``."""
    if not isinstance(tools, list):
        raise ValidationError("tools must be a list", param="tools")
    for k, tool in enumerate(tools):
        at = f"tools[{k}]"
        if not isinstance(tool, dict):
            raise ValidationError(f"{at} must be an object", param="tools")
        if tool.get("type", "function") != "function":
            raise ValidationError(f"{at}.type must be 'function'", param="tools")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValidationError(f"{at}.function must be an object with a name", param="tools")
