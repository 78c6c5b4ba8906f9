"""vLLM's LoRA routes, served when adapters may change at run time
(``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): ``POST /v1/load_lora_adapter`` (``lora_name``,
``lora_path``: the engines load it, so a bad adapter is refused at once) and
``POST /v1/unload_lora_adapter`` (``lora_name``). Answers are vLLM's plain-text lines; an adapter
the engine finds nothing at is vLLM's 404 (``NotFoundError``), one it cannot load a 400
(``BadRequestError``), and neither body says what the engine's message does about its host's
files (which paths exist): that goes to the server log."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tokenwire.engine.vllm.protocol import lora_request
from tokenwire.messages.errors import ClientDisconnected, TokenwireError, ValidationError
from tokenwire.server.engine_control import Unsupported
from tokenwire.server.fields import warn_unknown_fields
from tokenwire.server.http import read_json, respond, send_error

if TYPE_CHECKING:
    from tokenwire.server.app import App, Handler

__all__ = ["ROUTES"]

log = logging.getLogger("tokenwire.server")

_TEXT = [(b"content-type", b"text/plain; charset=utf-8")]
#: What vLLM's worker says of a path with no adapter (its ``LoRAAdapterNotFoundError``).
_NOT_FOUND = "no adapter found"


class LoraNotFound(TokenwireError):
    """The engine found no adapter at ``lora_path`` (vLLM's 404)."""

    status = 404
    error_type = "NotFoundError"
    prefix = "not found"


class LoraRefused(TokenwireError):
    """The engine could not load the adapter (vLLM's 400)."""

    status = 400
    error_type = "BadRequestError"
    prefix = "bad request"


def _load_error(name: str, exc: Exception) -> TokenwireError:
    """The client's error for an engine's failure to load adapter ``name``: its kind, and none
    of the engine's own words (logged here instead)."""
    log.warning("the engine could not load LoRA adapter %r: %s", name, exc)
    if _NOT_FOUND in str(exc).lower():
        return LoraNotFound(
            f"no LoRA adapter was found at the lora_path given for {name!r}", param="lora_path"
        )
    return LoraRefused(
        f"the engine could not load LoRA adapter {name!r} from the lora_path given (not a LoRA "
        "adapter for this model, or one it does not support; the server log says why)",
        param="lora_path",
    )


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
                raise _load_error(name, exc) from None
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
