"""The OpenAI routes: ``POST /v1/completions`` and ``POST /v1/chat/completions``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenwire.runtime import Plan
from tokenwire.server.fields import request_id
from tokenwire.server.http import current_scope, header
from tokenwire.server.openai.parse import parse_chat, parse_completion
from tokenwire.server.openai.stream import OpenAIStreamer, collect_openai
from tokenwire.server.streaming import Subs, serve_plan

if TYPE_CHECKING:
    from tokenwire.server.app import App, Handler

__all__ = ["ROUTES", "chat", "completions"]


async def completions(app: App, receive: Any, send: Any) -> None:
    """``POST /v1/completions``."""
    await _openai(app, receive, send, "completion")


async def chat(app: App, receive: Any, send: Any) -> None:
    """``POST /v1/chat/completions``."""
    await _openai(app, receive, send, "chat")


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
}
