"""vLLM's LoRA routes, served when adapters may change at run time
(``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): ``POST /v1/load_lora_adapter`` (``lora_name``,
``lora_path``: the engines load it, so a bad adapter is refused at once) and
``POST /v1/unload_lora_adapter`` (``lora_name``). Answers are vLLM's plain-text lines."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tokenwire.engine.vllm.protocol import lora_request
from tokenwire.messages.errors import ClientDisconnected, TokenwireError, ValidationError
from tokenwire.server.engine_control import EngineControlError, Unsupported
from tokenwire.server.fields import warn_unknown_fields
from tokenwire.server.http import read_json, respond, send_error

if TYPE_CHECKING:
    from tokenwire.server.app import App, Handler

__all__ = ["ROUTES"]

log = logging.getLogger("tokenwire.server")

_TEXT = [(b"content-type", b"text/plain; charset=utf-8")]


def _name(body: Any, key: str) -> str:
    value = body.get(key) if isinstance(body, dict) else None
    if not isinstance(value, str) or not value:
        raise ValidationError(f"{key} (a non-empty string) is required", param=key)
    return value


async def _load(app: App, receive: Any, send: Any) -> None:
    rt = app.runtime
    try:
        body = await read_json(receive)
        if not isinstance(body, dict):
            raise ValidationError("the request body must be a JSON object", param=None)
        warn_unknown_fields(body, {"lora_name", "lora_path", "load_inplace"})
        name, path = _name(body, "lora_name"), _name(body, "lora_path")
        if "lora" not in rt.features.engine_fields:
            raise Unsupported("this server's engine does not serve LoRA adapters")
        adapter = rt.models.add(name, path)
        call_all = getattr(rt.engine, "call_all", None)
        if call_all is not None:
            try:  # the engines load it now: a bad adapter is refused here, not per request
                await call_all("add_lora", lora_request(adapter))
            except Exception as exc:
                rt.models.remove(name)
                if isinstance(exc, TokenwireError):
                    raise
                raise EngineControlError(f"loading LoRA adapter {name!r}: {exc}") from None
    except ClientDisconnected:
        return
    except TokenwireError as err:
        await send_error(rt.metrics, send, err, "load_lora_adapter")
        return
    log.info("loaded LoRA adapter %r from %s (id %d)", adapter.name, adapter.path, adapter.id)
    rt.metrics.requests.labels("load_lora_adapter", "200").inc()
    await respond(send, 200, f"Success: LoRA adapter '{name}' added successfully.".encode(), _TEXT)


async def _unload(app: App, receive: Any, send: Any) -> None:
    rt = app.runtime
    try:
        body = await read_json(receive)
        if not isinstance(body, dict):
            raise ValidationError("the request body must be a JSON object", param=None)
        warn_unknown_fields(body, {"lora_name", "lora_int_id"})
        name = _name(body, "lora_name")
        adapter = rt.models.remove(name)
        call_all = getattr(rt.engine, "call_all", None)
        if call_all is not None:
            try:  # (vLLM's own frontend leaves it in the engine's cache; this frees it)
                await call_all("remove_lora", adapter.id)
            except Exception as exc:  # already evicted: nothing to free
                log.info("LoRA adapter %r was not loaded in an engine: %s", name, exc)
    except ClientDisconnected:
        return
    except TokenwireError as err:
        await send_error(rt.metrics, send, err, "unload_lora_adapter")
        return
    log.info("unloaded LoRA adapter %r", name)
    rt.metrics.requests.labels("unload_lora_adapter", "200").inc()
    msg = f"Success: LoRA adapter '{name}' removed successfully."
    await respond(send, 200, msg.encode(), _TEXT)


#: Served with ``runtime_lora_updating``.
ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "/v1/load_lora_adapter"): _load,
    ("POST", "/v1/unload_lora_adapter"): _unload,
}
