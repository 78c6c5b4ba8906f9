"""The routes RL stacks and operators drive engines through, relayed to the engines as their own
utility calls (vLLM's EngineCore ``UTILITY`` messages): vLLM's dev-mode routes
(``VLLM_SERVER_DEV_MODE=1``: ``/reset_prefix_cache``, ``/sleep``, ``/wake_up``, ``/is_sleeping``,
``/pause``, ``/resume``, ``/is_paused``, ``/collective_rpc``), under vLLM's names and answers, and
SGLang's ``/flush_cache`` (always served). An engine without utility calls (the synthetic one)
answers 501."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from tokenwire.messages.errors import ClientDisconnected, TokenwireError, ValidationError
from tokenwire.server.http import current_scope, encode, read_json, respond, send_error

if TYPE_CHECKING:
    from tokenwire.server.app import App, Handler

__all__ = ["DEV_ROUTES", "ROUTES", "EngineControlError", "Unsupported"]

log = logging.getLogger("tokenwire.server")

#: vLLM's pause modes.
PAUSE_MODES = ("abort", "wait", "keep")


class Unsupported(TokenwireError):
    """The engine has no such control (501)."""

    status = 501
    error_type = "not_implemented"
    prefix = "not implemented"


class EngineControlError(TokenwireError):
    """The engine refused or failed a control call (500, its message)."""

    status = 500
    error_type = "engine_error"
    prefix = "engine"


def _query(name: str, default: Any, kind: Callable[[str], Any]) -> Any:
    scope = current_scope.get() or {}
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    if not values:
        return default
    try:
        return kind(values[-1])
    except ValueError:
        raise ValidationError(f"{name}: bad value {values[-1]!r:.40}", param=name) from None


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise ValueError(text)


def _tags() -> list[str] | None:
    scope = current_scope.get() or {}
    tags = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("tags")
    return tags or None


async def _call(app: App, method: str, *args: Any) -> list[Any]:
    """``method`` on every engine (vLLM's ``call_utility_all``); their results."""
    engine = app.runtime.engine
    call_all = getattr(engine, "call_all", None)
    if call_all is None:
        raise Unsupported(f"this server's engine ({type(engine).__name__}) has no {method}")
    try:
        return list(await call_all(method, *args))
    except TokenwireError:
        raise
    except Exception as exc:  # the engine's failure message
        raise EngineControlError(str(exc)) from None


def _route(name: str, answer: Callable[[App, Any], Awaitable[Any]], *, body: bool = False) -> Any:
    async def handler(app: App, receive: Any, send: Any) -> None:
        try:
            data = await read_json(receive) if body else None
            out = await answer(app, data)
        except ClientDisconnected:
            return
        except TokenwireError as err:
            await send_error(app.runtime.metrics, send, err, name)
            return
        app.runtime.metrics.requests.labels(name, "200").inc()
        if isinstance(out, bytes):
            await respond(send, 200, out, [(b"content-type", b"text/plain; charset=utf-8")])
        else:
            await respond(send, 200, encode(out))

    return handler


async def _reset_prefix_cache(app: App, _: Any) -> dict[str, Any]:
    running = _query("reset_running_requests", False, _bool)
    external = _query("reset_external", False, _bool)
    log.info("resetting the engines' prefix caches")
    return {"success": all(await _call(app, "reset_prefix_cache", running, external))}


async def _sleep(app: App, _: Any) -> dict[str, Any]:
    level = _query("level", 1, int)
    mode = _query("mode", "abort", str)
    if not 0 <= level <= 2:
        raise ValidationError("level must be 0, 1 or 2", param="level")
    if mode not in PAUSE_MODES:
        raise ValidationError(f"mode must be one of {', '.join(PAUSE_MODES)}", param="mode")
    await _call(app, "sleep", level, mode)
    return {"status": "sleeping", "level": level}


async def _wake_up(app: App, _: Any) -> dict[str, Any]:
    tags = _tags()
    awake = all(await _call(app, "wake_up", tags))
    return {"status": "awake" if awake else "sleeping", "tags": tags}


async def _consensus(app: App, method: str) -> Any:
    results = await _call(app, method)
    if any(r != results[0] for r in results):
        raise EngineControlError(f"the engines answered {method} differently: {results}")
    return results[0]


async def _is_sleeping(app: App, _: Any) -> dict[str, Any]:
    return {"is_sleeping": await _consensus(app, "is_sleeping")}


async def _pause(app: App, _: Any) -> dict[str, Any]:
    mode = _query("mode", "abort", str)
    clear = _query("clear_cache", True, _bool)
    if mode not in PAUSE_MODES:
        raise ValidationError(f"mode must be one of {', '.join(PAUSE_MODES)}", param="mode")
    await _call(app, "pause_scheduler", mode, clear)
    return {"status": "paused"}


async def _resume(app: App, _: Any) -> dict[str, Any]:
    await _call(app, "resume_scheduler")
    return {"status": "resumed"}


async def _is_paused(app: App, _: Any) -> dict[str, Any]:
    return {"is_paused": await _consensus(app, "is_scheduler_paused")}


async def _collective_rpc(app: App, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", param=None)
    method = body.get("method")
    if not isinstance(method, str) or not method:
        raise ValidationError("method (a string) is required", param="method")
    args = body.get("args", [])
    kwargs = body.get("kwargs", {})
    timeout = body.get("timeout")
    # (vLLM passes only strings: the method deserializes what it needs)
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValidationError("args must be a list of strings", param="args")
    if not isinstance(kwargs, dict) or not all(isinstance(v, str) for v in kwargs.values()):
        raise ValidationError("kwargs must map names to strings", param="kwargs")
    if timeout is not None and not isinstance(timeout, (int, float)):
        raise ValidationError("timeout must be a number", param="timeout")
    results = await _call(app, "collective_rpc", method, timeout, args, kwargs)
    first = results[0] if results else None
    out = [r if r is None or isinstance(r, (dict, list)) else str(r) for r in first or []]
    return {"results": out}


async def _flush_cache(app: App, _: Any) -> bytes:
    if not all(await _call(app, "reset_prefix_cache", False, False)):
        raise ValidationError(
            "the cache was not flushed: requests are running (SGLang's answer, a 400)", param=None
        )
    return b"Cache flushed.\n"


#: vLLM's dev-mode routes (served with ``VLLM_SERVER_DEV_MODE=1``).
DEV_ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "/reset_prefix_cache"): _route("reset_prefix_cache", _reset_prefix_cache),
    ("POST", "/sleep"): _route("sleep", _sleep),
    ("POST", "/wake_up"): _route("wake_up", _wake_up),
    ("GET", "/is_sleeping"): _route("is_sleeping", _is_sleeping),
    ("POST", "/pause"): _route("pause", _pause),
    ("POST", "/resume"): _route("resume", _resume),
    ("GET", "/is_paused"): _route("is_paused", _is_paused),
    ("POST", "/collective_rpc"): _route("collective_rpc", _collective_rpc, body=True),
}

#: Always served: SGLang's ``/flush_cache``.
ROUTES: dict[tuple[str, str], Handler] = {
    ("GET", "/flush_cache"): _route("flush_cache", _flush_cache),
    ("POST", "/flush_cache"): _route("flush_cache", _flush_cache),
}
