"""Listing an MCP server's tools and calling one, each in a session of its own (connect, the
protocol's handshake, the one operation, close), bounded:

- in time: the whole operation within ``McpBounds.timeout`` seconds, else an error at that
  moment (a session still closing goes on in the background, bounded by the same timeout);
- in size: the bytes read from the server in that session past ``max_output_bytes`` end it with
  an error (read through a counting transport: a server streaming gigabytes costs that cap);
- in kind: whatever the server answers that is no MCP result (HTML, bad JSON-RPC, a crash) is an
  error too. Errors are ``McpFailure`` values carrying the ``mcp_call`` error object OpenAI's
  API gives (``http_error``, ``mcp_protocol_error``, ``mcp_tool_execution_error``), never an
  exception that reaches the request."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "McpBounds",
    "McpEndpoint",
    "McpFailure",
    "call_tool",
    "list_tools",
    "missing_sdk",
    "session",
]

log = logging.getLogger("tokenwire.server")

#: Sessions given up at their timeout, still closing (kept so they are not collected).
_closing: set[asyncio.Task[Any]] = set()


def missing_sdk() -> str | None:
    """Why MCP servers cannot be called here (the SDK is not installed), or None."""
    try:
        import httpx2  # noqa: F401
        import mcp  # noqa: F401
    except ImportError:
        return "MCP tools need the mcp package: pip install 'tokenwire[mcp]'"
    return None


@dataclass(frozen=True)
class McpBounds:
    """What one MCP operation may take."""

    #: Seconds for a whole operation (connecting, the handshake, the list or the call).
    timeout: float = 30.0
    #: Bytes read from the server in one operation (its answer); past it, an error.
    max_output_bytes: int = 1 << 20


@dataclass(frozen=True)
class McpEndpoint:
    """An MCP server: where it is and what to send it."""

    label: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def sse(self) -> bool:
        """Whether it speaks the SSE transport (a URL ending in ``/sse``, as vLLM's tool
        servers and the SDK's SSE apps serve it), else streamable HTTP."""
        return self.url.split("?", 1)[0].rstrip("/").endswith("/sse")


class McpFailure(Exception):
    """An MCP operation that failed: ``error`` is the ``mcp_call`` error object."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message") or error.get("type"))
        self.error = error

    @property
    def message(self) -> str:
        if "message" in self.error:
            return str(self.error["message"])
        return json.dumps(self.error.get("content"), ensure_ascii=False)[:2000]


def _http_error(code: int, message: str) -> McpFailure:
    return McpFailure({"type": "http_error", "code": code, "message": message})


def _protocol_error(code: int, message: str) -> McpFailure:
    return McpFailure({"type": "mcp_protocol_error", "code": code, "message": message})


class _TooLarge(Exception):
    pass


def _capped_transport(budget: list[int]) -> Any:
    """An httpx2 transport whose responses' bytes, all together, may not pass ``budget[0]``."""
    import httpx2

    class Counted(httpx2.AsyncByteStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __aiter__(self) -> Any:
            async for chunk in self.inner:
                budget[0] -= len(chunk)
                if budget[0] < 0:
                    raise _TooLarge
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    class Capped(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request: Any) -> Any:
            response = await self.inner.handle_async_request(request)
            response.stream = Counted(response.stream)
            return response

        async def aclose(self) -> None:
            await self.inner.aclose()

    return Capped()


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups."""
    while getattr(exc, "exceptions", None):  # (BaseExceptionGroup, or its backport on 3.10)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return exc


def _failure(exc: BaseException, ep: McpEndpoint, bounds: McpBounds) -> McpFailure:
    """``exc``, raised talking to ``ep``, as the error an ``mcp_call`` carries."""
    import httpx2
    from mcp.shared.exceptions import MCPError

    exc = _leaf(exc)
    if isinstance(exc, McpFailure):
        return exc
    if isinstance(exc, _TooLarge):
        return _http_error(
            502,
            f"the MCP server {ep.label!r} sent more than {bounds.max_output_bytes} bytes "
            "(--mcp-max-output-bytes)",
        )
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, httpx2.TimeoutException)):
        return _http_error(
            504, f"the MCP server {ep.label!r} did not answer within {bounds.timeout:g} s"
        )
    if isinstance(exc, httpx2.HTTPStatusError):
        status = exc.response.status_code
        return _http_error(status, f"the MCP server {ep.label!r} answered HTTP {status}")
    if isinstance(exc, httpx2.HTTPError):
        return _http_error(502, f"cannot reach the MCP server {ep.label!r}: {type(exc).__name__}")
    if isinstance(exc, MCPError):
        code = getattr(getattr(exc, "error", None), "code", -32603)
        return _protocol_error(code, str(exc)[:2000] or "MCP error")
    return _protocol_error(
        -32603,
        f"the MCP server {ep.label!r} gave no MCP answer ({type(exc).__name__}: {str(exc)[:300]})",
    )


def _quiet() -> None:
    """The HTTP client's line per request (INFO) kept out of the server's log, unless its
    level is set."""
    for name in ("httpx2", "httpcore2"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


async def session(ep: McpEndpoint, bounds: McpBounds, op: Callable[[Any], Awaitable[Any]]) -> Any:
    """``op(client)`` in a session of its own with ``ep``, bounded (``McpFailure`` on any
    failure)."""
    import httpx2
    from mcp import Client

    _quiet()
    budget = [bounds.max_output_bytes]
    timeout = httpx2.Timeout(bounds.timeout)

    async def run() -> Any:
        if ep.sse:
            from mcp.client.sse import sse_client

            def factory(headers: Any = None, auth: Any = None, timeout: Any = None) -> Any:
                return httpx2.AsyncClient(
                    headers=headers, auth=auth, timeout=timeout, transport=_capped_transport(budget)
                )

            transport = sse_client(
                ep.url,
                headers=ep.headers,
                timeout=bounds.timeout,
                sse_read_timeout=bounds.timeout,
                httpx_client_factory=factory,
            )
            async with Client(transport, cache=None, read_timeout_seconds=bounds.timeout) as c:
                return await op(c)
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(
            headers=ep.headers, timeout=timeout, transport=_capped_transport(budget)
        )
        async with http:
            transport = streamable_http_client(ep.url, http_client=http)
            async with Client(transport, cache=None, read_timeout_seconds=bounds.timeout) as c:
                return await op(c)

    task = asyncio.ensure_future(run())
    try:
        done, _ = await asyncio.wait({task}, timeout=bounds.timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        _closing.add(task)
        task.add_done_callback(_closed)
        raise _failure(TimeoutError(), ep, bounds)
    try:
        return task.result()
    except asyncio.CancelledError:
        raise _failure(TimeoutError(), ep, bounds) from None
    except BaseException as exc:
        failure = _failure(exc, ep, bounds)
        log.info("MCP server %r: %s", ep.label, failure.message)
        raise failure from None


def _closed(task: asyncio.Task[Any]) -> None:
    _closing.discard(task)
    if not task.cancelled():
        task.exception()  # (retrieved: a session given up ends however it ends)


async def list_tools(ep: McpEndpoint, bounds: McpBounds) -> list[dict[str, Any]]:
    """The server's tools, as an ``mcp_list_tools`` item lists them (``name``,
    ``description``, ``input_schema``, ``annotations``)."""

    async def op(client: Any) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor = None
        for _ in range(100):  # (pages: a server that pages forever is cut short)
            page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
            for tool in page.tools:
                schema = tool.input_schema if hasattr(tool, "input_schema") else tool.inputSchema
                annotations = tool.annotations.model_dump() if tool.annotations else None
                tools.append(
                    {
                        "name": tool.name,
                        "description": tool.description,
                        "input_schema": schema or {"type": "object", "properties": {}},
                        "annotations": annotations,
                    }
                )
            cursor = getattr(page, "next_cursor", None) or getattr(page, "nextCursor", None)
            if not cursor:
                break
        return tools

    return await session(ep, bounds, op)


def _content_text(content: list[Any]) -> str:
    """A result's content as one text (text parts as they are, the others as JSON)."""
    out = []
    for part in content:
        if getattr(part, "type", None) == "text":
            out.append(part.text)
        else:
            out.append(json.dumps(part.model_dump(mode="json", exclude_none=True)))
    return "\n".join(out)


async def call_tool(
    ep: McpEndpoint, name: str, arguments: dict[str, Any], bounds: McpBounds
) -> str:
    """Call tool ``name``: its output text (``McpFailure`` when the call fails, the tool
    reports an error, or the server misbehaves)."""

    async def op(client: Any) -> str:
        result = await client.call_tool(name, arguments)
        content = list(getattr(result, "content", None) or [])
        if getattr(result, "is_error", False) or getattr(result, "isError", False):
            raise McpFailure(
                {
                    "type": "mcp_tool_execution_error",
                    "content": [p.model_dump(mode="json", exclude_none=True) for p in content],
                }
            )
        if not content:
            structured = getattr(result, "structured_content", None)
            return json.dumps(structured, ensure_ascii=False) if structured is not None else ""
        return _content_text(content)

    return await session(ep, bounds, op)
