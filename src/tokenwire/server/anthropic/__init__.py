"""Anthropic's Messages API over the chat pipeline: a request translated to the chat request it
amounts to (``request``), the message object and streamed events (``output``), Anthropic's error
shape (``errors``), and the routes (``routes``)."""

from tokenwire.server.anthropic.routes import DIALECTS, ROUTES

__all__ = ["DIALECTS", "ROUTES"]
