"""MCP servers the server itself calls for a request (OpenAI's Responses ``mcp`` tools, Anthropic's
``mcp_servers``): listing their tools and calling them over streamable HTTP or SSE with the
official ``mcp`` SDK (the ``tokenwire[mcp]`` extra, imported only when a request names an MCP
server), each call bounded in time and in the bytes it reads (``client``); the servers configured
at start (``--tool-server``) and which URLs a request may name (``servers``)."""

from tokenwire.server.mcp.client import (
    McpBounds,
    McpEndpoint,
    McpFailure,
    call_tool,
    list_tools,
    missing_sdk,
)
from tokenwire.server.mcp.servers import ToolServers

__all__ = [
    "McpBounds",
    "McpEndpoint",
    "McpFailure",
    "ToolServers",
    "call_tool",
    "list_tools",
    "missing_sdk",
]
