"""Real MCP servers for the tests, on loopback: the ``mcp`` SDK's ``MCPServer`` (FastMCP, as mcp 2
names it) over streamable HTTP and over SSE, with tools that answer, fail, hang, answer too much
or count their calls; and a server that answers no MCP at all (HTML)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Literal

import pytest
import uvicorn

from served import running

#: Calls each tool got, by name (what the server really ran).
CALLS: dict[str, int] = {}


def _count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


def make_server():
    """An ``MCPServer`` with the tools the tests call."""
    mcp = pytest.importorskip("mcp.server.mcpserver", reason="needs pip install 'tokenwire[mcp]'")
    server = mcp.MCPServer("weather")

    @server.tool()
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        _count("get_weather")
        return f"Sunny in {city}"

    @server.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        _count("add")
        return str(a + b)

    @server.tool()
    def forecast(city: Literal["Paris", "Oslo"]) -> str:
        """The forecast for a city (a schema a grammar closes fast: random weights call it)."""
        _count("forecast")
        return f"Sunny in {city}"

    @server.tool()
    async def stall(city: Literal["Paris", "Oslo"]) -> str:
        """Never answers, with the schema of ``forecast``."""
        _count("stall")
        await asyncio.sleep(120)
        return "late"

    @server.tool()
    async def hang(city: str) -> str:
        """Never answers (within any test's patience)."""
        _count("hang")
        await asyncio.sleep(120)
        return "late"

    @server.tool()
    def flood(city: str) -> str:
        """Answers two million characters."""
        _count("flood")
        return "x" * 2_000_000

    @server.tool()
    def broken(city: str) -> str:
        """Fails."""
        from mcp.server.mcpserver.exceptions import ToolError

        _count("broken")
        raise ToolError(f"no weather station in {city}")

    return server


@contextlib.contextmanager
def mcp_server(transport: str = "streamable") -> Iterator[str]:
    """A real MCP server on a loopback port until the block ends; yields its URL (``.../mcp``
    for streamable HTTP, ``.../sse`` for SSE)."""
    server = make_server()
    if transport == "sse":
        app, path = server.sse_app(), "/sse"
    else:
        app, path = server.streamable_http_app(), "/mcp"
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    with running(uvicorn.Server(config)) as (port, _):
        yield f"http://127.0.0.1:{port}{path}"


@contextlib.contextmanager
def garbage_server() -> Iterator[str]:
    """An HTTP server that answers every request with HTML (no MCP); yields its URL."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        body = b"<html><body>not an MCP server</body></html>"
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    conn.recv(65536)
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: "
                        + str(len(body)).encode()
                        + b"\r\nConnection: close\r\n\r\n"
                        + body
                    )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        stop.set()
        thread.join(2)
        sock.close()


def wait_for(done, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
