"""OpenAI's Responses API over the chat pipeline: a request translated to the chat request it
amounts to (``request``), the response object, output items and streamed events (``output``),
responses with MCP tools the server runs (``agent``), the store of responses, conversations and
their items (``store``, ``state``), and the routes (``routes``, ``conversations``). Errors are
OpenAI's shape."""

from tokenwire.server.responses.conversations import conversations
from tokenwire.server.responses.routes import ROUTES, by_id
from tokenwire.server.responses.state import Responses

__all__ = ["ROUTES", "Responses", "by_id", "conversations"]
