"""Chat prompts rendered with the tokenizer's own template, as Hugging Face renders them: a
sandboxed jinja2 environment (``trim_blocks``, ``lstrip_blocks``, loop controls) with the globals
templates use (``raise_exception``, ``strftime_now``) and the variables (``messages``,
``bos_token``, ``eos_token``, ``add_generation_prompt``, ``tools``, ``chat_template_kwargs``)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import msgspec
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tokenwire.messages.errors import ValidationError

__all__ = ["render_chat"]


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


#: Rendered prompts kept for conversations seen again (the same template, messages, tools and
#: options: a client that resends a request, ``n`` prompts of one conversation, a benchmark), at
#: most this many, least recently used out first ...
RENDER_CACHE_SIZE = 256
#: ... and only for inputs of at most this many bytes of JSON.
_RENDER_CACHE_MAX_KEY = 16 << 10
_rendered: OrderedDict[tuple[str, bytes], str] = OrderedDict()
_rendered_lock = threading.Lock()  # (large requests are parsed in worker threads)
_key_json = msgspec.json.Encoder()


def _render_key(template: str, inputs: list[Any]) -> tuple[str, bytes] | None:
    """The render cache's key for ``inputs`` under ``template`` (None: not cached, as for a
    template that reads the clock, or inputs too large)."""
    if "strftime_now" in template:
        return None
    try:
        data = _key_json.encode(inputs)
    except (TypeError, ValueError, OverflowError):
        return None
    if len(data) > _RENDER_CACHE_MAX_KEY:
        return None
    return template, data


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
    inputs = [messages, tools, kwargs, add_generation_prompt, bos_token, eos_token]
    key = _render_key(template, inputs)
    text = None
    if key is not None:
        with _rendered_lock:
            text = _rendered.get(key)
            if text is not None:
                _rendered.move_to_end(key)
    if text is None:
        text = _render(
            compiled, messages, add_generation_prompt, tools, bos_token, eos_token, kwargs
        )
        if key is not None:
            with _rendered_lock:
                _rendered[key] = text
                if len(_rendered) > RENDER_CACHE_SIZE:
                    _rendered.popitem(last=False)
    if continue_final_message:
        text = _open_final_message(text, messages[-1]["content"])
    return text


def _render(
    compiled: jinja2.Template,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[Any] | None,
    bos_token: str | None,
    eos_token: str | None,
    kwargs: dict[str, Any],
) -> str:
    try:
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            **kwargs,
        )
    except _TemplateError as exc:
        raise ValidationError(f"chat template: {exc}", param="messages") from None
    except MemoryError:
        raise  # the process is out of memory: not this conversation's fault
    except Exception as exc:  # a template bug or a shape it cannot take is the request's 400
        raise ValidationError(
            f"the chat template cannot render these messages ({type(exc).__name__}: {exc})",
            param="messages",
        ) from None


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
