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

__all__ = ["DEFAULT_LIMITS", "DEFAULT_RESPONSES_STORE_SIZE", "RequestLimits", "ServerConfig"]

#: Responses kept for ``previous_response_id`` and ``GET /v1/responses/{id}`` by default.
DEFAULT_RESPONSES_STORE_SIZE = 1024


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
    #: Most responses the Responses API keeps (oldest evicted first; 0: none kept).
    responses_store_size: int = DEFAULT_RESPONSES_STORE_SIZE
    #: vLLM's ``--enable-tokenizer-info-endpoint``: ``GET /tokenizer_info``.
    tokenizer_info: bool = False
    #: ``--api-keys-file`` (re-read on SIGHUP) and ``--admin-api-key``'s keys (``keys``).
    api_keys_file: str | None = None
    admin_api_keys: tuple[str, ...] = ()
    #: ``--sse-keep-alive-interval``: seconds of silence before a stream's keep-alive (0: off).
    sse_keep_alive_interval: float = 0.0
