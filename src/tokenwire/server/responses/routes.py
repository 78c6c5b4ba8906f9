"""The Responses API routes: ``POST /v1/responses`` (a stream of semantic events, a whole response,
or a background response to poll), and a kept response's ``GET /v1/responses/{id}``,
``DELETE /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel`` and
``GET /v1/responses/{id}/input_items``. A request with ``mcp`` tools runs as an ``Agent``
(rounds of generation and MCP calls); the others go straight through the chat pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
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
from tokenwire.server import admit as gate
from tokenwire.server import limits
from tokenwire.server.as_chat import SplitOutput, parse_as_chat
from tokenwire.server.errors import OPENAI_ERRORS, NotFound, error_body
from tokenwire.server.guard import GENERIC_ERROR
from tokenwire.server.http import current_scope, disconnected, encode, respond, send_error
from tokenwire.server.mcp import McpEndpoint, missing_sdk
from tokenwire.server.responses.agent import Agent, plan_within_context
from tokenwire.server.responses.output import (
    ResponseEvents,
    error_object,
    output_items,
    response_object,
    status_of,
    usage,
)
from tokenwire.server.responses.request import RENAMES, ResponsesRequest, read_request
from tokenwire.server.responses.state import Responses, owner_of
from tokenwire.server.security import client_key
from tokenwire.server.streaming import (
    Gathered,
    Streamer,
    Subs,
    collect,
    count_finish,
    gather,
    received,
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
#: Context items past which a request is read in a worker thread.
_OFFLOAD_ITEMS = 256


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


class ResponsesStreamer(Streamer):
    """The semantic events of a streamed response."""

    def __init__(
        self,
        rt: Runtime,
        plan: Plan,
        subs: Subs,
        req: ResponsesRequest,
        state: Responses,
        owner: str,
        extra: dict[str, Any],
    ) -> None:
        super().__init__(rt, subs)
        self.plan = plan
        self.req = req
        self.state = state
        self.owner = owner
        self.events = ResponseEvents(req, plan.model, plan.created)
        self.events.extra = extra
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
        self.state.end(self.req, self.owner, self.events.response(status, output=items, **fields))

    def close(self) -> None:
        if not self.ended:  # the client went away, or stopped reading
            self._end("cancelled")
        super().close()


async def _collect(
    rt: Runtime,
    plan: Plan,
    subs: Subs,
    req: ResponsesRequest,
    state: Responses,
    owner: str,
    extra: dict[str, Any],
    ended: list[bool] | None = None,
) -> tuple[int, Any]:
    """The whole response (kept, when stored; ``ended`` says it was); an error ends it
    ``failed``."""
    if ended is None:
        ended = [False]
    got = await gather(rt, subs)
    ended[0] = True
    if not isinstance(got, Gathered):
        status, body = got
        error = error_object(status, body["error"]["message"])
        failed = response_object(req, plan.model, plan.created, status="failed", error=error)
        state.end(req, owner, failed | extra)
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
    body |= extra
    written = state.end(req, owner, body)
    if written is not None:  # (kept before the client has it: any worker reads it next)
        with contextlib.suppress(Exception):
            await asyncio.shield(written)
    return 200, body


async def _background(
    rt: Runtime,
    plan: Plan,
    subs: Subs,
    req: ResponsesRequest,
    state: Responses,
    owner: str,
    extra: dict[str, Any],
) -> None:
    """A background response, run to its end with nobody waiting on it."""
    try:
        await _collect(rt, plan, subs, req, state, owner, extra)
    except BaseException as exc:
        for rid, _, sink in subs:
            rt.abort(rid, sink)
        if not isinstance(exc, Exception):
            raise
        log.exception("background response %s failed", req.id)
        error = _error(InternalError(GENERIC_ERROR))
        failed = response_object(req, plan.model, plan.created, status="failed", error=error)
        state.end(req, owner, failed)
    finally:
        rt.finished()


def _abandoned(
    state: Responses, req: ResponsesRequest, owner: str, plan: Plan, ended: bool
) -> None:
    """A kept response whose client left before its end: ``cancelled``, with no output."""
    if req.store and not ended:
        body = response_object(req, plan.model, plan.created, status="cancelled")
        state.end(req, owner, body)


def _endpoints(state: Responses, req: ResponsesRequest, body: Any) -> list[McpEndpoint]:
    """The MCP servers of ``req``'s ``mcp`` tools (a 400 for one the server cannot use)."""
    if not req.mcp:
        return []
    missing = missing_sdk()
    if missing is not None:
        raise ValidationError(missing, param="tools")
    where = {t["server_label"]: k for k, t in enumerate(body["tools"]) if t.get("type") == "mcp"}
    return [
        state.tool_servers.endpoint(
            spec.server_label, spec.server_url, spec.headers, f"tools[{where[spec.server_label]}]"
        )
        for spec in req.mcp
    ]


async def create(app: App, receive: Any, send: Any) -> None:
    """``POST /v1/responses``."""
    rt = app.runtime
    config = app.config
    state: Responses = app.state.responses
    owner = owner_of(current_scope.get())
    received.set(time.perf_counter())
    release = None

    def plan_of(body: Any, context: list[dict[str, Any]]) -> tuple[Any, ...]:
        req = read_request(body, context)
        if req.background and not state.keeps:
            raise ValidationError(
                "this server keeps no responses (--responses-store-size 0): background "
                "responses cannot be read back",
                param="background",
            )
        if req.conversation and not req.store:
            raise ValidationError(
                "a response in a conversation is added to it: store must be true",
                param="store",
            )
        endpoints = _endpoints(state, req, body)
        chat = req.chat
        if req.mcp:  # (a choice may name, or need, the MCP tools: they are not listed yet)
            chat = {k: v for k, v in chat.items() if k != "tool_choice"}
        head = [{"role": "system", "content": req.instructions}] if req.instructions else []

        def parse(messages: list[dict[str, Any]]) -> Plan:
            return parse_as_chat(
                {**chat, "messages": messages},
                rt.tokenizer,
                rt.models,
                RENAMES,
                limits=config.limits,
                features=rt.features,
            )

        if req.truncate:
            plan, dropped = plan_within_context(
                parse, head, req.context_items + req.input_items, True
            )
        else:
            plan, dropped = parse(chat["messages"]), 0
        return req, plan, endpoints, dropped

    try:
        body, big = await limits.read_json(receive)
        context = await state.context(body, owner)
        req, plan, endpoints, dropped = await limits.parse_decoded(
            body, lambda b: plan_of(b, context), big or len(context) > _OFFLOAD_ITEMS
        )
        extra = {"truncated_items": dropped} if dropped else {}
        running = response_object(req, plan.model, plan.created, status="in_progress") | extra
        if req.store and state.keeps:
            await state.check_size(req, running)
        if req.background:
            release = state.background.admit(owner)
        if not req.mcp:
            await rt.prepare_media(plan)  # (input_image: processed in the media workers)
            await rt.check_grammar(plan, client_key(current_scope.get()))
    except ClientDisconnected:
        if release is not None:
            release()
        return
    except TokenwireError as err:
        if release is not None:
            release()
        await send_error(rt.metrics, send, err, ROUTE)
        return
    admitted = None
    subs: Subs = []
    if not req.mcp:  # (an agent's rounds wait in the queue each in its turn)
        # (its key's quotas and the waiting queue, as every generation route's)
        admitted = await gate.admit(rt, plan, receive, send, ROUTE, OPENAI_ERRORS)
        if admitted is None:
            if release is not None:
                release()
            return
        subs, send = admitted.subs, admitted.send
    req.store = req.store and state.keeps
    try:
        if req.store:
            await state.begin(req, owner, running)
    except TokenwireError as err:
        for rid, _, sink in subs:
            rt.abort(rid, sink)
        if release is not None:
            release()
        if admitted is not None:
            gate.release(rt, admitted)
            if admitted.started:  # (kept alive while it waited: its stream ends with the error)
                body = OPENAI_ERRORS.stream_end(err)
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
        await send_error(rt.metrics, send, err, ROUTE)
        return
    if req.mcp:
        agent = Agent(app, req, owner, endpoints, plan.model, plan.created)
        agent.events.extra = extra
        await _agent(app, agent, receive, send, release)
        return
    assert admitted is not None
    if req.background:
        admitted.gone.cancel()  # (nobody waits on it: its client may go)
        task = asyncio.ensure_future(_background(rt, plan, subs, req, state, owner, extra))
        queued = admitted

        def over() -> None:
            gate.release(rt, queued)
            if release is not None:
                release()

        _track(state, req.id, task, lambda: rt.abort_requests(plan.id), over)
        rt.metrics.requests.labels(ROUTE, "200").inc()
        await respond(send, 200, encode(running))
        return
    if plan.stream:
        streamer = ResponsesStreamer(rt, plan, subs, req, state, owner, extra)
        try:
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
        finally:
            gate.release(rt, admitted)
        return
    ended = [False]
    try:
        work = _collect(rt, plan, subs, req, state, owner, extra, ended)
        await collect(rt, receive, send, subs, work, ROUTE, gone=admitted.gone)
    finally:
        gate.release(rt, admitted)
        _abandoned(state, req, owner, plan, ended[0])


def _track(state: Responses, rid: str, task: asyncio.Task[Any], cancel: Any, release: Any) -> None:
    """A background response this worker runs: cancellable here, or through the store."""
    state.tasks[rid] = task
    state.cancels[rid] = cancel

    def done(_task: asyncio.Task[Any]) -> None:
        state.tasks.pop(rid, None)
        state.cancels.pop(rid, None)
        if release is not None:
            release()
        if not _task.cancelled() and _task.exception() is not None:
            log.error("background response %s: %s", rid, _task.exception())

    task.add_done_callback(done)


async def _agent(app: App, agent: Agent, receive: Any, send: Any, release: Any) -> None:
    """Serve a response with MCP tools: in the background, streamed, or whole."""
    rt = app.runtime
    state: Responses = app.state.responses
    req = agent.req
    if req.background:

        async def quiet(_data: bytes) -> None:
            return None

        task = asyncio.ensure_future(agent.run(quiet))
        _track(state, req.id, task, task.cancel, release)
        running = agent.events.response("in_progress")
        rt.metrics.requests.labels(ROUTE, "200").inc()
        await respond(send, 200, encode(running))
        return

    if req.stream:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})

        async def emit(data: bytes) -> None:
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": True})

    else:

        async def emit(data: bytes) -> None:
            return None

    task = asyncio.ensure_future(agent.run(emit))
    gone = disconnected(receive)
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():  # the client went away
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        gone.cancel()
    if task.cancelled() or task.exception() is not None:
        rt.metrics.requests.labels(ROUTE, "499").inc()
        return
    final = task.result()
    status = "200" if final["status"] != "failed" else "500"
    rt.metrics.requests.labels(ROUTE, status).inc()
    if req.stream:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    else:
        await respond(send, 200, encode(final))


_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


# ---- a kept response ---------------------------------------------------------------------------


async def by_id(app: App, scope: dict, send: Any) -> None:
    """``GET``, ``DELETE`` ``/v1/responses/{id}``, ``POST /v1/responses/{id}/cancel`` and
    ``GET /v1/responses/{id}/input_items``."""
    rt = app.runtime
    state: Responses = app.state.responses
    owner = owner_of(scope)
    rest = scope["path"][len("/v1/responses/") :]
    rid, _, action = rest.partition("/")
    method = scope["method"]
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    try:
        if not rid or action not in ("", "cancel", "input_items"):
            raise NotFound(f"no route {scope['path'][:100]}", 404)
        if not state.keeps:
            raise NotFound(f"Response with id '{rid[:80]}' not found.", 404)
        if action == "cancel":
            if method != "POST":
                raise NotFound("method not allowed", 405)
            body = await _cancel(state, rid, owner)
        elif action == "input_items":
            if method != "GET":
                raise NotFound("method not allowed", 405)
            body = await _input_items(state, rid, owner, query)
        elif method == "GET":
            if query.get("stream", ["false"])[-1].lower() == "true":
                raise ValidationError(
                    "streaming a kept response again is not supported by this server",
                    param="stream",
                )
            body = (await state.read(rid, owner))["response"]
        elif method == "DELETE":
            doc = await state.read(rid, owner)
            if doc["response"]["status"] in ("queued", "in_progress"):
                await _stop(state, rid)
            await (await state.opened()).delete(rid, owner)
            body = {"id": rid, "object": "response", "deleted": True}
        else:
            raise NotFound("method not allowed", 405)
    except TokenwireError as err:
        await send_error(rt.metrics, send, err, BY_ID)
        return
    rt.metrics.requests.labels(BY_ID, "200").inc()
    await respond(send, 200, encode(body))


async def _stop(state: Responses, rid: str) -> None:
    """Ask background response ``rid`` to end: here when this worker runs it, else through
    the store (the worker running it picks the cancel up at its next beat)."""
    cancel = state.cancels.get(rid)
    if cancel is not None:
        cancel()
    else:
        await (await state.opened()).run_cancel(rid)


async def _cancel(state: Responses, rid: str, owner: str) -> dict[str, Any]:
    """Cancel background response ``rid``: its engine requests end, and it ends ``cancelled``
    (one that has ended already is returned as it is)."""
    doc = await state.read(rid, owner)
    if not doc["response"].get("background"):
        raise ValidationError(
            "only responses created with background: true can be cancelled", param=None
        )
    if doc["response"]["status"] not in ("queued", "in_progress"):
        return doc["response"]
    await _stop(state, rid)
    task = state.tasks.get(rid)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _CANCEL_WAIT
    if task is not None:
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(task), _CANCEL_WAIT)
    while loop.time() < deadline:
        doc = await state.read(rid, owner)
        if doc["response"]["status"] not in ("queued", "in_progress"):
            break
        await asyncio.sleep(0.05)
    return doc["response"]


def _query_int(query: dict[str, list[str]], key: str, default: int, low: int, high: int) -> int:
    value = query.get(key, [None])[-1]
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        raise ValidationError(f"{key} must be an integer", param=key) from None
    if not low <= n <= high:
        raise ValidationError(f"{key} must be between {low} and {high}", param=key)
    return n


def _order(query: dict[str, list[str]]) -> bool:
    """``order``: whether newest first (``desc``, the default)."""
    order = query.get("order", ["desc"])[-1]
    if order not in ("asc", "desc"):
        raise ValidationError("order must be 'asc' or 'desc'", param="order")
    return order == "desc"


def page(
    items: list[dict[str, Any]], query: dict[str, list[str]], default_limit: int = 20
) -> dict[str, Any]:
    """A list object of ``items`` (oldest first) as ``after``, ``limit`` and ``order`` ask."""
    limit = _query_int(query, "limit", default_limit, 1, 100)
    if _order(query):
        items = items[::-1]
    after = query.get("after", [None])[-1]
    if after is not None:
        ids = [i.get("id") for i in items]
        if after not in ids:
            raise NotFound(f"Item with id '{after[:80]}' not found.", 404)
        items = items[ids.index(after) + 1 :]
    data = items[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(items) > limit,
    }


async def _input_items(
    state: Responses, rid: str, owner: str, query: dict[str, list[str]]
) -> dict[str, Any]:
    """The items response ``rid`` was given: those of the responses it continues (their input
    and output), then its own input (a response in a conversation: its own input)."""
    doc = await state.read(rid, owner)
    store = await state.opened()
    items: list[dict[str, Any]] = []
    if doc["response"].get("previous_response_id") and not doc["response"].get("conversation"):
        try:
            for link in (await store.chain(rid, owner))[:-1]:
                items += link["input"] + link["response"]["output"]
        except TokenwireError as exc:  # (a response it continues is gone)
            log.warning("input_items of %s: %s", rid, exc)
    return page(items + doc["input"], query)


ROUTES: dict[tuple[str, str], Handler] = {("POST", "/v1/responses"): create}
