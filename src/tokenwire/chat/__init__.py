"""Chat conversations as prompt text: messages checked and shaped for templates (``messages``),
which template renders a request (``templates``), and rendering in the jinja2 sandbox
(``render``). Plain functions, no I/O."""

from __future__ import annotations

from tokenwire.chat.messages import ROLES, check_tools, normalize_messages, template_roles
from tokenwire.chat.render import render_chat
from tokenwire.chat.templates import (
    CONTENT_FORMATS,
    chat_template_for,
    detect_content_format,
    load_chat_template,
    shape_messages,
)

__all__ = [
    "CONTENT_FORMATS",
    "ROLES",
    "chat_template_for",
    "check_tools",
    "detect_content_format",
    "load_chat_template",
    "normalize_messages",
    "render_chat",
    "shape_messages",
    "template_roles",
]
