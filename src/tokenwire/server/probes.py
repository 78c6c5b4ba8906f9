"""Probes and load reports for orchestrators and load balancers.

- ``GET /live``: the process answers (200 while it runs, whatever its engines do).
- ``GET /ready``: 200 when a request sent now would be served or queued (an engine in rotation,
  not shutting down, room in flight or in the waiting queue); else 503 saying why.
- ``GET /get_load`` (SGLang's): per engine, ``{"dp_rank", "num_reqs", "num_waiting_reqs",
  "num_tokens"}``.
- ``GET /v1/loads`` (SGLang's): ``{"timestamp", "version", "dp_rank_count", "loads": [...],
  "aggregate": {...}}``, each load with SGLang's core fields (``num_running_reqs``,
  ``num_waiting_reqs``, ``num_total_reqs``, ``num_used_tokens``, ``num_total_tokens``,
  ``max_total_num_tokens``, ``token_usage``, ``gen_throughput``, ``cache_hit_rate``,
  ``utilization``, ``max_running_requests``); ``?dp_rank=N`` keeps one engine, ``?include=``
  is checked against SGLang's sections (the core one is what an engine behind the EngineCore
  protocol reports), ``?format=prometheus`` gives them as ``sglang_*{dp_rank}`` gauges.

Requests waiting in tokenwire's own queue count among the engines' waiting ones, shared out
evenly (as in ``vllm:num_requests_waiting``).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from tokenwire import __version__
from tokenwire.messages.errors import QueueFullError, TokenwireError, ValidationError
from tokenwire.server.http import current_scope, encode, respond, send_error

if TYPE_CHECKING:
    from tokenwire.runtime import Runtime
    from tokenwire.server.app import App, Handler

__all__ = ["ROUTES", "engine_loads", "readiness"]

#: SGLang's ``/v1/loads`` sections.
_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def readiness(rt: Runtime) -> str | None:
    """Why the server is not ready for a request now (None: it is)."""
    if rt.draining:
        return "the server is shutting down"
    if not rt.engine.alive:
        return "no engine is in rotation"
    adm = rt.admission
    if adm.room() <= 0 and adm.waiting >= adm.max_waiting:
        return (
            f"the server is full: {len(rt.shard)} requests in flight, {adm.waiting} waiting "
            "(--max-concurrent-requests, --max-waiting-requests)"
        )
    return None


def engine_loads(rt: Runtime) -> list[dict[str, Any]]:
    """Each engine's load, SGLang's way (``/v1/loads``' core section)."""
    engine = rt.engine
    stats = getattr(engine, "scheduler_stats", None)
    engines = getattr(engine, "engines", None)
    queued = rt.admission.waiting
    rows: list[dict[str, Any]] = []
    if engines:
        by_rank = {e["rank"]: e for e in engines}
        ranks = sorted(by_rank)
    else:
        by_rank = {}
        ranks = [0]
    cache = rt.fleet_metrics.cache_hits
    for i, rank in enumerate(ranks):
        info = by_rank.get(rank, {})
        if stats is not None:
            s = stats.get(rank, {})
            running = int(s.get("num_running_reqs") or 0)
            waiting = int(s.get("num_waiting_reqs") or 0)
            waiting += int(s.get("num_skipped_waiting_reqs") or 0)
            usage = float(s.get("kv_cache_usage") or 0.0)
        else:
            running = int(getattr(engine, "running", 0) or 0)
            waiting = int(getattr(engine, "waiting", 0) or 0)
            usage = float(getattr(engine, "kv_cache_usage", 0.0) or 0.0)
        waiting += queued // len(ranks) + (1 if i < queued % len(ranks) else 0)
        capacity = int(info.get("kv_capacity_tokens") or 0)
        used = round(usage * capacity)
        prompt, hits = cache.get(rank, (0, 0))
        rows.append(
            {
                "dp_rank": rank,
                "timestamp": time.time(),
                "num_running_reqs": running,
                "num_waiting_reqs": waiting,
                "num_total_reqs": running + waiting,
                "num_used_tokens": used,
                "num_total_tokens": used,
                "max_total_num_tokens": capacity,
                "token_usage": round(usage, 4),
                "gen_throughput": round(rt.fleet_metrics.throughput(rank), 2),
                "cache_hit_rate": round(hits / prompt, 4) if prompt else 0.0,
                "utilization": round(usage, 4),
                "max_running_requests": int(
                    info.get("max_num_seqs") or rt.config.max_concurrent_requests
                ),
            }
        )
    return rows


def _aggregate(loads: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(loads) or 1
    return {
        "total_running_reqs": sum(d["num_running_reqs"] for d in loads),
        "total_waiting_reqs": sum(d["num_waiting_reqs"] for d in loads),
        "total_reqs": sum(d["num_total_reqs"] for d in loads),
        "total_used_tokens": sum(d["num_used_tokens"] for d in loads),
        "total_tokens": sum(d["num_total_tokens"] for d in loads),
        "avg_token_usage": round(sum(d["token_usage"] for d in loads) / n, 4),
        "avg_throughput": round(sum(d["gen_throughput"] for d in loads) / n, 2),
        "avg_utilization": round(sum(d["utilization"] for d in loads) / n, 4),
    }


def _query() -> dict[str, list[str]]:
    scope = current_scope.get() or {}
    return parse_qs(scope.get("query_string", b"").decode("latin-1"))


async def _live(app: App, receive: Any, send: Any) -> None:
    await respond(send, 200, b'{"status":"ok"}')


async def _ready(app: App, receive: Any, send: Any) -> None:
    rt = app.runtime
    why = readiness(rt)
    if why is not None:
        await send_error(rt.metrics, send, QueueFullError(why), "ready")
        return
    body = {
        "status": "ready",
        "engines_in_rotation": sum(1 for e in getattr(rt.engine, "engines", None) or [{}]),
        "requests_in_flight": len(rt.shard),
        "requests_waiting": rt.admission.waiting,
    }
    engines = getattr(rt.engine, "engines", None)
    if engines is not None:
        body["engines_in_rotation"] = sum(1 for e in engines if e["alive"])
    await respond(send, 200, encode(body))


async def _get_load(app: App, receive: Any, send: Any) -> None:
    rows = [
        {
            "dp_rank": d["dp_rank"],
            "num_reqs": d["num_total_reqs"],
            "num_waiting_reqs": d["num_waiting_reqs"],
            "num_tokens": d["num_used_tokens"],
        }
        for d in engine_loads(app.runtime)
    ]
    app.runtime.metrics.requests.labels("get_load", "200").inc()
    await respond(send, 200, encode(rows))


async def _v1_loads(app: App, receive: Any, send: Any) -> None:
    rt = app.runtime
    query = _query()
    try:
        loads = engine_loads(rt)
        rank = query.get("dp_rank", [None])[-1]
        if rank is not None:
            try:
                wanted = int(rank)
            except ValueError:
                raise ValidationError(f"dp_rank must be an integer, got {rank!r:.40}") from None
            loads = [d for d in loads if d["dp_rank"] == wanted]
        include = query.get("include", [None])[-1]
        if include:
            bad = {s.strip() for s in include.split(",")} - _SECTIONS
            if bad:
                raise ValidationError(
                    f"Invalid include sections: {sorted(bad)}. Valid options: {sorted(_SECTIONS)}",
                    param="include",
                )
        fmt = query.get("format", ["json"])[-1]
        if fmt not in ("json", "prometheus"):
            raise ValidationError("format must be json or prometheus", param="format")
    except TokenwireError as err:
        await send_error(rt.metrics, send, err, "loads")
        return
    rt.metrics.requests.labels("loads", "200").inc()
    if fmt == "prometheus":
        lines: list[str] = []
        for field in loads[0] if loads else []:
            if field in ("dp_rank", "timestamp"):
                continue
            lines.append(f"# TYPE sglang_{field} gauge")
            lines += [f'sglang_{field}{{dp_rank="{d["dp_rank"]}"}} {d[field]}' for d in loads]
        body = ("\n".join(lines) + "\n").encode()
        await respond(send, 200, body, [(b"content-type", b"text/plain; version=0.0.4")])
        return
    answer = {
        "timestamp": datetime.now(timezone.utc).isoformat(),
        "version": __version__,
        "dp_rank_count": len(loads),
        "loads": loads,
        "aggregate": _aggregate(loads),
    }
    await respond(send, 200, encode(answer))


ROUTES: dict[tuple[str, str], Handler] = {
    ("GET", "/live"): _live,
    ("GET", "/ready"): _ready,
    ("GET", "/get_load"): _get_load,
    ("GET", "/v1/loads"): _v1_loads,
}
