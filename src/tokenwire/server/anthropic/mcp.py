"""Anthropic's MCP connector on ``/v1/messages`` (``mcp_servers``): each server's tools are listed
and offered to the model beside the request's own; a call of one is an ``mcp_tool_use`` block,
run by the server, its answer an ``mcp_tool_result`` block (``is_error`` when the call failed:
a server that hangs, floods or answers no MCP is such a result, never a failed request), and the
model goes on, up to ``--mcp-max-rounds`` rounds (the last offers no tools). Streamed or not:
the same rounds, the events of each as they come."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tokenwire.messages.egress import Error, Frame
from tokenwire.messages.errors import TokenwireError, ValidationError
from tokenwire.runtime import Plan
from tokenwire.server.anthropic.errors import ANTHROPIC_ERRORS
from tokenwire.server.anthropic.output import (
    MessageEvents,
    content_blocks,
    message_object,
    stop_fields,
    usage,
)
from tokenwire.server.anthropic.request import RENAMES, McpServer, MessagesRequest
from tokenwire.server.as_chat import SplitOutput, parse_as_chat
from tokenwire.server.http import SSE, current_scope, disconnected, encode, respond, send_error
from tokenwire.server.mcp import McpEndpoint, McpFailure, call_tool, list_tools, missing_sdk
from tokenwire.server.security import client_key
from tokenwire.server.streaming import Tracker, count_finish

if TYPE_CHECKING:
    from tokenwire.server.app import App

__all__ = ["endpoints", "serve_mcp"]

ROUTE = "messages"
Emit = Callable[[bytes], Awaitable[None]]


def endpoints(app: App, req: MessagesRequest) -> list[McpEndpoint]:
    """The MCP servers of ``req`` (a 400 for one the server cannot use)."""
    if not req.mcp_servers:
        return []
    missing = missing_sdk()
    if missing is not None:
        raise ValidationError(missing, param="mcp_servers")
    servers = app.state.responses.tool_servers
    out = []
    for k, server in enumerate(req.mcp_servers):
        try:
            out.append(
                servers.endpoint(server.name, server.url, server.headers, f"mcp_servers[{k}]")
            )
        except ValidationError as err:
            raise ValidationError(
                err.detail.replace(".server_url", ".url"), param="mcp_servers"
            ) from None
    return out


async def _offered(
    app: App, req: MessagesRequest, eps: list[McpEndpoint]
) -> dict[str, tuple[McpServer, McpEndpoint, dict[str, Any]]]:
    """Each server's tools (a server that cannot be listed offers none)."""
    bounds = app.state.responses.mcp_bounds
    taken = {t["function"]["name"] for t in req.chat.get("tools") or ()}
    offered: dict[str, tuple[McpServer, McpEndpoint, dict[str, Any]]] = {}
    listings = await asyncio.gather(*(list_tools(ep, bounds) for ep in eps), return_exceptions=True)
    for server, ep, tools in zip(req.mcp_servers, eps, listings):
        if isinstance(tools, BaseException):
            if not isinstance(tools, McpFailure):
                raise tools
            continue
        for tool in tools:
            name = tool["name"]
            if name in taken or name in offered:
                continue
            if server.allowed_tools is not None and name not in server.allowed_tools:
                continue
            offered[name] = (server, ep, tool)
    return offered


class _Run:
    """One Messages request with MCP servers, run round after round."""

    def __init__(self, app: App, req: MessagesRequest, message_id: str, model: str, eps) -> None:
        self.app = app
        self.rt = app.runtime
        self.req = req
        self.eps = eps
        self.id = message_id
        self.model = model
        self.blocks: list[dict[str, Any]] = []
        self.usage = [0, 0, 0]  # input, output, cached
        self.subs: list = []

    def _plan(self, messages: list[dict[str, Any]], tools: list, last: bool) -> Plan:
        chat = {**self.req.chat, "messages": messages}
        if tools:
            chat["tools"] = tools
        if last and tools:
            chat["tool_choice"] = "none"
        elif messages is not self.req.chat["messages"] and chat.get("tool_choice") not in (
            None,
            "none",
        ):
            # (a forced choice holds for the first round; then the model chooses, on a server
            # that parses the calls it makes of its own, else it answers)
            features = self.rt.features
            auto = features.enable_auto_tool_choice and features.tool_call_parser is not None
            chat["tool_choice"] = "auto" if auto else "none"
        config = self.app.config
        return parse_as_chat(
            chat,
            self.rt.tokenizer,
            self.rt.models,
            RENAMES,
            limits=config.limits,
            features=self.rt.features,
        )

    async def run(self, emit: Emit, events: MessageEvents) -> tuple[str | None, str | None]:
        offered = await _offered(self.app, self.req, self.eps)
        events.mcp = {name: o[0].name for name, o in offered.items()}
        tools = list(self.req.chat.get("tools") or [])
        for name, (_, _, tool) in offered.items():
            function = {"name": name, "parameters": tool.get("input_schema")}
            if tool.get("description"):
                function["description"] = tool["description"]
            tools.append({"type": "function", "function": function})
        messages = self.req.chat["messages"]
        most = max(1, self.app.state.responses.config.mcp_max_rounds)
        bounds = self.app.state.responses.mcp_bounds
        stop: tuple[str | None, str | None] = ("end_turn", None)
        for round_ in range(most):
            plan = self._plan(messages, tools, round_ == most - 1)
            if round_ == 0:
                events.input_tokens = plan.prompt_tokens  # (the tools offered included)
                await emit(events.start())
            await self.rt.prepare_media(plan)  # (image blocks: processed in the media workers)
            await self.rt.check_grammar(plan, client_key(current_scope.get()))
            self.subs = await self.rt.admit(plan)  # (each round waits in the queue)
            output = SplitOutput(plan, self.rt.tokenizer)
            whole = SplitOutput(plan, self.rt.tokenizer)
            texts, ids = [], []
            tracker = Tracker.of(self.rt, self.subs)
            sink = self.subs[0][2]
            done = None
            while done is None:
                for item in await sink.take():
                    if isinstance(item, Error):
                        raise item.error
                    tracker.chunk()
                    texts.append(item.text)
                    ids.extend(item.token_ids)
                    final = not isinstance(item, Frame)
                    await emit(events.add(output.pieces(item.text, item.token_ids, final=final)))
                    if final:
                        count_finish(self.rt, item, tracker)
                        done = item
            self.subs = []
            await emit(events.close())
            self.usage[0] += plan.prompt_tokens
            self.usage[1] += done.completion_tokens
            self.usage[2] += done.cached_tokens
            reasoning, text, calls = whole.whole("".join(texts), ids)
            blocks = content_blocks(reasoning, text, calls)
            for block in blocks:
                if block["type"] == "tool_use" and block["name"] in offered:
                    block["type"] = "mcp_tool_use"
                    block["server_name"] = offered[block["name"]][0].name
            self.blocks += blocks
            stop = stop_fields(done.finish_reason, self.rt.tokenizer.eos_token_ids, whole.called)
            runs = [b for b in blocks if b["type"] == "mcp_tool_use"]
            if stop[0] != "tool_use" or not runs:
                break
            results = []
            for use in runs:
                _, ep, _ = offered[use["name"]]
                try:
                    answer = await call_tool(ep, use["name"], use["input"], bounds)
                    result = {
                        "type": "mcp_tool_result",
                        "tool_use_id": use["id"],
                        "is_error": False,
                    }
                    result["content"] = [{"type": "text", "text": answer}]
                except McpFailure as failure:
                    result = {"type": "mcp_tool_result", "tool_use_id": use["id"], "is_error": True}
                    result["content"] = [{"type": "text", "text": failure.message}]
                results.append(result)
                self.blocks.append(result)
                await emit(events.block(result))
            if any(b["type"] == "tool_use" for b in blocks):
                break  # (a client tool: the client runs it, then goes on)
            call_msgs = {
                "role": "assistant",
                "content": text if text.strip() else "",
                "tool_calls": [
                    {
                        "id": use["id"],
                        "type": "function",
                        "function": {"name": use["name"], "arguments": use["input"]},
                    }
                    for use in runs
                ],
            }
            if reasoning:
                call_msgs["reasoning_content"] = reasoning
            tool_msgs = [
                {
                    "role": "tool",
                    "tool_call_id": r["tool_use_id"],
                    "content": r["content"][0]["text"],
                }
                for r in results
            ]
            messages = [*messages, call_msgs, *tool_msgs]
        return stop

    def abort(self) -> None:
        for rid, _, sink in self.subs:
            self.rt.abort(rid, sink)
        self.subs = []

    def message(self, stop: tuple[str | None, str | None]) -> dict[str, Any]:
        use = usage(self.usage[0], self.usage[1], self.usage[2])
        return message_object(self.id, self.model, self.blocks, stop, use)


async def serve_mcp(
    app: App,
    req: MessagesRequest,
    plan: Plan,
    eps: list[McpEndpoint],
    message_id: str,
    receive: Any,
    send: Any,
) -> None:
    """``POST /v1/messages`` with ``mcp_servers``."""
    rt = app.runtime
    run = _Run(app, req, message_id, plan.model, eps)
    events = MessageEvents(message_id, plan.model, plan.prompt_tokens)
    started = False

    async def emit(data: bytes) -> None:
        nonlocal started
        if not req.stream or not data:
            return
        if not started:
            started = True
            await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": data, "more_body": True})

    async def work() -> tuple[str | None, str | None]:
        try:
            return await run.run(emit, events)
        except BaseException:
            run.abort()
            raise

    task = asyncio.ensure_future(work())
    gone = disconnected(receive)
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        gone.cancel()
    if task.cancelled():
        rt.metrics.requests.labels(ROUTE, "499").inc()
        return
    err = task.exception()
    if err is not None:
        if not isinstance(err, TokenwireError):
            raise err
        if started:
            await send({"type": "http.response.body", "body": ANTHROPIC_ERRORS.stream_end(err)})
            rt.metrics.requests.labels(ROUTE, str(err.status)).inc()
        else:
            await send_error(rt.metrics, send, err, ROUTE, ANTHROPIC_ERRORS)
        return
    stop = task.result()
    rt.metrics.requests.labels(ROUTE, "200").inc()
    if req.stream:
        use = run.usage
        events.input_tokens = use[0]  # (every round's, as the whole message counts them)
        data = events.finish(stop, use[1], use[2])
        await emit(data)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    else:
        await respond(send, 200, encode(run.message(stop)))
