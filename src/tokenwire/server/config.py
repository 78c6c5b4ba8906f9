"""``ServerConfig``: a server's settings: the runtime's (``RuntimeConfig``) and the HTTP
server's own (security, request body limits, per-request bounds, the access log, request logs,
request ids and traces)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tokenwire.messages.sampling import DEFAULT_MAX_STOP_STR_LEN
from tokenwire.runtime import RuntimeConfig
from tokenwire.server.limits import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES
from tokenwire.server.observe import ObserveConfig
from tokenwire.server.security import SecurityConfig

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_RESPONSES_STORE_SIZE",
    "RequestLimits",
    "ResponsesConfig",
    "ServerConfig",
]

#: Responses (and conversations) kept for ``previous_response_id``, ``conversation`` and
#: ``GET /v1/responses/{id}`` by default.
DEFAULT_RESPONSES_STORE_SIZE = 1024


@dataclass(frozen=True)
class ResponsesConfig:
    """The Responses API's store, background responses and MCP tools."""

    #: Where responses and conversations are kept (``sqlite:///PATH``, ``postgresql://...``,
    #: ``redis://...``); ``sqlite://``: in memory, this process only (``tokenwire serve``
    #: defaults to a file under the user's data directory).
    store: str = "sqlite://"
    #: Most bytes kept, all keys together (everything kept is counted: the stored JSON).
    max_bytes: int = 256 << 20
    #: Most bytes one API key keeps (past it, its own oldest go first).
    max_key_bytes: int = 256 << 20
    #: Seconds a response or conversation is kept after its last write (None: until evicted).
    ttl: float | None = 30 * 24 * 3600.0
    #: Background responses one API key (all clients, without keys) runs at a time in one
    #: worker; more are refused with 429.
    max_background: int = 32
    #: ``--tool-server``: MCP servers configured at start (``[label=]host:port`` or URL).
    tool_servers: tuple[str, ...] = ()
    #: URL prefixes a request's ``server_url`` may start with (``*``: any); none by default.
    mcp_allowed_urls: tuple[str, ...] = ()
    #: Seconds one MCP operation (a listing, a call) may take.
    mcp_timeout: float = 30.0
    #: Bytes an MCP server's answer to one operation may take.
    mcp_max_output_bytes: int = 1 << 20
    #: Model rounds one response may take (each after tool calls); the last offers no tools.
    mcp_max_rounds: int = 8


@dataclass(frozen=True)
class RequestLimits:
    """Server-wide bounds on what one request may ask (each a 400 naming the field past it)."""

    #: Longest stop string, in UTF-8 bytes.
    max_stop_str_len: int = DEFAULT_MAX_STOP_STR_LEN


DEFAULT_LIMITS = RequestLimits()


@dataclass
class ServerConfig(RuntimeConfig):
    """Server-level settings: the runtime's, and the HTTP server's."""

    #: API key, content types and CORS.
    security: SecurityConfig = dataclasses.field(default_factory=SecurityConfig)
    #: Largest request body (413 past it; None: no limit).
    max_request_bytes: int | None = DEFAULT_MAX_REQUEST_BYTES
    #: Seconds a client has to send its body once its headers are in (408 past it).
    body_timeout: float | None = DEFAULT_BODY_TIMEOUT
    limits: RequestLimits = dataclasses.field(default_factory=RequestLimits)
    #: One log line per HTTP request (logger ``tokenwire.access``, level INFO).
    access_log: bool = True
    #: ``/health`` and ``/metrics`` on a listener of their own, out of the connection cap's
    #: reach (``--health-port``; None: none).
    health_port: int | None = None
    health_host: str = "127.0.0.1"
    #: Request log lines, echoed request ids and trace spans.
    observe: ObserveConfig = dataclasses.field(default_factory=ObserveConfig)
    #: Most responses and conversations the Responses API keeps (past it, the oldest of the key
    #: keeping the most go first; 0: none kept).
    responses_store_size: int = DEFAULT_RESPONSES_STORE_SIZE
    #: The Responses API's store, background responses and MCP tools.
    responses: ResponsesConfig = dataclasses.field(default_factory=ResponsesConfig)
    #: vLLM's ``--enable-tokenizer-info-endpoint``: ``GET /tokenizer_info``.
    tokenizer_info: bool = False
    #: ``--api-keys-file`` (re-read on SIGHUP) and ``--admin-api-key``'s keys (``keys``).
    api_keys_file: str | None = None
    admin_api_keys: tuple[str, ...] = ()
    #: ``--sse-keep-alive-interval``: seconds of silence before a stream's keep-alive (0: off).
    sse_keep_alive_interval: float = 0.0
