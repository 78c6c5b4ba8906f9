"""The pooling routes' handlers: the body parsed into a call (in a worker thread when large), its
inputs submitted to the engine at once, the outputs awaited (the client going away drops them,
here and in the engine), and the answer written as one JSON (or binary) response."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenwire.messages.errors import ClientDisconnected, QueueFullError, TokenwireError
from tokenwire.server import limits
from tokenwire.server.http import (
    current_scope,
    disconnected,
    header,
    respond,
    route_of,
    send_error,
)
from tokenwire.server.pooling.requests import (
    PoolingCall,
    PoolingContext,
    parse_classify,
    parse_embeddings,
    parse_encode,
    parse_pooling,
    parse_rerank,
    parse_score,
)
from tokenwire.server.pooling.responses import answer

if TYPE_CHECKING:
    from tokenwire.server.app import App, Handler

__all__ = ["ROUTES", "context"]

#: Output values past which the answer is formatted in a worker thread (a large batch of wide
#: vectors takes milliseconds to write as JSON).
_OFFLOAD_VALUES = 1 << 18


def context(app: App) -> PoolingContext:
    """What parsing reads of the server now (the engine's task is known once it started)."""
    rt = app.runtime
    return PoolingContext(
        tok=rt.tokenizer,
        models=rt.models,
        task=rt.pooling_task,
        model=rt.pooling_model,
        supported=rt.supported_tasks,
        generates="generate" in rt.supported_tasks,
        pooler_config=rt.config.pooler_config,
        features=rt.features,
        header_id=header(current_scope.get(), b"x-request-id"),
    )


async def _serve(
    app: App, receive: Any, send: Any, parse: Callable[[Any, PoolingContext], PoolingCall]
) -> None:
    rt = app.runtime
    scope = current_scope.get() or {}
    route = route_of(scope.get("path", "/pooling"))
    started = time.perf_counter()
    ctx = context(app)
    try:
        call = await limits.parse_body(receive, lambda body: parse(body, ctx))
        job = rt.submit_pooling(call.plan)
    except ClientDisconnected:
        return
    except TokenwireError as err:
        await send_error(rt.metrics, send, err, route)
        return
    # The client going away drops the job (its future is cancelled): nothing is left running.
    gone = disconnected(receive)
    gone.add_done_callback(lambda f: f.cancelled() or f.exception() or rt.pooling.drop(job))
    ok = False
    try:
        try:
            # (shielded: this task's own cancellation leaves the job's future as it is)
            outputs = await asyncio.shield(job.future)
        except asyncio.CancelledError:
            if not job.future.cancelled():
                raise  # (this handler's own task is cancelled)
            if gone.done() and not gone.cancelled():
                rt.metrics.requests.labels(route, "499").inc()
                return
            err: TokenwireError = QueueFullError("the request was ended by the server")
            await send_error(rt.metrics, send, err, route)
            return
        except TokenwireError as err:
            await send_error(rt.metrics, send, err, route)
            return
        if sum(o.size for o in outputs) > _OFFLOAD_VALUES:
            loop = asyncio.get_running_loop()
            body, headers = await loop.run_in_executor(None, answer, call, outputs, started)
        else:
            body, headers = answer(call, outputs, started)
        ok = True
    finally:
        gone.cancel()
        rt.pooling_done(job, ok)
    rt.metrics.requests.labels(route, "200").inc()
    rt.metrics.engine(job.engine).e2e.observe(time.perf_counter() - started)
    await respond(send, 200, body, headers)


def _handler(parse: Callable[[Any, PoolingContext], PoolingCall]) -> Handler:
    async def handle(app: App, receive: Any, send: Any) -> None:
        await _serve(app, receive, send, parse)

    handle.__doc__ = parse.__doc__
    return handle


embeddings = _handler(parse_embeddings)
pooling = _handler(parse_pooling)
classify = _handler(parse_classify)
score = _handler(parse_score)
rerank = _handler(parse_rerank)
encode = _handler(parse_encode)

ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "/v1/embeddings"): embeddings,
    ("POST", "/pooling"): pooling,
    ("POST", "/classify"): classify,
    ("PUT", "/classify"): classify,
    ("POST", "/v1/classify"): classify,
    ("POST", "/score"): score,
    ("POST", "/v1/score"): score,
    ("POST", "/rerank"): rerank,
    ("POST", "/v1/rerank"): rerank,
    ("POST", "/v2/rerank"): rerank,
    ("POST", "/encode"): encode,
    ("PUT", "/encode"): encode,
}
