"""Which chat template renders a request, and the message shape it gets (vLLM's options):
``--chat-template`` (a file or the template itself) replaces the tokenizer's;
``--chat-template-content-format`` passes message content as a string or as OpenAI's list of
parts; a request's own ``chat_template`` is honoured only with ``--trust-request-chat-template``.
Every template renders in the jinja2 sandbox (``chat.render``)."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import Any

from tokenwire.messages.errors import ValidationError

__all__ = [
    "CONTENT_FORMATS",
    "chat_template_for",
    "detect_content_format",
    "load_chat_template",
    "shape_messages",
]

#: ``--chat-template-content-format`` choices.
CONTENT_FORMATS = ("auto", "string", "openai")

# A template that loops over a message's content (``for part in message['content']``) wants
# OpenAI's list of parts.
_LOOPS_OVER_CONTENT = re.compile(
    r"\{%-?\s*for\s+\w+\s+in\s+\w+(?:\.content|\[\s*['\"]content['\"]\s*\])\s*-?%\}"
)


def load_chat_template(value: str) -> str:
    """``--chat-template``: a file's text, or the value itself when it is a template
    (``ValueError`` for a path that does not exist)."""
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template: no such file, and not a template: {value!r}")


@functools.lru_cache(maxsize=16)
def detect_content_format(template: str | None) -> str:
    """``openai`` when the template iterates over message content, else ``string``. (Asked for
    every chat request, of the same few templates: each is searched once.)"""
    if template and _LOOPS_OVER_CONTENT.search(template):
        return "openai"
    return "string"


def chat_template_for(
    body: Mapping[str, Any],
    tokenizer_template: str | None,
    server_template: str | None,
    *,
    trust_request: bool,
) -> str | None:
    """The template for this request: its own ``chat_template`` (only when trusted), the
    server's ``--chat-template``, or the tokenizer's."""
    own = body.get("chat_template")
    if own is not None:
        if not trust_request:
            raise ValidationError(
                "chat_template in a request is honoured only when the server runs with "
                "--trust-request-chat-template",
                param="chat_template",
            )
        if not isinstance(own, str) or not own:
            raise ValidationError("chat_template must be a non-empty string", param="chat_template")
        return own
    return server_template or tokenizer_template


def _with_placeholders(parts: list[dict[str, Any]], placeholders: Mapping[str, str]) -> str:
    """A message's parts (text and media) as one string for a string-format template, as vLLM
    builds it: each media item's placeholder, then the text parts, joined by newlines."""
    texts = [p["text"] for p in parts if p["type"] == "text"]
    text = "\n".join(texts)
    counts: dict[str, int] = {}
    for p in parts:
        if p["type"] != "text":
            mark = placeholders[p["type"]]
            counts[mark] = counts.get(mark, 0) + 1
    marks: list[str] = []
    for mark, n in counts.items():  # (placeholders the text already has stay where they are)
        missing = n - text.count(mark)
        if missing < 0:
            raise ValidationError(
                f"the message's text has more {mark!r} placeholders than media items",
                param="messages",
            )
        marks += [mark] * missing
    return "\n".join([*marks, text] if text else marks)


def shape_messages(
    messages: list[dict[str, Any]],
    content_format: str,
    template: str | None,
    placeholders: Mapping[str, str] | None = None,
) -> None:
    """In place: content as the template takes it (``openai``: a list of text parts), and an
    assistant's ``reasoning`` also as ``reasoning_content`` (the field templates read) and the
    other way round."""
    fmt = detect_content_format(template) if content_format == "auto" else content_format
    for msg in messages:
        if fmt == "openai" and isinstance(msg.get("content"), str):
            msg["content"] = [{"type": "text", "text": msg["content"]}]
        elif fmt == "string" and isinstance(msg.get("content"), list):
            msg["content"] = _with_placeholders(msg["content"], placeholders or {})
        if msg.get("role") == "assistant":
            if "reasoning" in msg and "reasoning_content" not in msg:
                msg["reasoning_content"] = msg["reasoning"]
            elif "reasoning_content" in msg and "reasoning" not in msg:
                msg["reasoning"] = msg["reasoning_content"]
