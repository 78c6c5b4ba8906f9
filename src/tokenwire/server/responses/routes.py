"""The Responses API routes: ``POST /v1/responses`` (a stream of semantic events, a whole response,
or a background response to poll), and a kept response's ``GET /v1/responses/{id}``,
``DELETE /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from tokenwire.messages.egress import Error, Frame
from tokenwire.messages.errors import (
    ClientDisconnected,
    InternalError,
    TokenwireError,
    ValidationError,
)
from tokenwire.runtime import Plan, Runtime
from tokenwire.server import limits
from tokenwire.server.admit import admit, release
from tokenwire.server.as_chat import SplitOutput, parse_as_chat
from tokenwire.server.errors import OPENAI_ERRORS, NotFound, error_body
from tokenwire.server.guard import GENERIC_ERROR
from tokenwire.server.http import encode, respond, send_error
from tokenwire.server.responses.output import (
    ResponseEvents,
    error_object,
    output_items,
    response_object,
    status_of,
    usage,
)
from tokenwire.server.responses.request import (
    RENAMES,
    ResponsesRequest,
    input_messages,
    read_request,
)
from tokenwire.server.responses.store import ResponseStore
from tokenwire.server.streaming import (
    Gathered,
    Streamer,
    Subs,
    collect,
    count_finish,
    gather,
    stream,
)

if TYPE_CHECKING:
    from tokenwire.server.app import App, Handler

__all__ = ["ROUTES", "Responses", "by_id", "create"]

log = logging.getLogger("tokenwire.server")

ROUTE = "responses"
BY_ID = "responses_by_id"
#: Seconds a cancel waits for its background response to end.
_CANCEL_WAIT = 30.0


class Responses:
    """A server's Responses API state: the kept responses, and the background ones running."""

    def __init__(self, store_size: int) -> None:
        self.store = ResponseStore(store_size)
        self.tasks: dict[str, asyncio.Task[Any]] = {}


def _usage(plan: Plan, done: Any, output: SplitOutput) -> dict[str, Any]:
    return usage(
        plan.prompt_tokens,
        done.completion_tokens,
        output.reasoning_tokens(done.reasoning_tokens),
        done.cached_tokens,
    )


def _error(err: TokenwireError) -> dict[str, Any]:
    """A failed response's ``error`` for ``err`` (its message as an error response gives it)."""
    return error_object(err.status, error_body(err)["error"]["message"])


def _keep(
    state: Responses, req: ResponsesRequest, response: dict[str, Any], items: list[dict[str, Any]]
) -> None:
    """The kept response ``req`` is over: its final object, and the conversation it ends."""
    if req.store:
        history = req.history + input_messages(items, "output")
        state.store.finish(req.id, response, history, req.carried)


class ResponsesStreamer(Streamer):
    """The semantic events of a streamed response."""

    def __init__(
        self, rt: Runtime, plan: Plan, subs: Subs, req: ResponsesRequest, state: Responses
    ) -> None:
        super().__init__(rt, subs)
        self.plan = plan
        self.req = req
        self.state = state
        self.events = ResponseEvents(req, plan.model, plan.created)
        self.output = SplitOutput(plan, rt.tokenizer)
        self.ended = False

    def head(self) -> bytes:
        return self.events.start()

    def feed(self, batch: list[tuple[int, Any]]) -> bytes:
        self.tracker.chunk()
        events = self.events
        out = []
        for _, item in batch:
            if isinstance(item, Error):
                out.append(self.error(item.error))
                break
            final = not isinstance(item, Frame)
            out.append(events.add(self.output.pieces(item.text, item.token_ids, final=final)))
            if not final:
                continue
            self.open.clear()
            count_finish(self.rt, item, self.tracker)
            status, incomplete = status_of(item.finish_reason)
            use = _usage(self.plan, item, self.output)
            out.append(events.finish(status, usage=use, incomplete=incomplete))
            self._end(status, usage=use, incomplete=incomplete)
        return b"".join(out)

    def error(self, err: TokenwireError) -> bytes:
        self.open.clear()
        self.failed = err
        self.rt.metrics.request_errors.labels(err.error_type).inc()
        data = self.events.finish("failed", error=_error(err))
        self._end("failed", error=_error(err))
        return data

    def _end(self, status: str, **fields: Any) -> None:
        self.ended = True
        items = self.events.items
        _keep(self.state, self.req, self.events.response(status, output=items, **fields), items)

    def close(self) -> None:
        if not self.ended:  # the client went away, or stopped reading
            self._end("cancelled")
        super().close()


async def _collect(
    rt: Runtime, plan: Plan, subs: Subs, req: ResponsesRequest, state: Responses
) -> tuple[int, Any]:
    """The whole response (kept, when stored); an error ends it ``failed``."""
    got = await gather(rt, subs)
    if not isinstance(got, Gathered):
        status, body = got
        error = error_object(status, body["error"]["message"])
        _keep(
            state,
            req,
            response_object(req, plan.model, plan.created, status="failed", error=error),
            [],
        )
        return got
    done = got.finals[0]
    output = SplitOutput(plan, rt.tokenizer)
    reasoning, content, calls = output.whole("".join(got.texts[0]), got.ids[0])
    status, incomplete = status_of(done.finish_reason)
    items = output_items(reasoning, content, calls, status)
    body = response_object(
        req,
        plan.model,
        plan.created,
        status=status,
        output=items,
        usage=_usage(plan, done, output),
        incomplete=incomplete,
    )
    _keep(state, req, body, items)
    return 200, body


async def _background(
    rt: Runtime, plan: Plan, subs: Subs, req: ResponsesRequest, state: Responses
) -> None:
    """A background response, run to its end with nobody waiting on it."""
    try:
        await _collect(rt, plan, subs, req, state)
    except BaseException as exc:
        for rid, _, sink in subs:
            rt.abort(rid, sink)
        if not isinstance(exc, Exception):
            raise
        log.exception("background response %s failed", req.id)
        error = _error(InternalError(GENERIC_ERROR))
        _keep(
            state,
            req,
            response_object(req, plan.model, plan.created, status="failed", error=error),
            [],
        )
    finally:
        state.tasks.pop(req.id, None)
        rt.finished()


def _abandoned(state: Responses, req: ResponsesRequest, plan: Plan) -> None:
    """A kept response whose client left before its end: ``cancelled``, with no output."""
    if req.store and req.id in state.store and state.store.get(req.id).running:
        body = response_object(req, plan.model, plan.created, status="cancelled")
        _keep(state, req, body, [])


async def create(app: App, receive: Any, send: Any) -> None:
    """``POST /v1/responses``."""
    rt = app.runtime
    config = app.config
    state: Responses = app.state.responses
    requests: list[ResponsesRequest] = []

    def plan_of(body: Any) -> Plan:
        req = read_request(body, state.store.history)
        if req.background and state.store.size == 0:
            raise ValidationError(
                "this server keeps no responses (--responses-store-size 0): background "
                "responses cannot be read back",
                param="background",
            )
        plan = parse_as_chat(
            req.chat,
            rt.tokenizer,
            config.model_name,
            RENAMES,
            limits=config.limits,
            features=rt.features,
        )
        requests.append(req)
        return plan

    try:
        plan = await limits.parse_body(receive, plan_of)
    except ClientDisconnected:
        return
    except TokenwireError as err:
        await send_error(rt.metrics, send, err, ROUTE)
        return
    # (its key's quotas and the waiting queue, as every generation route's)
    admitted = await admit(rt, plan, receive, send, ROUTE, OPENAI_ERRORS)
    if admitted is None:
        return
    subs, send = admitted.subs, admitted.send
    (req,) = requests
    running = response_object(req, plan.model, plan.created, status="in_progress")
    if req.store:
        cancel = (lambda: rt.abort_requests(plan.id)) if req.background else None
        state.store.start(req.id, running, cancel, req.echo_chars)
    if req.background:
        admitted.gone.cancel()  # (nobody waits on it: its client may go)
        task = asyncio.ensure_future(_background(rt, plan, subs, req, state))
        task.add_done_callback(lambda _: release(rt, admitted))
        state.tasks[req.id] = task
        rt.metrics.requests.labels(ROUTE, "200").inc()
        await respond(send, 200, encode(running))
        return
    try:
        if plan.stream:
            streamer = ResponsesStreamer(rt, plan, subs, req, state)
            await stream(
                rt,
                receive,
                send,
                streamer,
                ROUTE,
                gone=admitted.gone,
                started=admitted.started,
                keep_alive=admitted.keep_alive,
            )
        else:
            work = _collect(rt, plan, subs, req, state)
            await collect(rt, receive, send, subs, work, ROUTE, gone=admitted.gone)
    finally:
        release(rt, admitted)
        _abandoned(state, req, plan)


async def by_id(app: App, scope: dict, send: Any) -> None:
    """``GET``, ``DELETE`` ``/v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``."""
    rt = app.runtime
    state: Responses = app.state.responses
    rest = scope["path"][len("/v1/responses/") :]
    rid, _, action = rest.partition("/")
    method = scope["method"]
    try:
        if not rid or action not in ("", "cancel"):
            raise NotFound(f"no route {scope['path'][:100]}", 404)
        if action == "cancel":
            if method != "POST":
                raise NotFound("method not allowed", 405)
            body = await _cancel(state, rid)
        elif method == "GET":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            if query.get("stream", ["false"])[-1].lower() == "true":
                raise ValidationError(
                    "streaming a kept response again is not supported by this server",
                    param="stream",
                )
            body = state.store.get(rid).response
        elif method == "DELETE":
            entry = state.store.get(rid)
            if entry.running and entry.cancel is not None:
                entry.cancel()
            state.store.delete(rid)
            body = {"id": rid, "object": "response", "deleted": True}
        else:
            raise NotFound("method not allowed", 405)
    except TokenwireError as err:
        await send_error(rt.metrics, send, err, BY_ID)
        return
    rt.metrics.requests.labels(BY_ID, "200").inc()
    await respond(send, 200, encode(body))


async def _cancel(state: Responses, rid: str) -> dict[str, Any]:
    """Cancel background response ``rid``: its engine requests end, and it ends ``cancelled``
    (one that has ended already is returned as it is)."""
    entry = state.store.get(rid)
    if not entry.response.get("background"):
        raise ValidationError(
            "only responses created with background: true can be cancelled", param=None
        )
    task = state.tasks.get(rid)
    if entry.running and entry.cancel is not None:
        entry.cancel()
    if task is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(task), _CANCEL_WAIT)
    return state.store.get(rid).response


ROUTES: dict[tuple[str, str], Handler] = {("POST", "/v1/responses"): create}
