"""Admitting a generation request: its key's priority and quotas (``quotas``), then a place in
the runtime's waiting queue (``runtime.admission``), its client's disconnect watched meanwhile.

A streamed request that waits longer than ``--sse-keep-alive-interval`` for its place has its
response started (200, with its ``x-ratelimit-*`` headers) and is kept alive while it waits; if
it is then refused (the queue timed out, the engines went away), its stream ends with the error
event of its API instead of a status. Every answer to a key with quotas carries its
``x-ratelimit-*`` headers.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tokenwire.messages.errors import ClientDisconnected, TokenwireError
from tokenwire.runtime import Plan, Runtime
from tokenwire.server.errors import ErrorDialect
from tokenwire.server.guard import passing
from tokenwire.server.http import SSE, current_scope, disconnected, send_error
from tokenwire.server.keys import KeyRing
from tokenwire.server.quotas import Quotas, Ticket
from tokenwire.server.security import ApiKey, request_key

__all__ = ["GATE_SCOPE", "Admitted", "Gate", "admit", "release"]

#: The ASGI scope entry that holds the server's ``Gate``.
GATE_SCOPE = "tokenwire.gate"


@dataclass
class _KeyCounts:
    requests: dict[str, int] = field(default_factory=dict)
    prompt: int = 0
    generation: int = 0
    in_flight: int = 0


class Gate:
    """The server's keys, quotas and keep-alive setting, and the per-key metrics:
    ``tokenwire_api_key_requests_total{key,status}``, ``tokenwire_api_key_tokens_total{key,
    kind}`` (``prompt``, ``generation``), ``tokenwire_api_key_requests_in_flight{key}`` and
    ``tokenwire_api_key_rate_limited_total{key,quota}``."""

    def __init__(self, keys: KeyRing, registry: CollectorRegistry, keep_alive: float = 0.0) -> None:
        self.keys = keys
        self.quotas = Quotas(keys)
        self.keep_alive = keep_alive
        self._counts: dict[str, _KeyCounts] = {}
        registry.register(self)

    def _of(self, key: ApiKey) -> _KeyCounts:
        c = self._counts.get(key.name)
        if c is None:
            c = self._counts[key.name] = _KeyCounts()
        return c

    def answered(self, key: ApiKey, status: int) -> None:
        """A request with ``key`` was answered with ``status``."""
        requests = self._of(key).requests
        requests[str(status)] = requests.get(str(status), 0) + 1

    def enter(self, key: ApiKey | None, plan: Plan) -> Ticket | None:
        """Apply ``key``'s priority to ``plan``, take its quotas (``RateLimitError``), count its
        prompt: the ticket of a key with quotas."""
        if key is None:
            return None
        limits = self.quotas.limits(key)
        if limits.priority is not None:
            plan.priority = limits.priority + max(0, plan.priority)
        ticket = self.quotas.admit(key, plan.prompt_tokens) if limits.limited else None
        counts = self._of(key)
        counts.prompt += plan.prompt_tokens
        counts.in_flight += 1
        return ticket

    def on_finish(self, key: ApiKey | None, ticket: Ticket | None) -> Any:
        """The callback counting each finished choice's output (and charging its quota)."""
        if key is None:
            return None
        counts = self._of(key)

        def finished(done: Any) -> None:
            counts.generation += getattr(done, "completion_tokens", 0)
            if ticket is not None:
                ticket.charge(done)

        return finished

    def left(self, key: ApiKey | None) -> None:
        if key is not None:
            self._of(key).in_flight -= 1

    def collect(self) -> Any:
        requests = CounterMetricFamily(
            "tokenwire_api_key_requests",
            "Requests by API key name and status",
            labels=["key", "status"],
        )
        tokens = CounterMetricFamily(
            "tokenwire_api_key_tokens",
            "Prompt and generation tokens by API key name",
            labels=["key", "kind"],
        )
        in_flight = GaugeMetricFamily(
            "tokenwire_api_key_requests_in_flight",
            "Generation requests in flight by API key name",
            labels=["key"],
        )
        for name, c in sorted(self._counts.items()):
            for status, n in sorted(c.requests.items()):
                requests.add_metric([name, status], float(n))
            tokens.add_metric([name, "prompt"], float(c.prompt))
            tokens.add_metric([name, "generation"], float(c.generation))
            in_flight.add_metric([name], float(c.in_flight))
        limited = CounterMetricFamily(
            "tokenwire_api_key_rate_limited",
            "Requests refused by an API key's quota (requests, tokens, concurrent_requests)",
            labels=["key", "quota"],
        )
        for (name, quota), n in sorted(self.quotas.refused.items()):
            limited.add_metric([name, quota], float(n))
        yield requests
        yield tokens
        yield in_flight
        yield limited

    def describe(self) -> list:
        return []


@dataclass
class Admitted:
    """An admitted request: its choices, the ``send`` its response goes through (with its
    rate-limit headers), its client's disconnect, whether its stream already started."""

    subs: list[Any]
    send: Any
    gone: asyncio.Future[None]
    started: bool = False
    keep_alive: float = 0.0
    ticket: Ticket | None = None
    key: ApiKey | None = None
    gate: Gate | None = None


def _with_headers(send: Any, headers: list[tuple[bytes, bytes]]) -> Any:
    if not headers:
        return send

    async def adding(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *headers]}
        await send(message)

    return passing(adding, send)


async def admit(
    rt: Runtime, plan: Plan, receive: Any, send: Any, route: str, dialect: ErrorDialect
) -> Admitted | None:
    """Admit ``plan`` (see the module docstring); None when the client was answered already
    (refused, or gone)."""
    scope = current_scope.get() or {}
    gate: Gate | None = scope.get(GATE_SCOPE)
    key = request_key(scope)
    ticket = None
    try:
        if gate is not None:
            ticket = gate.enter(key, plan)
    except TokenwireError as err:
        await send_error(rt.metrics, send, err, route, dialect)
        return None
    headers = ticket.headers() if ticket is not None else []
    send = _with_headers(send, headers)
    gone = disconnected(receive)
    interval = gate.keep_alive if gate is not None else 0.0
    on_finish = gate.on_finish(key, ticket) if gate is not None else None
    started = False
    try:
        if not (plan.stream and interval > 0):
            # (awaited in this task: a task of its own would cost the submit a turn of the loop)
            subs = await rt.admit(plan, gone, on_finish)
        else:
            waiting = asyncio.ensure_future(rt.admit(plan, gone, on_finish))
            try:
                while True:
                    done, _ = await asyncio.wait({waiting}, timeout=interval)
                    if done:
                        break
                    if not started:
                        await send({"type": "http.response.start", "status": 200, "headers": SSE})
                        started = True
                    ping = dialect.keep_alive
                    await send({"type": "http.response.body", "body": ping, "more_body": True})
                subs = await waiting
            finally:
                if not waiting.done():
                    waiting.cancel()
                    with contextlib.suppress(BaseException):
                        await waiting
    except ClientDisconnected:
        _leave(gate, key, ticket, gone)
        return None
    except TokenwireError as err:
        _leave(gate, key, ticket, gone)
        if started:
            rt.metrics.requests.labels(route, str(err.status)).inc()
            rt.metrics.request_errors.labels(err.error_type).inc()
            await send(
                {"type": "http.response.body", "body": dialect.stream_end(err), "more_body": False}
            )
        else:
            await send_error(rt.metrics, send, err, route, dialect)
        return None
    except BaseException:
        _leave(gate, key, ticket, gone)
        raise
    return Admitted(subs, send, gone, started, interval, ticket, key, gate)


def _leave(gate: Gate | None, key: ApiKey | None, ticket: Ticket | None, gone: Any) -> None:
    if ticket is not None:
        ticket.close()
    if gate is not None:
        gate.left(key)
    gone.cancel()


def release(rt: Runtime, admitted: Admitted) -> None:
    """The response is over: the key's place at once back, no more usage counted."""
    rt.forget_finish(admitted.subs)
    _leave(admitted.gate, admitted.key, admitted.ticket, admitted.gone)
