"""The MCP servers a request may use: those configured at start (``--tool-server``, as vLLM names
it: ``host:port`` reached at ``http://host:port/sse`` as vLLM does, or a full URL, each with an
optional ``label=`` in front; without one, a server's label is the name it gives in its
handshake), and the URLs a request may name itself (``--mcp-allowed-urls``: prefixes, or ``*``;
none by default, so no client can make the server reach an address of its choosing)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from tokenwire.messages.errors import ValidationError
from tokenwire.server.mcp.client import McpBounds, McpEndpoint, McpFailure, session

__all__ = ["ToolServers", "parse_tool_server"]

log = logging.getLogger("tokenwire.server")


def parse_tool_server(spec: str) -> tuple[str | None, str]:
    """One ``--tool-server`` entry: its label (None: ask the server) and its URL."""
    spec = spec.strip()
    label = None
    head, eq, rest = spec.partition("=")
    if eq and "://" not in head and "/" not in head:
        label, spec = head.strip() or None, rest.strip()
    if "://" not in spec:
        spec = f"http://{spec}/sse"
    return label, spec


class ToolServers:
    """The configured MCP servers, by label, and the URLs a request may name."""

    def __init__(
        self,
        servers: dict[str, McpEndpoint] | None = None,
        allowed_urls: Iterable[str] = (),
    ) -> None:
        self.servers = dict(servers or {})
        self.allowed_urls = tuple(allowed_urls)

    @classmethod
    async def configured(
        cls, specs: Iterable[str], allowed_urls: Iterable[str], bounds: McpBounds
    ) -> ToolServers:
        """``--tool-server`` entries resolved: one without a label is asked for its name (its
        handshake's), which fails the start when it cannot be reached."""
        servers: dict[str, McpEndpoint] = {}
        for spec in specs:
            for one in spec.split(","):
                if not one.strip():
                    continue
                label, url = parse_tool_server(one)
                if label is None:
                    label = await _server_name(url, bounds)
                if label in servers:
                    log.warning("--tool-server %s: label %r is taken; ignored", url, label)
                    continue
                servers[label] = McpEndpoint(label, url)
        if servers:
            log.info(
                "MCP tool servers: %s", ", ".join(f"{k} ({v.url})" for k, v in servers.items())
            )
        return cls(servers, allowed_urls)

    def endpoint(
        self, label: str, url: str | None, headers: dict[str, str], where: str
    ) -> McpEndpoint:
        """The server a request's MCP tool means: its ``server_url`` when allowed, else the
        configured server of its label (a 400 naming ``where`` otherwise)."""
        if url is None:
            known = self.servers.get(label)
            if known is None:
                names = ", ".join(sorted(self.servers)) or "none"
                raise ValidationError(
                    f"{where}: no MCP server labelled {label[:60]!r} is configured on this "
                    f"server (--tool-server: {names}); give server_url",
                    param="tools",
                )
            return McpEndpoint(label, known.url, {**known.headers, **headers})
        if not url.startswith(("http://", "https://")):
            raise ValidationError(f"{where}.server_url must be an http(s) URL", param="tools")
        if not any(a == "*" or url.startswith(a) for a in self.allowed_urls):
            raise ValidationError(
                f"{where}.server_url {url[:100]!r} is not allowed on this server: name a "
                "configured --tool-server by its label, or start the server with "
                "--mcp-allowed-urls",
                param="tools",
            )
        return McpEndpoint(label, url, headers)


async def _server_name(url: str, bounds: McpBounds) -> str:
    """The name an MCP server gives in its handshake."""

    async def op(c: Any) -> str:
        info = c.server_info
        return info.name if info is not None and info.name else ""

    try:
        name = await session(McpEndpoint(url, url), bounds, op)
    except McpFailure as exc:
        raise SystemExit(f"tokenwire: --tool-server {url}: {exc.message}") from None
    if not name:
        raise SystemExit(
            f"tokenwire: --tool-server {url} gives no name in its handshake: give it a label "
            "(--tool-server LABEL=URL)"
        )
    return name
