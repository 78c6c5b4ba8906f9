"""Chat prompts rendered with the tokenizer's own template, as Hugging Face renders them: a
sandboxed jinja2 environment (``trim_blocks``, ``lstrip_blocks``, loop controls) with the globals
templates use (``raise_exception``, ``strftime_now``) and the variables (``messages``,
``bos_token``, ``eos_token``, ``add_generation_prompt``, ``tools``, ``chat_template_kwargs``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tokenwire.messages.errors import ValidationError

__all__ = ["render_chat", "normalize_messages"]

_ROLES = {"system", "user", "assistant", "tool", "developer", "function"}


class _TemplateError(Exception):
    pass


def _raise_exception(message: str) -> None:
    raise _TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Check the ``messages`` field; text content parts are joined into one string."""
    if not isinstance(messages, list) or not messages:
        raise ValidationError("messages must be a non-empty list", param="messages")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise ValidationError(f"{where} must be an object", param="messages")
        role = msg.get("role")
        if role not in _ROLES:
            raise ValidationError(
                f"{where}.role must be one of {', '.join(sorted(_ROLES))}, got {role!r}",
                param="messages",
            )
        content = msg.get("content")
        if isinstance(content, list):
            texts = []
            for k, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise ValidationError(
                        f"{where}.content[{k}] of type {kind!r} is not supported (text only)",
                        param="messages",
                    )
                if not isinstance(part.get("text"), str):
                    raise ValidationError(
                        f"{where}.content[{k}].text must be a string", param="messages"
                    )
                texts.append(part["text"])
            content = "\n".join(texts)
        elif content is not None and not isinstance(content, str):
            raise ValidationError(
                f"{where}.content must be a string or a list of parts", param="messages"
            )
        if content is None and not msg.get("tool_calls"):
            raise ValidationError(f"{where}.content is missing", param="messages")
        norm = dict(msg)
        norm["content"] = content
        out.append(norm)
    return out


def render_chat(
    template: str | None,
    messages: list[dict[str, Any]],
    *,
    bos_token: str | None,
    eos_token: str | None,
    add_generation_prompt: bool = True,
    tools: list[Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text for ``messages``; ``ValidationError`` when there is no template or the
    template rejects the conversation (its ``raise_exception`` message is passed on)."""
    if not template:
        raise ValidationError(
            "this model's tokenizer has no chat template: use /v1/completions", param="messages"
        )
    reserved = {"messages", "add_generation_prompt", "tools", "bos_token", "eos_token"}
    kwargs = dict(extra or {})
    clash = reserved & kwargs.keys()
    if clash:
        raise ValidationError(
            f"chat_template_kwargs may not set {sorted(clash)[0]!r}", param="chat_template_kwargs"
        )
    try:
        return _compile(template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            **kwargs,
        )
    except _TemplateError as exc:
        raise ValidationError(f"chat template: {exc}", param="messages") from None
    except jinja2.TemplateError as exc:
        raise ValidationError(f"chat template failed: {exc}", param="messages") from None
