"""The HTTP server: one module or package per API (``openai``, ``generate``, ``utility``) over
shared streaming (``streaming``, ``direct_stream``), errors and HTTP plumbing (``errors``,
``http``, ``guard``), request limits and security, and tokenwire's own connection protocol
(``serving``)."""

from tokenwire.runtime import Runtime
from tokenwire.server.app import App, create_app
from tokenwire.server.config import ServerConfig

__all__ = ["App", "Runtime", "ServerConfig", "create_app"]
