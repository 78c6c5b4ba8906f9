"""The HTTP server: a plain ASGI app routing each request to its API's handler (``openai``,
``responses``, ``anthropic``, ``generate``, ``utility``), behind the security checks, body
limits, the access log and the guard that turns an unplanned failure into a clean error. No
framework in the streaming path: each chunk is one ``send`` (or a direct write, over
tokenwire's connection protocol)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from tokenwire.engine import Engine
from tokenwire.messages.errors import ForbiddenError, TokenwireError, UnauthorizedError
from tokenwire.runtime import Runtime
from tokenwire.server import (
    access_log,
    anthropic,
    engine_control,
    generate,
    limits,
    lora,
    openai,
    openapi,
    pooling,
    probes,
    responses,
    utility,
)
from tokenwire.server.admit import GATE_SCOPE, Gate
from tokenwire.server.config import ServerConfig
from tokenwire.server.errors import OPENAI_ERRORS, ErrorDialect, NotFound
from tokenwire.server.guard import guarded, passing
from tokenwire.server.health_listener import HealthListener
from tokenwire.server.http import current_scope, respond, route_of, send_error
from tokenwire.server.keys import KeyRing
from tokenwire.server.observe import RequestRecord, current_record
from tokenwire.server.security import Security, request_key
from tokenwire.tokenizer import Tokenizer

__all__ = ["App", "Handler", "create_app"]

log = logging.getLogger("tokenwire.server")

#: A route's handler: the app, and the request's ASGI ``receive`` and ``send``.
Handler = Callable[["App", Any, Any], Awaitable[None]]


def _adding_headers(send: Any, headers: list[tuple[bytes, bytes]]) -> Any:
    """``send`` that adds ``headers`` to the response's start."""

    async def adding(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *headers]}
        await send(message)

    return passing(adding, send)


def _headers_only(send: Any) -> Any:
    """``send`` for a HEAD request: the response's start as it is, its body left out."""

    async def head(message: dict) -> None:
        if message["type"] == "http.response.body":
            if message.get("more_body", False):
                return
            message = {"type": "http.response.body", "body": b"", "more_body": False}
        await send(message)

    return passing(head, send)


class App:
    """The ASGI application: the routes of every API over one ``Runtime``."""

    def __init__(self, runtime: Runtime, config: ServerConfig) -> None:
        self.runtime = runtime
        #: The server's settings (the runtime's, and the HTTP server's own).
        self.config = config
        self.state = SimpleNamespace(runtime=runtime)
        #: The accepted API keys (``--api-keys-file`` re-read on SIGHUP).
        self.keys = KeyRing(config.security.api_keys, config.admin_api_keys, config.api_keys_file)
        self._security = Security(config.security, self.keys)
        #: Keys' quotas and metrics, and the keep-alive of streams.
        self.gate = Gate(self.keys, runtime.metrics.registry, config.sse_keep_alive_interval)
        self._observe = config.observe
        self._observing = config.observe.active
        self._routes: dict[tuple[str, str], Handler] = {
            **openai.ROUTES,
            **responses.ROUTES,
            **anthropic.ROUTES,
            **generate.ROUTES,
            **pooling.ROUTES,
            **utility.ROUTES,
            **engine_control.ROUTES,
            **probes.ROUTES,
            **openapi.ROUTES,
        }
        #: ``/health`` and ``/metrics`` on their own port (``--health-port``), once started.
        self.health: HealthListener | None = None
        #: The paths whose errors are not in OpenAI's shape, and their API's.
        self._dialects: dict[str, ErrorDialect] = dict(anthropic.DIALECTS)
        self.state.responses = responses.Responses(config.responses_store_size, config.responses)
        if config.dev_mode:
            self._routes |= engine_control.DEV_ROUTES
        if config.runtime_lora_updating:
            self._routes |= lora.ROUTES
        if config.tokenizer_info:
            self._routes |= utility.TOKENIZER_INFO_ROUTES
        #: Routes only admin keys may call, once there are admin keys.
        self.admin_paths = frozenset(
            path
            for table in (engine_control.DEV_ROUTES, engine_control.ROUTES, lora.ROUTES)
            for _, path in table
        ) | {"/abort_request"}
        tok = runtime.tokenizer
        #: What the info routes report.
        self.facts = utility.ServerFacts(
            model=config.model_name,
            tokenizer=tok.name,
            max_model_len=tok.max_model_len,
            max_concurrent_requests=config.max_concurrent_requests,
            engine=type(runtime.engine).__name__,
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            if scope.get("root_path"):
                scope = _below_root(scope)
            if self._observing:
                await self._observed(scope, receive, send)
            elif self.config.access_log and access_log.enabled():
                await access_log.logged(self._guarded, scope, receive, send)
            else:
                await self._guarded(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _observed(self, scope: dict, receive: Any, send: Any) -> None:
        """Serve one request with its ``RequestRecord``: its ``X-Request-Id`` echoed, its trace
        span sent once the response is over."""
        observe = self._observe
        record = RequestRecord(observe, scope, self.runtime.tokenizer)
        token = current_record.set(record)

        async def seen(message: dict) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                if observe.request_id_headers:
                    header = (b"x-request-id", record.response_id().encode("latin-1"))
                    message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        try:
            if self.config.access_log and access_log.enabled():
                await access_log.logged(self._guarded, scope, receive, passing(seen, send))
            else:
                await self._guarded(scope, receive, passing(seen, send))
        finally:
            current_record.reset(token)
            if observe.tracing is not None and record.submitted_plan:
                observe.tracing.emit(record)

    async def _guarded(self, scope: dict, receive: Any, send: Any) -> None:
        dialect = self._dialects.get(scope["path"], OPENAI_ERRORS)
        await guarded(self._dispatch, scope, receive, send, self._on_unhandled(scope), dialect)

    async def _dispatch(self, scope: dict, receive: Any, send: Any) -> None:
        security = self._security
        dialect = self._dialects.get(scope["path"], OPENAI_ERRORS)
        if security.is_preflight(scope):
            status, headers = security.preflight(scope)
            await respond(send, status, b"", headers)
            return
        cors = security.cors_headers(scope)
        if cors:
            send = _adding_headers(send, cors)
        refused = security.check(scope)
        if refused is None and self.keys.has_admin and scope["path"] in self.admin_paths:
            refused = self._admin_refusal(scope)
        key = request_key(scope)
        if key is not None:
            send = self._counted(send, key)
        scope[GATE_SCOPE] = self.gate
        if refused is not None:
            route = route_of(scope["path"])
            await send_error(self.runtime.metrics, send, refused, route, dialect)
            return
        method = scope["method"]
        if method == "HEAD":  # every GET route answers HEAD: its headers, no body
            method = "GET"
            send = _headers_only(send)
        handler = self._routes.get((method, scope["path"]))
        if handler is not None:
            config = self.config
            try:
                limits.check_content_length(scope, config.max_request_bytes)
            except TokenwireError as err:
                route = route_of(scope["path"])
                await send_error(self.runtime.metrics, send, err, route, dialect)
                return
            receive = limits.bounded_receive(receive, config.max_request_bytes, config.body_timeout)
            current_scope.set(scope)
            await handler(self, receive, send)
        elif method == "GET" and scope["path"].startswith("/v1/models/"):
            await utility.model(self, scope["path"][len("/v1/models/") :], send)
        elif scope["path"].startswith("/v1/responses/"):
            await responses.by_id(self, scope, send)
        elif scope["path"] == "/v1/conversations" or scope["path"].startswith("/v1/conversations/"):
            config = self.config
            try:
                limits.check_content_length(scope, config.max_request_bytes)
            except TokenwireError as err:
                await send_error(self.runtime.metrics, send, err, "conversations", dialect)
                return
            receive = limits.bounded_receive(receive, config.max_request_bytes, config.body_timeout)
            current_scope.set(scope)
            await responses.conversations(self, scope, receive, send)
        elif any(path == scope["path"] for _, path in self._routes):
            await send_error(
                self.runtime.metrics, send, NotFound("method not allowed", 405), "other", dialect
            )
        else:
            await send_error(
                self.runtime.metrics, send, NotFound(f"no route {scope['path']}", 404), "other"
            )

    def _admin_refusal(self, scope: dict) -> TokenwireError | None:
        """Why a request may not call an admin route (401 without a key, 403 with another)."""
        key = request_key(scope)
        if key is None:
            return UnauthorizedError(
                f"{scope['path']} needs an admin API key (--admin-api-key): Authorization: "
                "Bearer ..., or x-api-key"
            )
        if not self.keys.limits(key).admin:
            return ForbiddenError(
                f"the API key {key.name!r} may not call {scope['path']}: it needs an admin key "
                "(--admin-api-key)"
            )
        return None

    def _counted(self, send: Any, key: Any) -> Any:
        """``send`` that counts the answer under the key's name."""
        gate = self.gate

        async def counting(message: dict) -> None:
            if message["type"] == "http.response.start":
                gate.answered(key, message["status"])
            await send(message)

        return passing(counting, send)

    def _on_unhandled(self, scope: dict) -> Any:
        def count(err: TokenwireError) -> None:
            self.runtime.metrics.requests.labels(route_of(scope["path"]), str(err.status)).inc()
            self.runtime.metrics.request_errors.labels(err.error_type).inc()

        return count

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.runtime.start()
                    await self.state.responses.start()
                    if self.keys.path is not None:
                        # (the main thread only: a server run from a thread reloads on call)
                        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                            asyncio.get_running_loop().add_signal_handler(
                                signal.SIGHUP, self.keys.reload
                            )
                    if self.config.health_port is not None:
                        self.health = HealthListener(
                            self, self.config.health_host, self.config.health_port
                        )
                        await self.health.start()
                except Exception as exc:
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.keys.path is not None:
                    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
                if self.health is not None:
                    await self.health.close()
                await self.state.responses.close()
                await self.runtime.close()
                if self._observe.tracing is not None:
                    self._observe.tracing.shutdown()  # the spans still queued go out
                await send({"type": "lifespan.shutdown.complete"})
                return


def _below_root(scope: dict) -> dict:
    """The request's scope with ``path`` relative to ``root_path`` (the path prefix of a proxy
    in front, ``--root-path``), as routes are matched: ASGI servers put the prefix in ``path``
    (uvicorn adds it), and a path without it stays as it is (Starlette's rule, so vLLM's)."""
    root = scope["root_path"].rstrip("/")
    path = scope.get("path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return {**scope, "path": path[len(root) :] or "/", "root_path": root}
    return scope


def create_app(tokenizer: Tokenizer, engine: Engine, config: ServerConfig | None = None) -> App:
    """The ASGI app; the engine starts and stops with it (ASGI lifespan)."""
    config = config or ServerConfig()
    return App(Runtime(tokenizer, engine, config), config)
