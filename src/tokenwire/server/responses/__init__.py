"""OpenAI's Responses API over the chat pipeline: a request translated to the chat request it
amounts to (``request``), the response object, output items and streamed events (``output``),
the kept responses (``store``), and the routes (``routes``). Errors are OpenAI's shape."""

from tokenwire.server.responses.routes import ROUTES, Responses, by_id

__all__ = ["ROUTES", "Responses", "by_id"]
