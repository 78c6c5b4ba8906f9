"""The OpenAI routes: ``POST /v1/completions`` and ``POST /v1/chat/completions``, and SageMaker's
``POST /invocations`` (which vLLM serves): a chat request when the body has ``messages``, else a
completions request."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenwire.messages.errors import ClientDisconnected, ValidationError
from tokenwire.runtime import Plan
from tokenwire.server import limits
from tokenwire.server.fields import request_id
from tokenwire.server.http import current_scope, header
from tokenwire.server.openai.parse import parse_chat, parse_completion
from tokenwire.server.openai.stream import OpenAIStreamer, collect_openai
from tokenwire.server.streaming import Subs, serve_plan

if TYPE_CHECKING:
    from tokenwire.server.app import App, Handler

__all__ = ["ROUTES", "chat", "completions", "invocations"]


async def completions(app: App, receive: Any, send: Any) -> None:
    """``POST /v1/completions``."""
    await _openai(app, receive, send, "completion")


async def chat(app: App, receive: Any, send: Any) -> None:
    """``POST /v1/chat/completions``."""
    await _openai(app, receive, send, "chat")


async def invocations(app: App, receive: Any, send: Any) -> None:
    """``POST /invocations`` (SageMaker's, as vLLM serves it): the body read once, then served
    as a chat completion when it has ``messages``, else as a completion."""
    try:
        raw = await limits.read_body(receive)
    except ClientDisconnected:
        return
    try:
        body = limits.decode_json(raw)
    except ValidationError:  # (the route it goes to says what is wrong with it)
        body = None
    route = "chat" if isinstance(body, dict) and "messages" in body else "completion"
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    await _openai(app, replay, send, route)


async def _openai(app: App, receive: Any, send: Any, route: str) -> None:
    rt = app.runtime
    config = app.config
    parse = parse_chat if route == "chat" else parse_completion
    eos = rt.tokenizer.eos_token_ids
    header_id = header(current_scope.get(), b"x-request-id")

    def plan_of(body: Any) -> Plan:
        plan = parse(
            body,
            rt.tokenizer,
            rt.models,
            limits=config.limits,
            features=rt.features,
        )
        if header_id is not None:  # vLLM's: the header names the request, over request_id
            plan.id = request_id(header_id, "x-request-id")
        return plan

    def streamer(plan: Plan, subs: Subs) -> OpenAIStreamer:
        return OpenAIStreamer(rt, plan, subs, eos)

    def gathered(plan: Plan, subs: Subs) -> Any:
        return collect_openai(rt, plan, subs, eos)

    await serve_plan(rt, receive, send, route, plan_of, streamer, gathered)


ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "/v1/completions"): completions,
    ("POST", "/v1/chat/completions"): chat,
    ("POST", "/invocations"): invocations,
}
