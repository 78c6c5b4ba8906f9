"""The HTTP server: a plain ASGI app over the egress pipeline and an engine.

Requests are parsed into a ``Plan`` (``server.api``), registered with the ``DetokShard`` (one
``EgressSink`` per choice) and submitted to the engine. The engine's frames come back on the event
loop, through the frame codec into the shard, which fills the sinks the handlers drain. A client
that goes away aborts its engine requests at once and leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    generate_latest,
)

from tokenwire.engine import Engine
from tokenwire.messages.egress import Done, EgressSink, Error, Frame
from tokenwire.messages.errors import (
    ClientDisconnected,
    QueueFullError,
    TokenwireError,
)
from tokenwire.runtime import Runtime, ServerConfig
from tokenwire.server import access_log, api, limits, utility
from tokenwire.server.chat_output import ChoiceOutput
from tokenwire.server.direct_stream import DirectStream
from tokenwire.server.guard import direct, guarded, passing
from tokenwire.server.logprobs import ChoiceLogprobs, GenerateLogprobs, TokenStrings
from tokenwire.server.metrics import Metrics
from tokenwire.server.security import Security
from tokenwire.server.serving import BODY_WRITER, BodyWriter
from tokenwire.tokenizer import Tokenizer

__all__ = ["ServerConfig", "Runtime", "App", "create_app"]

log = logging.getLogger("tokenwire.server")


# ---- HTTP handlers -------------------------------------------------------------------------------


async def _merged(subs: list[tuple[str, int, EgressSink]]) -> AsyncIterator[list[tuple[int, Any]]]:
    """Items of several sinks as they come, in batches (everything waiting at each wake-up):
    ``(choice index, item)`` pairs; ends when every choice has had its final item."""
    if len(subs) == 1:
        sink = subs[0][2]
        while True:
            batch = [(0, item) for item in await sink.take()]
            yield batch
            if isinstance(batch[-1][1], (Done, Error)):
                return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue(maxsize=2 * len(subs))

    async def pump(index: int, sink: EgressSink) -> None:
        try:
            while True:
                item = await sink.get()
                await queue.put((index, item))
                if isinstance(item, (Done, Error)):
                    return
        except ClientDisconnected:
            await queue.put((index, None))

    tasks = [asyncio.ensure_future(pump(k, s)) for k, (_, _, s) in enumerate(subs)]
    try:
        remaining = len(subs)
        while remaining:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            for _index, item in batch:
                if item is None:
                    raise ClientDisconnected("the response channel is closed")
                if isinstance(item, (Done, Error)):
                    remaining -= 1
            yield batch
    finally:
        for t in tasks:
            t.cancel()


def _end_when_abandoned(subs: Subs) -> list[bool]:
    """Cancel the current task when the shard abandons one of ``subs``' sinks (the client has
    stopped reading); the returned list is non-empty once that happened."""
    task = asyncio.current_task()
    hit: list[bool] = []

    def end() -> None:
        if not hit and task is not None:
            hit.append(True)
            task.cancel()

    for _, _, sink in subs:
        sink.on_abandon = end
    return hit


class _Tracker:
    """Per-request latency metrics."""

    __slots__ = ("first", "last", "metrics", "start")

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.start = time.perf_counter()
        self.first = True
        self.last = self.start

    def chunk(self) -> None:
        now = time.perf_counter()
        if self.first:
            self.metrics.ttft.observe(now - self.start)
            self.first = False
        else:
            self.metrics.itl.observe(now - self.last)
        self.last = now


# ---- the ASGI application ------------------------------------------------------------------------

Subs = list[tuple[str, int, EgressSink]]
_JSON = [(b"content-type", b"application/json")]
_JSON_CLOSE = [*_JSON, (b"connection", b"close")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def _respond(send: Any, status: int, body: bytes, headers: list = _JSON) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _adding_headers(send: Any, headers: list[tuple[bytes, bytes]]) -> Any:
    """``send`` that adds ``headers`` to the response's start."""

    async def adding(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *headers]}
        await send(message)

    return passing(adding, send)


def _body_writer(send: Any) -> BodyWriter | None:
    """The request's ``BodyWriter``, when its connection gives one that may bypass ``send``."""
    scope = _scope.get()
    body = scope.get("extensions", {}).get(BODY_WRITER) if scope is not None else None
    return body if body is not None and body.serves(send) else None


async def _wait_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


#: The HTTP request being handled (each ASGI request runs in its own task, so its own context).
_scope: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "tokenwire_scope", default=None
)


def _header(scope: dict | None, name: bytes) -> str | None:
    """A request header's value (the first one), or None."""
    for key, value in (scope or {}).get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class App:
    """The ASGI application: a handful of routes over one ``Runtime`` (no framework in the
    streaming path: each chunk is one ``send``)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.state = SimpleNamespace(runtime=runtime)
        self._eos = runtime.tokenizer.eos_token_ids
        self._security = Security(runtime.config.security)
        self._routes = {
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/generate"): self._generate,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
            # vLLM's and SGLang's utility routes
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._detokenize,
            ("GET", "/version"): self._version,
            ("GET", "/ping"): self._health,
            ("POST", "/ping"): self._health,
            ("GET", "/get_model_info"): self._model_info,
            ("GET", "/get_server_info"): self._server_info,
            ("POST", "/abort_request"): self._abort_request,
        }
        tok = runtime.tokenizer
        self._facts = utility.ServerFacts(
            model=runtime.config.model_name,
            tokenizer=tok.name,
            max_model_len=tok.max_model_len,
            max_concurrent_requests=runtime.config.max_concurrent_requests,
            engine=type(runtime.engine).__name__,
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            if self.runtime.config.access_log:
                await access_log.logged(self._guarded, scope, receive, send)
            else:
                await self._guarded(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _guarded(self, scope: dict, receive: Any, send: Any) -> None:
        await guarded(self._dispatch, scope, receive, send, self._on_unhandled(scope))

    async def _dispatch(self, scope: dict, receive: Any, send: Any) -> None:
        security = self._security
        if security.is_preflight(scope):
            status, headers = security.preflight(scope)
            await _respond(send, status, b"", headers)
            return
        cors = security.cors_headers(scope)
        if cors:
            send = _adding_headers(send, cors)
        refused = security.check(scope)
        if refused is not None:
            await self._error(send, refused, _route_of(scope["path"]))
            return
        handler = self._routes.get((scope["method"], scope["path"]))
        if handler is not None:
            config = self.runtime.config
            try:
                limits.check_content_length(scope, config.max_request_bytes)
            except TokenwireError as err:
                await self._error(send, err, _route_of(scope["path"]))
                return
            receive = limits.bounded_receive(receive, config.max_request_bytes, config.body_timeout)
            _scope.set(scope)
            await handler(receive, send)
        elif scope["method"] == "GET" and scope["path"].startswith("/v1/models/"):
            await self._model(scope["path"][len("/v1/models/") :], send)
        elif any(path == scope["path"] for _, path in self._routes):
            await self._error(send, _NotFound("method not allowed", 405), "other")
        else:
            await self._error(send, _NotFound(f"no route {scope['path']}", 404), "other")

    def _on_unhandled(self, scope: dict) -> Any:
        def count(err: TokenwireError) -> None:
            self.runtime.metrics.requests.labels(_route_of(scope["path"]), str(err.status)).inc()
            self.runtime.metrics.request_errors.labels(err.error_type).inc()

        return count

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.runtime.start()
                except Exception as exc:
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.runtime.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _error(self, send: Any, err: TokenwireError, route: str) -> None:
        self.runtime.metrics.requests.labels(route, str(err.status)).inc()
        self.runtime.metrics.request_errors.labels(err.error_type).inc()
        # A body refused part-way is not read to its end: the connection goes with it.
        headers = _JSON_CLOSE if err.status in (408, 413) else _JSON
        await _respond(send, err.status, api.encode(api.error_body(err)), headers)

    # ---- generation routes -----------------------------------------------------------------------

    async def _completions(self, receive: Any, send: Any) -> None:
        await self._openai(receive, send, "completion")

    async def _chat(self, receive: Any, send: Any) -> None:
        await self._openai(receive, send, "chat")

    async def _openai(self, receive: Any, send: Any, route: str) -> None:
        rt = self.runtime
        parse = api.parse_chat if route == "chat" else api.parse_completion
        try:
            plan = await limits.parse_body(
                receive,
                lambda body: parse(
                    body,
                    rt.tokenizer,
                    rt.config.model_name,
                    limits=rt.config.limits,
                    features=rt.features,
                ),
            )
            header_id = _header(_scope.get(), b"x-request-id")
            if header_id is not None:  # vLLM's: the header names the request, over request_id
                plan.id = api.request_id(header_id, "x-request-id")
            await rt.check_grammar(plan)
            subs = rt.submit(plan)
        except ClientDisconnected:
            return
        except TokenwireError as err:
            await self._error(send, err, route)
            return
        if plan.stream:
            await self._stream(receive, send, _OpenAIStreamer(rt, plan, subs, self._eos), route)
        else:
            await self._collect(
                receive, send, subs, _collect_openai(rt, plan, subs, self._eos), route
            )

    async def _generate(self, receive: Any, send: Any) -> None:
        rt = self.runtime
        try:
            plan = await limits.parse_body(
                receive,
                lambda body: api.parse_generate(
                    body,
                    rt.tokenizer,
                    rt.config.model_name,
                    limits=rt.config.limits,
                    features=rt.features,
                ),
            )
            await rt.check_grammar(plan)
            subs = rt.submit(plan)
        except ClientDisconnected:
            return
        except TokenwireError as err:
            await self._error(send, err, "generate")
            return
        if plan.stream:
            await self._stream(receive, send, _GenerateStreamer(rt, plan, subs), "generate")
        else:
            await self._collect(receive, send, subs, _collect_generate(rt, plan, subs), "generate")

    def _watch(self, receive: Any, subs: Subs) -> asyncio.Future[None]:
        """Abort every choice the moment the client disconnects."""
        rt = self.runtime
        gone = asyncio.ensure_future(_wait_disconnect(receive))

        def on_gone(fut: asyncio.Future[None]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                for rid, _, sink in subs:
                    rt.abort(rid, sink)

        gone.add_done_callback(on_gone)
        return gone

    async def _stream(self, receive: Any, send: Any, streamer: _Streamer, route: str) -> None:
        rt = self.runtime
        subs = streamer.subs
        gone = self._watch(receive, subs)
        abandoned = _end_when_abandoned(subs)
        start = time.perf_counter()
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE})
            # Mid-stream chunks skip the wrappers that only look at the start and the end.
            write = direct(send)
            pending = streamer.head()
            body = _body_writer(write)
            if len(subs) == 1 and body is not None:
                # One choice over tokenwire's connection protocol (the common case): written from
                # the sink's wake-up, without a task wake-up and a send per step.
                await DirectStream(subs[0][2], streamer, body, pending).wait()
            elif len(subs) == 1:
                # One choice: wait on its sink directly.
                sink = subs[0][2]
                while streamer.open:
                    data = streamer.feed([(0, item) for item in await sink.take()])
                    if pending:
                        data = pending + data
                        pending = b""
                    if data:
                        await write({"type": "http.response.body", "body": data, "more_body": True})
            else:
                merged = _merged(subs)
                try:
                    async for batch in merged:
                        data = pending + streamer.feed(batch)
                        pending = b""
                        if data:
                            await write(
                                {"type": "http.response.body", "body": data, "more_body": True}
                            )
                        if not streamer.open:
                            break
                finally:
                    await merged.aclose()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            # A stream that ended in an error event counts as that error's status.
            failed = streamer.failed
            rt.metrics.requests.labels(route, str(failed.status if failed else 200)).inc()
            if failed is None:
                rt.metrics.e2e.observe(time.perf_counter() - start)
        except ClientDisconnected:
            rt.metrics.requests.labels(route, "499").inc()
            rt.metrics.request_success.labels("abort").inc()
        except asyncio.CancelledError:
            if not abandoned:
                raise
            # The client stopped reading (its request is already ended): returning with the
            # response incomplete makes the server close the connection.
            log.warning("%s: the client stopped reading its stream; closing it", route)
            rt.metrics.requests.labels(route, "429").inc()
            rt.metrics.request_errors.labels("client_stalled").inc()
        finally:
            gone.cancel()
            streamer.close()

    async def _collect(self, receive: Any, send: Any, subs: Subs, work: Any, route: str) -> None:
        rt = self.runtime
        gone = self._watch(receive, subs)
        start = time.perf_counter()
        try:
            status, body = await work
        except ClientDisconnected:
            rt.metrics.requests.labels(route, "499").inc()
            rt.metrics.request_success.labels("abort").inc()
            return
        except BaseException:
            # Whatever ends the request here ends it everywhere (the guard answers the client).
            for rid, _, sink in subs:
                rt.abort(rid, sink)
            raise
        finally:
            gone.cancel()
            rt.finished()
        rt.metrics.requests.labels(route, str(status)).inc()
        if status == 200:
            rt.metrics.e2e.observe(time.perf_counter() - start)
        await _respond(send, status, api.encode(body))

    # ---- the rest --------------------------------------------------------------------------------

    def _model_card(self) -> dict[str, Any]:
        rt = self.runtime
        return {
            "id": rt.config.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "tokenwire",
            "root": rt.config.model_name,
            "parent": None,
            "max_model_len": rt.tokenizer.max_model_len,
        }

    async def _models(self, receive: Any, send: Any) -> None:
        await _respond(send, 200, api.encode({"object": "list", "data": [self._model_card()]}))

    async def _model(self, model_id: str, send: Any) -> None:
        """``GET /v1/models/{id}``: the model's card, or OpenAI's 404 ``model_not_found``."""
        try:
            api.check_model(model_id, self.runtime.config.model_name)
        except TokenwireError as err:
            await self._error(send, err, "models")
            return
        await _respond(send, 200, api.encode(self._model_card()))

    async def _health(self, receive: Any, send: Any) -> None:
        if self.runtime.engine.alive:
            await _respond(send, 200, b'{"status":"ok"}')
        else:
            await self._error(send, QueueFullError("the engine is not running"), "health")

    async def _json_route(
        self, receive: Any, send: Any, route: str, answer: Any, *, pure: bool = False
    ) -> None:
        """A small JSON route: ``answer(body)`` for the request's JSON body (None for a GET);
        a ``pure`` answer (no server state touched) runs off the event loop for a large body."""
        try:
            if receive is None:
                out = answer(None)
            elif pure:
                out = await limits.parse_body(receive, answer)
            else:
                out = answer(await _read_json(receive))
        except ClientDisconnected:
            return
        except TokenwireError as err:
            await self._error(send, err, route)
            return
        self.runtime.metrics.requests.labels(route, "200").inc()
        await _respond(send, 200, api.encode(out))

    async def _tokenize(self, receive: Any, send: Any) -> None:
        rt = self.runtime
        tok, model = rt.tokenizer, rt.config.model_name
        await self._json_route(
            receive,
            send,
            "tokenize",
            lambda body: utility.tokenize(body, tok, model, rt.features),
            pure=True,
        )

    async def _detokenize(self, receive: Any, send: Any) -> None:
        tok, model = self.runtime.tokenizer, self.runtime.config.model_name
        await self._json_route(
            receive,
            send,
            "detokenize",
            lambda body: utility.detokenize(body, tok, model),
            pure=True,
        )

    async def _version(self, receive: Any, send: Any) -> None:
        await self._json_route(None, send, "version", lambda _: utility.version())

    async def _model_info(self, receive: Any, send: Any) -> None:
        await self._json_route(None, send, "info", lambda _: utility.model_info(self._facts))

    async def _server_info(self, receive: Any, send: Any) -> None:
        running = len(self.runtime.shard)
        await self._json_route(
            None, send, "info", lambda _: utility.server_info(self._facts, running)
        )

    async def _abort_request(self, receive: Any, send: Any) -> None:
        def abort(body: Any) -> dict[str, Any]:
            req = utility.parse_abort(body)
            return {"aborted": self.runtime.abort_requests(req.rid, abort_all=req.abort_all)}

        await self._json_route(receive, send, "abort", abort)

    async def _metrics(self, receive: Any, send: Any) -> None:
        shared = self.runtime.shared_metrics
        if shared is not None:  # several API-server processes: every one's counts, as of now
            await shared.refresh()
            body = shared.render()
        else:
            body = generate_latest(self.runtime.metrics.registry)
        await _respond(send, 200, body, [(b"content-type", CONTENT_TYPE_LATEST.encode())])


class _NotFound(TokenwireError):
    error_type = "not_found_error"
    prefix = "not found"

    def __init__(self, detail: str, status: int) -> None:
        super().__init__(detail)
        self.status = status  # type: ignore[misc]


_ROUTE_NAMES = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}


def _route_of(path: str) -> str:
    return _ROUTE_NAMES.get(path) or path.strip("/").replace("/", "_") or "other"


async def _read_json(receive: Any) -> Any:
    return await limits.parse_body(receive, lambda body: body)


def create_app(tokenizer: Tokenizer, engine: Engine, config: ServerConfig | None = None) -> App:
    """The ASGI app; the engine starts and stops with it (ASGI lifespan)."""
    return App(Runtime(tokenizer, engine, config or ServerConfig()))


async def _gather(rt: Runtime, subs: Subs) -> tuple[int, Any] | _Gathered:
    """Every choice's items until its final one; an error ends everything."""
    got = _Gathered(len(subs))
    async for batch in _merged(subs):
        for index, item in batch:
            if isinstance(item, Error):
                for rid, _, sink in subs:
                    rt.abort(rid, sink)
                rt.metrics.request_errors.labels(item.error.error_type).inc()
                return item.error.status, api.error_body(item.error)
            got.texts[index].append(item.text)
            got.ids[index].extend(item.token_ids)
            if item.extras is not None:
                got.extras[index].append(item.extras)
            if isinstance(item, Done):
                got.finals[index] = item
                _count_finish(rt, item)
    return got


def _count_finish(rt: Runtime, done: Any) -> None:
    fr = done.finish_reason
    reason = fr.openai_finish_reason if fr is not None else "unknown"
    rt.metrics.request_success.labels(reason or "unknown").inc()


class _Gathered:
    __slots__ = ("extras", "finals", "ids", "texts")

    def __init__(self, n: int) -> None:
        self.texts: list[list[str]] = [[] for _ in range(n)]
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.extras: list[list[Any]] = [[] for _ in range(n)]
        self.finals: list[Any] = [None] * n


async def _collect_openai(
    rt: Runtime, plan: api.Plan, subs: Subs, eos: tuple[int, ...]
) -> tuple[int, Any]:
    got = await _gather(rt, subs)
    if not isinstance(got, _Gathered):
        return got
    choices = []
    reasoning_tokens = None if plan.output is None or not plan.output.reasoning else 0
    logprobs = _choice_logprobs(rt, plan)
    prompt_logprobs = None
    for index, done in enumerate(got.finals):
        reason, stop_reason = api.finish_fields(done.finish_reason, eos)
        text = "".join(got.texts[index])
        if plan.echo is not None:
            text = plan.echo[index // plan.n] + text
        choice: dict[str, Any] = {"index": index}
        lp = None
        if logprobs is not None:
            extras = [e for x in got.extras[index] for e in (x if isinstance(x, list) else [x])]
            lp = logprobs[index].take(got.ids[index], extras)
            prompt_logprobs = logprobs[index].prompt_logprobs
        if plan.route == "chat" and plan.output is not None:
            parsed = ChoiceOutput(
                plan.output,
                rt.tokenizer,
                plan.reasoning_fields,
                parallel=plan.parallel_tool_calls,
            )
            choice["message"] = parsed.message(text, got.ids[index])
            if parsed.called and reason == "stop":
                reason = "tool_calls"
            if reasoning_tokens is not None:
                reasoning_tokens += parsed.reasoning_tokens
        elif plan.route == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice |= {
            "logprobs": lp,
            "finish_reason": reason,
            "stop_reason": stop_reason,
            "matched_stop": api.matched_stop(done.finish_reason),
        }
        if prompt_logprobs is not None and plan.route != "chat":
            choice["prompt_logprobs"] = prompt_logprobs
        choices.append(choice)
    prompt_tokens = plan.prompt_tokens
    completion_tokens = sum(done.completion_tokens for done in got.finals)
    reasoning = api.reasoning_count(sum(d.reasoning_tokens for d in got.finals), reasoning_tokens)
    cached = sum(done.cached_tokens for done in got.finals)
    body = plan.openai_head(chunk=False) | {
        "choices": choices,
        "usage": api.usage(prompt_tokens, completion_tokens, reasoning, cached_tokens=cached),
    }
    if prompt_logprobs is not None and plan.route == "chat":
        body["prompt_logprobs"] = prompt_logprobs  # vLLM: one prompt, at the top level
    return 200, body


def _choice_logprobs(rt: Runtime, plan: api.Plan) -> list[ChoiceLogprobs] | None:
    """Per choice, its logprob shaper, when the request asked for logprobs."""
    p = plan.params
    if p.logprobs is None and p.prompt_logprobs is None:
        return None
    strings = TokenStrings(rt.tokenizer, as_ids=plan.return_tokens_as_token_ids)
    return [
        ChoiceLogprobs(
            strings,
            chat=plan.route == "chat",
            top=p.logprobs,
            prompt=plan.prompts[k // plan.n],
            echo=plan.echo is not None,
            prompt_top=p.prompt_logprobs if plan.prompt_logprobs else None,
        )
        for k in range(plan.choices)
    ]


class _Streamer:
    """Turns one HTTP request's items into SSE bytes (synchronous; the loop in ``App._stream``
    does the waiting and the sending)."""

    def __init__(self, rt: Runtime, subs: Subs) -> None:
        self.rt = rt
        self.subs = subs
        self.open = set(range(len(subs)))
        self.tracker = _Tracker(rt.metrics)
        #: The error the stream ended with, if it did (its status is the request's outcome).
        self.failed: TokenwireError | None = None

    def head(self) -> bytes:
        return b""

    def feed(self, batch: list[tuple[int, Any]]) -> bytes:
        """SSE bytes for a batch of items; ``self.open`` empties when the response is over."""
        raise NotImplementedError

    def error(self, err: TokenwireError) -> bytes:
        self.open.clear()
        self.failed = err
        self.rt.metrics.request_errors.labels(err.error_type).inc()
        return api.sse(api.error_body(err)) + api.SSE_DONE

    def close(self) -> None:
        """The response is over (or abandoned): choices still open are aborted."""
        for k in self.open:
            rid, _, sink = self.subs[k]
            self.rt.abort(rid, sink)
        self.open.clear()
        self.rt.finished()


class _OpenAIStreamer(_Streamer):
    def __init__(self, rt: Runtime, plan: api.Plan, subs: Subs, eos: tuple[int, ...]) -> None:
        super().__init__(rt, subs)
        self.plan = plan
        self.writer = api.ChunkWriter(plan, eos)
        self.completion_tokens = 0
        self.cached_tokens = 0  # the engine's counts, summed over the choices
        self.reasoning_tokens = 0
        self.parsed: list[ChoiceOutput] | None = None
        if plan.route == "chat" and plan.output is not None:
            spec, fields = plan.output, plan.reasoning_fields
            self.parsed = [
                ChoiceOutput(spec, rt.tokenizer, fields, parallel=plan.parallel_tool_calls)
                for _ in subs
            ]
        self.logprobs = _choice_logprobs(rt, plan)
        # Choices whose first chunk is still to come (it carries the echoed prompt).
        self.fresh = set(range(len(subs))) if (plan.echo or self.logprobs) else set()

    def _extras(self, index: int, item: Any) -> tuple[str, dict[str, Any]]:
        """The echoed prompt (first chunk only) and the logprob fields of an item's chunk."""
        first = index in self.fresh
        self.fresh.discard(index)
        plan = self.plan
        prefix = plan.echo[index // plan.n] if first and plan.echo is not None else ""
        fields: dict[str, Any] = {}
        if self.logprobs is not None:
            shaper = self.logprobs[index]
            fields["logprobs"] = shaper.take(item.token_ids, item.extras)
            if first and shaper.prompt_logprobs is not None:
                fields["prompt_logprobs"] = shaper.prompt_logprobs
        return prefix, fields

    def head(self) -> bytes:
        if self.plan.route == "chat":
            return b"".join(self.writer.role(k) for k in range(len(self.subs)))
        return b""

    def feed(self, batch: list[tuple[int, Any]]) -> bytes:
        """SSE bytes for a batch of items. A choice's plain text deltas that wait together go
        out as one chunk (as vLLM merges the outputs a stream has not taken yet); with logprobs,
        an echo or an output parser, every item keeps its own."""
        self.tracker.chunk()
        writer = self.writer
        out: list[bytes] = []
        parsed = self.parsed
        run: list[str] = []  # texts of plain deltas of choice ``run_index`` not written yet
        run_index = run_tokens = 0
        for index, item in batch:
            # (Only plain deltas start a run: with logprobs, an echo still to come or a parser,
            # none does; a final item of the same choice takes the run's text.)
            if run and (index != run_index or isinstance(item, Error)):
                out.append(writer.delta(run_index, "".join(run), run_tokens))
                run = []
            if isinstance(item, Frame):
                if self.fresh or self.logprobs is not None:
                    out.append(self._chunk(index, item))
                elif parsed is not None:
                    delta = parsed[index].delta(item.text, item.token_ids)
                    if delta:
                        out.append(
                            writer.chunk(index, _delta_fields(delta), item.completion_tokens)
                        )
                elif item.text:
                    run.append(item.text)
                    run_index = index
                    run_tokens = item.completion_tokens
                continue
            if isinstance(item, Error):
                out.append(self.error(item.error))
                break
            self.open.discard(index)
            _count_finish(self.rt, item)
            self.completion_tokens += item.completion_tokens
            self.cached_tokens += item.cached_tokens
            self.reasoning_tokens += item.reasoning_tokens
            prefix, fields = self._extras(index, item)
            text = prefix + item.text
            if run:  # this choice's waiting deltas end with it
                text = "".join(run) + text
                run = []
            if parsed is not None:
                choice = parsed[index]
                delta = choice.final(item.text, item.token_ids)
                reason = "tool_calls" if choice.called else None
                if reason and item.finish_reason and item.finish_reason.kind != "stop":
                    reason = None  # length, abort: said as they are
                out.append(
                    writer.final(
                        index,
                        text,
                        item.finish_reason,
                        item.completion_tokens,
                        delta=delta,
                        reason=reason,
                        extra=fields,
                    )
                )
            else:
                out.append(
                    writer.final(
                        index, text, item.finish_reason, item.completion_tokens, extra=fields
                    )
                )
            if not self.open:
                plan = self.plan
                if plan.include_usage:
                    reasoning = None
                    if parsed is not None and plan.output and plan.output.reasoning:
                        reasoning = sum(c.reasoning_tokens for c in parsed)
                    reasoning = api.reasoning_count(self.reasoning_tokens, reasoning)
                    out.append(
                        writer.usage(
                            plan.prompt_tokens,
                            self.completion_tokens,
                            reasoning,
                            cached_tokens=self.cached_tokens,
                        )
                    )
                out.append(api.SSE_DONE)
        if run:
            out.append(writer.delta(run_index, "".join(run), run_tokens))
        return b"".join(out)

    def _chunk(self, index: int, item: Any) -> bytes:
        """An intermediate chunk with the echoed prompt or logprobs (an empty delta when a
        parser holds the text back: the logprobs still go out)."""
        prefix, fields = self._extras(index, item)
        text = prefix + item.text
        parsed = self.parsed
        if self.plan.route != "chat":
            payload: dict[str, Any] = {"text": text}
        elif parsed is not None:
            payload = {"delta": parsed[index].delta(item.text, item.token_ids)}
        else:
            payload = {"delta": {"content": text} if text else {}}
        payload |= {"logprobs": None, "finish_reason": None} | fields
        return self.writer.chunk(index, payload, item.completion_tokens)


def _delta_fields(delta: dict[str, Any]) -> dict[str, Any]:
    return {"delta": delta, "logprobs": None, "finish_reason": None}


async def _collect_generate(rt: Runtime, plan: api.Plan, subs: Subs) -> tuple[int, Any]:
    got = await _gather(rt, subs)
    if not isinstance(got, _Gathered):
        return got
    out = [
        _generate_body(rid, "".join(got.texts[k]), got.ids[k], got.finals[k], len(plan.prompts[p]))
        for k, (rid, p, _) in enumerate(subs)
    ]
    shapers = _generate_logprobs(rt, plan, subs)
    if shapers is not None:
        for k, body in enumerate(out):
            extras = [e for x in got.extras[k] for e in (x if isinstance(x, list) else [x])]
            shapers[k].take(got.ids[k], extras)
            body["meta_info"] |= shapers[k].meta()
    return 200, (out if plan.batch else out[0])


def _generate_logprobs(rt: Runtime, plan: api.Plan, subs: Subs) -> list[GenerateLogprobs] | None:
    """Per request of a ``/generate`` call, its logprob lists, when ``return_logprob``."""
    if plan.sglang_logprobs is None:
        return None
    start, top, with_text = plan.sglang_logprobs
    strings = TokenStrings(rt.tokenizer)
    return [GenerateLogprobs(strings, plan.prompts[p], start, top, with_text) for _, p, _ in subs]


def _generate_body(rid: str, text: str, ids: list[int], final: Any, prompt_tokens: int) -> dict:
    """SGLang's response shape; the last one of a request also carries ``cached_tokens``,
    ``reasoning_tokens`` and ``matched_stop``."""
    fr = final.finish_reason if final is not None else None
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": fr.to_json() if fr is not None else None,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": final.completion_tokens if final is not None else len(ids),
    }
    if final is not None:
        meta["cached_tokens"] = final.cached_tokens
        meta["reasoning_tokens"] = final.reasoning_tokens
        meta["matched_stop"] = api.matched_stop(fr)
    return {"text": text, "output_ids": ids, "meta_info": meta}


class _GenerateStreamer(_Streamer):
    """SGLang's streaming: every chunk carries the text and output ids so far."""

    def __init__(self, rt: Runtime, plan: api.Plan, subs: Subs) -> None:
        super().__init__(rt, subs)
        self.plan = plan
        self.texts = ["" for _ in subs]
        self.ids: list[list[int]] = [[] for _ in subs]
        self.logprobs = _generate_logprobs(rt, plan, subs)

    def feed(self, batch: list[tuple[int, Any]]) -> bytes:
        """SSE bytes for a batch of items. Each chunk carries everything so far, so of a
        choice's items that wait together only the last makes one (as SGLang's streams take
        only their newest output)."""
        self.tracker.chunk()
        out: list[bytes] = []
        last = len(batch) - 1
        for k, (index, item) in enumerate(batch):
            if isinstance(item, Error):
                out.append(self.error(item.error))
                break
            self.texts[index] += item.text
            self.ids[index].extend(item.token_ids)
            if self.logprobs is not None:
                self.logprobs[index].take(item.token_ids, item.extras)
            if (
                k < last
                and batch[k + 1][0] == index
                and isinstance(item, Frame)
                and not isinstance(batch[k + 1][1], Error)
            ):
                continue  # the choice's next item says it all, and more
            rid, p, _ = self.subs[index]
            final = item if isinstance(item, Done) else None
            body = _generate_body(
                rid, self.texts[index], self.ids[index], final, len(self.plan.prompts[p])
            )
            if self.logprobs is not None:
                body["meta_info"] |= self.logprobs[index].meta()
            if final is None:
                body["meta_info"]["completion_tokens"] = item.completion_tokens
            else:
                self.open.discard(index)
                _count_finish(self.rt, final)
            if self.plan.batch:
                body["index"] = index
            out.append(api.sse(body) + (api.SSE_DONE if not self.open else b""))
        return b"".join(out)
