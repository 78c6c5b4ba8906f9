"""OpenAI's completions and chat completions API (with vLLM's extra fields): request parsing
(``parse``, ``tools``) beside response formatting (``chunks``, ``stream``, ``chat_output``), and
the routes (``routes``)."""

from tokenwire.server.openai.routes import ROUTES

__all__ = ["ROUTES"]
