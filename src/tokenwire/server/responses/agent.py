"""A response whose tools the server runs itself (``mcp`` tools): rounds of generation and MCP
calls until the model answers without calling one.

1. Each MCP server's tools are listed (an ``mcp_list_tools`` item, unless the context already
   has one for that server label, as OpenAI's API reuses it) and offered to the model beside
   the request's function tools.
2. Calls the client approved (``mcp_approval_response`` inputs) are run first.
3. Each round generates; the model's calls of MCP tools become ``mcp_call`` items, run at the
   end of the round (their output, or their error, is what the next round sees), or
   ``mcp_approval_request`` items when the tool needs the client's approval (the response
   ends there, as it does at a call of a function tool: the client runs those).
4. Bounded: ``max_tool_calls`` calls at most, ``--mcp-max-rounds`` rounds (the last offers no
   tools: the model answers); a forced ``tool_choice`` holds for the first round only.

Streamed or not, one ``ResponseEvents`` makes the items (a whole response drops the events);
every engine request of a round ends with it, and a client that goes away ends the response."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenwire.messages.egress import Error, Frame
from tokenwire.messages.errors import InternalError, TokenwireError, ValidationError
from tokenwire.runtime import Plan, Runtime
from tokenwire.server.as_chat import SplitOutput, parse_as_chat
from tokenwire.server.errors import error_body
from tokenwire.server.guard import GENERIC_ERROR
from tokenwire.server.http import current_scope
from tokenwire.server.mcp import McpEndpoint, McpFailure, call_tool, list_tools
from tokenwire.server.responses.output import (
    ResponseEvents,
    error_object,
    mcp_item,
    status_of,
    usage,
)
from tokenwire.server.responses.request import (
    RENAMES,
    McpTool,
    ResponsesRequest,
    input_messages,
    item_id,
)
from tokenwire.server.security import client_key
from tokenwire.server.streaming import Subs, Tracker, count_finish

if TYPE_CHECKING:
    from tokenwire.server.app import App
    from tokenwire.server.responses.state import Responses

__all__ = ["Agent", "plan_within_context"]

log = logging.getLogger("tokenwire.server")

Emit = Callable[[bytes], Awaitable[None]]


def _context_error(err: TokenwireError) -> bool:
    return isinstance(err, ValidationError) and "maximum context length" in err.detail


def plan_within_context(
    parse: Callable[[list[dict[str, Any]]], Plan],
    head: list[dict[str, Any]],
    items: list[dict[str, Any]],
    truncate: bool,
) -> tuple[Plan, int]:
    """The plan of messages ``head`` (the instructions) + ``items``' (``parse`` makes it); with
    ``truncate`` (``truncation: "auto"``), when they do not fit the context, the fewest of
    the oldest items dropped (whole turns: cut only before a user message) that make them fit.
    Returns the plan and how many items were dropped."""
    try:
        return parse(head + input_messages(items, "context")), 0
    except TokenwireError as err:
        if not (truncate and _context_error(err)):
            raise
        first = err
    cuts = [
        k
        for k, item in enumerate(items)
        if k > 0 and item.get("type") == "message" and item.get("role") == "user"
    ]
    lo, hi, best = 0, len(cuts) - 1, None
    while lo <= hi:  # (the fewest dropped that fit: fitting is monotone in the cut)
        mid = (lo + hi) // 2
        try:
            plan = parse(head + input_messages(items[cuts[mid] :], "context"))
        except TokenwireError as err:
            if not _context_error(err):
                raise
            lo = mid + 1
            continue
        best = (plan, cuts[mid])
        hi = mid - 1
    if best is None:
        raise first
    return best


@dataclass
class _Offered:
    """An MCP tool offered to the model."""

    spec: McpTool
    endpoint: McpEndpoint
    tool: dict[str, Any]


class Agent:
    """One response with MCP tools, run to its end."""

    def __init__(
        self,
        app: App,
        req: ResponsesRequest,
        owner: str,
        endpoints: list[McpEndpoint],
        model: str,
        created: int,
    ) -> None:
        self.rt: Runtime = app.runtime
        self.config = app.config
        self.state: Responses = app.state.responses
        self.req = req
        self.owner = owner
        self.endpoints = endpoints
        #: Who the request is from (grammar compiles take turns by client)
        self.client = client_key(current_scope.get())
        self.events = ResponseEvents(req, model, created)
        self.subs: Subs = []
        self.usage = [0, 0, 0, 0]  # input, output, reasoning, cached tokens
        self.calls = 0

    # ---- the response --------------------------------------------------------------------------

    async def run(self, emit: Emit) -> dict[str, Any]:
        """Run the response, ``emit``-ting its events; its final object (kept when stored)."""
        events = self.events
        try:
            await emit(events.start())
            offered = await self._list(emit)
            events.mcp = {
                name: (o.spec.server_label, o.spec.needs_approval(name))
                for name, o in offered.items()
            }
            await self._approved(offered, emit)
            status, incomplete = await self._rounds(offered, emit)
            final = events.response(
                status, output=events.items, usage=self._usage(), incomplete=incomplete
            )
            await emit(self._finish(status, incomplete=incomplete))
        except asyncio.CancelledError:
            self._abort()
            final = events.response("cancelled", output=events.items, usage=self._usage())
            self.state.end(self.req, self.owner, final)
            raise
        except TokenwireError as err:
            self._abort()
            final, data = self._failed(err)
            await emit(data)
        except Exception:
            self._abort()
            log.exception("response %s failed", self.req.id)
            final, data = self._failed(InternalError(GENERIC_ERROR))
            await emit(data)
        self.state.end(self.req, self.owner, final)
        return final

    def _failed(self, err: TokenwireError) -> tuple[dict[str, Any], bytes]:
        error = error_object(err.status, error_body(err)["error"]["message"])
        data = self.events.finish("failed", error=error)
        final = self.events.response("failed", output=self.events.items, error=error)
        return final, data

    def _finish(self, status: str, **fields: Any) -> bytes:
        return self.events.finish(status, usage=self._usage(), **fields)

    def _usage(self) -> dict[str, Any]:
        return usage(*self.usage)

    def _abort(self) -> None:
        for rid, _, sink in self.subs:
            self.rt.abort(rid, sink)
        self.subs = []

    # ---- MCP -----------------------------------------------------------------------------------

    async def _list(self, emit: Emit) -> dict[str, _Offered]:
        """Each MCP server's tools (listed now, or as the context lists them), those offered."""
        req = self.req
        known = {
            item.get("server_label"): item
            for item in req.context_items + req.input_items
            if item.get("type") == "mcp_list_tools" and not item.get("error")
        }
        functions = {t["function"]["name"] for t in req.chat.get("tools") or ()}
        offered: dict[str, _Offered] = {}
        for spec, endpoint in zip(req.mcp, self.endpoints):
            listed = known.get(spec.server_label)
            if listed is not None:
                tools = listed.get("tools") or []
            else:
                item = {
                    "id": item_id("mcp_list_tools"),
                    "type": "mcp_list_tools",
                    "server_label": spec.server_label,
                    "tools": [],
                }
                index, data = self.events.added(item)
                await emit(data)
                try:
                    tools = await list_tools(endpoint, self.state.mcp_bounds)
                    await emit(self.events.done(index, tools=tools, error=None))
                except McpFailure as failure:
                    tools = []
                    await emit(self.events.done(index, error=failure.message))
            for tool in tools:
                name = tool.get("name")
                if not isinstance(name, str) or name in functions or name in offered:
                    continue  # (a name already taken keeps its first owner)
                if spec.allowed_tools is not None and name not in spec.allowed_tools:
                    continue
                offered[name] = _Offered(spec, endpoint, tool)
        return offered

    async def _call(self, offered: _Offered, index: int, emit: Emit) -> None:
        """Run the call at output ``index`` and end its item with its output or error."""
        item = self.events.items[index]
        self.calls += 1
        try:
            arguments = json.loads(item["arguments"] or "{}")
            if not isinstance(arguments, dict):
                raise ValueError
        except ValueError:
            error = {
                "type": "mcp_protocol_error",
                "code": -32602,
                "message": "the model's arguments are not a JSON object",
            }
            await emit(self.events.done(index, error=error))
            return
        try:
            output = await call_tool(
                offered.endpoint, item["name"], arguments, self.state.mcp_bounds
            )
        except McpFailure as failure:
            await emit(self.events.done(index, error=failure.error))
            return
        await emit(self.events.done(index, output=output, error=None))

    async def _approved(self, offered: dict[str, _Offered], emit: Emit) -> None:
        """Run the calls the client approved (``mcp_approval_response`` inputs) first."""
        req = self.req
        every = req.context_items + req.input_items
        asked = {i.get("id"): i for i in every if i.get("type") == "mcp_approval_request"}
        ran = {
            i.get("approval_request_id")
            for i in every
            if i.get("type") == "mcp_call" and i.get("approval_request_id")
        }
        for item in req.input_items:
            if item.get("type") != "mcp_approval_response" or not item.get("approve"):
                continue
            rid = item.get("approval_request_id")
            request = asked.get(rid)
            if request is None or rid in ran:
                continue
            ran.add(rid)
            tool = offered.get(request.get("name"))
            call = mcp_item(
                "mcp_call",
                request.get("server_label", ""),
                request.get("name", ""),
                request.get("arguments", ""),
            )
            call["approval_request_id"] = rid
            call["status"] = "calling"
            index, data = self.events.added(call)
            await emit(data)
            if tool is None or tool.spec.server_label != request.get("server_label"):
                error = {
                    "type": "mcp_protocol_error",
                    "code": -32601,
                    "message": f"tool {str(request.get('name'))[:60]!r} is not offered by "
                    f"{str(request.get('server_label'))[:60]!r} in this request",
                }
                await emit(self.events.done(index, error=error))
                continue
            await self._call(tool, index, emit)

    # ---- rounds --------------------------------------------------------------------------------

    def _chat(self, offered: dict[str, _Offered], first: bool, tools_left: bool) -> dict[str, Any]:
        req = self.req
        chat = dict(req.chat)
        tools = list(req.chat.get("tools") or [])
        for name, o in offered.items():
            function: dict[str, Any] = {"name": name, "parameters": o.tool.get("input_schema")}
            if o.tool.get("description"):
                function["description"] = o.tool["description"]
            tools.append({"type": "function", "function": function})
        if tools:
            chat["tools"] = tools
        else:
            chat.pop("tool_choice", None)  # (no server offered a tool: nothing to choose)
            return chat
        features = self.rt.features
        auto = features.enable_auto_tool_choice and features.tool_call_parser is not None
        if not tools_left:
            chat["tool_choice"] = "none"
        elif not first and chat.get("tool_choice") not in (None, "none"):
            # A forced choice holds for the first round; then the model chooses, on a server
            # that parses the calls it makes of its own (else it answers).
            chat["tool_choice"] = "auto" if auto else "none"
        return chat

    def _plan(self, chat: dict[str, Any]) -> Plan:
        req = self.req
        head = [{"role": "system", "content": req.instructions}] if req.instructions else []
        items = req.context_items + req.input_items + self.events.items

        def parse(messages: list[dict[str, Any]]) -> Plan:
            return parse_as_chat(
                {**chat, "messages": messages},
                self.rt.tokenizer,
                self.rt.models,
                RENAMES,
                limits=self.config.limits,
                features=self.rt.features,
            )

        plan, dropped = plan_within_context(parse, head, items, req.truncate)
        if dropped:
            self.events.extra["truncated_items"] = dropped
        return plan

    async def _rounds(
        self, offered: dict[str, _Offered], emit: Emit
    ) -> tuple[str, dict[str, Any] | None]:
        req = self.req
        most_rounds = max(1, self.state.config.mcp_max_rounds)
        most_calls = req.max_tool_calls
        status, incomplete = "completed", None
        for round_ in range(most_rounds):
            left = round_ < most_rounds - 1 and (most_calls is None or self.calls < most_calls)
            plan = self._plan(self._chat(offered, round_ == 0, left))
            await self.rt.prepare_media(plan)  # (input_image: processed in the media workers)
            await self.rt.check_grammar(plan, self.client)
            start = len(self.events.items)
            self.subs = await self.rt.admit(plan)  # (each round waits in the queue)
            done, _ = await self._generate(plan, emit)
            self.subs = []
            status, incomplete = status_of(done.finish_reason)
            await emit(self.events.close("completed" if status == "completed" else "incomplete"))
            new = self.events.items[start:]
            if status != "completed":
                return status, incomplete
            calls = [
                k + start
                for k, i in enumerate(new)
                if i["type"] == "mcp_call" and i.get("status") == "calling"
            ]
            waiting = any(i["type"] in ("mcp_approval_request", "function_call") for i in new)
            if not calls:
                return status, incomplete
            for index in calls:
                name = self.events.items[index]["name"]
                if most_calls is not None and self.calls >= most_calls:
                    error = {
                        "type": "mcp_protocol_error",
                        "code": -32000,
                        "message": f"max_tool_calls ({most_calls}) reached",
                    }
                    await emit(self.events.done(index, error=error))
                    continue
                await self._call(offered[name], index, emit)
            if waiting:  # (the client approves, or runs its functions, then goes on)
                return status, incomplete
        return status, incomplete

    async def _generate(self, plan: Plan, emit: Emit) -> tuple[Any, SplitOutput]:
        """One round's output, as events; its final item (an engine error raises)."""
        rt = self.rt
        output = SplitOutput(plan, rt.tokenizer)
        tracker = Tracker.of(rt, self.subs)
        sink = self.subs[0][2]
        while True:
            for item in await sink.take():
                if isinstance(item, Error):
                    raise item.error
                tracker.chunk()
                final = not isinstance(item, Frame)
                data = self.events.add(output.pieces(item.text, item.token_ids, final=final))
                if data:
                    await emit(data)
                if final:
                    count_finish(rt, item, tracker)
                    self.usage[0] += plan.prompt_tokens
                    self.usage[1] += item.completion_tokens
                    self.usage[2] += output.reasoning_tokens(item.reasoning_tokens)
                    self.usage[3] += item.cached_tokens
                    return item, output
