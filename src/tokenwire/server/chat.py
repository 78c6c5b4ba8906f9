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

__all__ = ["render_chat", "normalize_messages", "template_roles", "check_tools"]

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


#: Content part types that carry plain text (``refusal`` parts carry it in ``refusal``).
_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}


def _content_text(content: Any, where: str) -> str | None:
    """A message's ``content`` as one string (text parts joined by newlines, as vLLM does)."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValidationError(
            f"{where}.content must be a string, a list of parts or null", param="messages"
        )
    texts = []
    for k, part in enumerate(content):
        if isinstance(part, str):  # a bare string part (accepted by vLLM)
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if key is None:
            raise ValidationError(
                f"{where}.content[{k}] of type {kind!r} is not supported (text only)",
                param="messages",
            )
        if not isinstance(part.get(key), str):
            raise ValidationError(f"{where}.content[{k}].{key} must be a string", param="messages")
        texts.append(part[key])
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


def normalize_messages(messages: Any, *, roles: frozenset[str] | None = None) -> list[dict]:
    """Check the ``messages`` field and shape every message as Hugging Face chat templates expect
    it: content parts joined into one string, a null ``content`` (an assistant's tool calls or
    refusal) as the refusal or ``""``, tool-call arguments as objects. ``roles``, when given, are
    the roles the template knows: a ``developer`` message becomes ``system`` when the template
    has no ``developer`` role (OpenAI treats them alike)."""
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
        for key in ("name", "tool_call_id"):
            if msg.get(key) is not None and not isinstance(msg[key], str):
                raise ValidationError(f"{where}.{key} must be a string", param="messages")
        content = _content_text(msg.get("content"), where)
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


def template_roles(template: str | None) -> frozenset[str]:
    """The roles a chat template names (by a plain substring test)."""
    return frozenset(r for r in _ROLES if template and r in template)


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


def render_chat(
    template: str | None,
    messages: list[dict[str, Any]],
    *,
    bos_token: str | None,
    eos_token: str | None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: list[Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text for ``messages``; ``ValidationError`` when there is no template or the
    template rejects the conversation (its ``raise_exception`` message is passed on).

    ``continue_final_message`` leaves the last message open, as Hugging Face does: the text ends
    where that message's content ends (no end-of-turn), so the model continues it."""
    if not template:
        raise ValidationError(
            "this model's tokenizer has no chat template: use /v1/completions", param="messages"
        )
    compiled = _compile(template)
    # The variables set here, the template's globals (``namespace``, ``strftime_now``...) and
    # ``render``'s own parameter.
    reserved = {"messages", "add_generation_prompt", "tools", "bos_token", "eos_token", "self"}
    reserved |= compiled.environment.globals.keys()
    kwargs = dict(extra or {})
    clash = reserved & kwargs.keys()
    if clash:
        raise ValidationError(
            f"chat_template_kwargs may not set {sorted(clash)[0]!r}", param="chat_template_kwargs"
        )
    try:
        text = compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            **kwargs,
        )
    except _TemplateError as exc:
        raise ValidationError(f"chat template: {exc}", param="messages") from None
    except Exception as exc:  # a template bug or a shape it cannot take is the request's 400
        raise ValidationError(
            f"the chat template cannot render these messages ({type(exc).__name__}: {exc})",
            param="messages",
        ) from None
    if continue_final_message:
        text = _open_final_message(text, messages[-1]["content"])
    return text


def _open_final_message(text: str, final: str | list[Any]) -> str:
    """``text`` cut right after the last occurrence of the final message's content (a string,
    or, for a template that loops over content parts, its last text part, as transformers
    does)."""
    if isinstance(final, list):
        texts = [p["text"] for p in final if isinstance(p, dict) and isinstance(p.get("text"), str)]
        final = texts[-1] if texts else ""
    for content in (final, final.strip()):
        if content and content in text:
            return text[: text.rindex(content) + len(content)]
    raise ValidationError(
        "continue_final_message: the final message is empty or its content does not appear in "
        "the rendered conversation",
        param="continue_final_message",
    )
