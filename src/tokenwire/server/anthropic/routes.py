"""Anthropic's Messages API routes: ``POST /v1/messages`` (streamed as Anthropic's events, or a
whole message) and ``POST /v1/messages/count_tokens``; every error in Anthropic's shape."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenwire.messages.egress import Error, Frame
from tokenwire.messages.errors import ClientDisconnected, TokenwireError
from tokenwire.runtime import Plan, Runtime
from tokenwire.server import limits
from tokenwire.server.anthropic import mcp
from tokenwire.server.anthropic.errors import ANTHROPIC_ERRORS
from tokenwire.server.anthropic.output import (
    MessageEvents,
    content_blocks,
    message_object,
    stop_fields,
    usage,
)
from tokenwire.server.anthropic.request import RENAMES, read_count_tokens, read_messages
from tokenwire.server.as_chat import SplitOutput, count_chat_tokens, parse_as_chat
from tokenwire.server.errors import ErrorDialect
from tokenwire.server.fields import check_model
from tokenwire.server.http import encode, respond, send_error
from tokenwire.server.streaming import Gathered, Streamer, Subs, count_finish, gather, serve_plan

if TYPE_CHECKING:
    from tokenwire.server.app import App, Handler

__all__ = ["DIALECTS", "ROUTES", "count_tokens", "messages"]

ROUTE = "messages"
COUNT_ROUTE = "messages_count_tokens"


def _message_id(plan: Plan) -> str:
    return "msg_" + plan.id


class MessagesStreamer(Streamer):
    """Anthropic's streamed events for one message."""

    dialect = ANTHROPIC_ERRORS

    def __init__(self, rt: Runtime, plan: Plan, subs: Subs) -> None:
        super().__init__(rt, subs)
        self.eos = rt.tokenizer.eos_token_ids
        self.events = MessageEvents(_message_id(plan), plan.model, plan.prompt_tokens)
        self.output = SplitOutput(plan, rt.tokenizer)

    def head(self) -> bytes:
        return self.events.start()

    def feed(self, batch: list[tuple[int, Any]]) -> bytes:
        self.tracker.chunk()
        out = []
        for _, item in batch:
            if isinstance(item, Error):
                out.append(self.error(item.error))
                break
            final = not isinstance(item, Frame)
            out.append(self.events.add(self.output.pieces(item.text, item.token_ids, final=final)))
            if final:
                self.open.clear()
                count_finish(self.rt, item, self.tracker)
                stop = stop_fields(item.finish_reason, self.eos, self.output.called)
                out.append(self.events.finish(stop, item.completion_tokens, item.cached_tokens))
        return b"".join(out)


async def _collect(rt: Runtime, plan: Plan, subs: Subs) -> tuple[int, Any]:
    got = await gather(rt, subs, ANTHROPIC_ERRORS)
    if not isinstance(got, Gathered):
        return got
    done = got.finals[0]
    output = SplitOutput(plan, rt.tokenizer)
    blocks = content_blocks(*output.whole("".join(got.texts[0]), got.ids[0]))
    stop = stop_fields(done.finish_reason, rt.tokenizer.eos_token_ids, output.called)
    use = usage(plan.prompt_tokens, done.completion_tokens, done.cached_tokens)
    return 200, message_object(_message_id(plan), plan.model, blocks, stop, use)


async def messages(app: App, receive: Any, send: Any) -> None:
    """``POST /v1/messages``."""
    rt = app.runtime
    config = app.config

    held: dict[str, Any] = {}

    def plan_of(body: Any) -> Plan:
        req = read_messages(body)
        held["req"] = req
        held["endpoints"] = mcp.endpoints(app, req)
        return parse_as_chat(
            req.chat,
            rt.tokenizer,
            rt.models,
            RENAMES,
            limits=config.limits,
            features=rt.features,
        )

    def streamer(plan: Plan, subs: Subs) -> MessagesStreamer:
        return MessagesStreamer(rt, plan, subs)

    def gathered(plan: Plan, subs: Subs) -> Any:
        return _collect(rt, plan, subs)

    def parse(body: Any) -> Plan:
        plan = plan_of(body)
        if held["endpoints"]:
            raise _ServerTools(plan)  # (the MCP connector's rounds: not one plan to submit)
        return plan

    try:
        await serve_plan(rt, receive, send, ROUTE, parse, streamer, gathered, ANTHROPIC_ERRORS)
    except _ServerTools as tools:
        plan = tools.plan
        await mcp.serve_mcp(
            app, held["req"], plan, held["endpoints"], _message_id(plan), receive, send
        )


class _ServerTools(Exception):
    """A request with ``mcp_servers``, parsed: served by ``mcp.serve_mcp``."""

    def __init__(self, plan: Plan) -> None:
        super().__init__("mcp_servers")
        self.plan = plan


async def count_tokens(app: App, receive: Any, send: Any) -> None:
    """``POST /v1/messages/count_tokens``: the prompt's tokens, rendered as ``/v1/messages``
    renders it."""
    rt = app.runtime

    def count(body: Any) -> dict[str, Any]:
        chat = read_count_tokens(body)
        check_model(chat.get("model"), rt.models)
        return {"input_tokens": count_chat_tokens(chat, rt.tokenizer, RENAMES, rt.features)}

    try:
        answer = await limits.parse_body(receive, count)
    except ClientDisconnected:
        return
    except TokenwireError as err:
        await send_error(rt.metrics, send, err, COUNT_ROUTE, ANTHROPIC_ERRORS)
        return
    rt.metrics.requests.labels(COUNT_ROUTE, "200").inc()
    await respond(send, 200, encode(answer))


ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "/v1/messages"): messages,
    ("POST", "/v1/messages/count_tokens"): count_tokens,
}

#: The paths whose errors are in Anthropic's shape.
DIALECTS: dict[str, ErrorDialect] = {path: ANTHROPIC_ERRORS for _, path in ROUTES}
