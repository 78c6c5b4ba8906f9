"""The HTTP shell: OpenAI-compatible and SGLang-native routes over the egress pipeline."""

from tokenwire.server.app import Runtime, ServerConfig, create_app

__all__ = ["Runtime", "ServerConfig", "create_app"]
