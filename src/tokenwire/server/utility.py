"""The routes clients and dashboards call besides generation: ``/v1/models``, ``/health``,
``/metrics``, vLLM's ``/tokenize``, ``/detokenize`` and ``/version``, SGLang's
``/get_model_info``, ``/get_server_info`` and ``/abort_request``. Each answer is a plain function
of the parsed JSON body (no I/O) that returns the JSON answer or raises a ``TokenwireError``
naming the field; the handlers at the end send them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tokenwire import __version__
from tokenwire.context_length import encode_within
from tokenwire.messages.errors import (
    ClientDisconnected,
    QueueFullError,
    TokenwireError,
    ValidationError,
)
from tokenwire.messages.sampling import SamplingParams
from tokenwire.runtime import DEFAULT_FEATURES, Features, Plan
from tokenwire.runtime.models import ServedModels
from tokenwire.server import limits
from tokenwire.server.fields import check_model, check_text_length, flag, warn_unknown_fields
from tokenwire.server.http import encode, read_json, respond, send_error
from tokenwire.server.openai.parse import render_conversation
from tokenwire.server.streaming import Gathered, gather
from tokenwire.tokenizer import Tokenizer

if TYPE_CHECKING:
    from tokenwire.server.app import App, Handler

__all__ = [
    "ROUTES",
    "AbortRequest",
    "ServerFacts",
    "model",
    "tokenize",
    "detokenize",
    "version",
    "model_info",
    "server_info",
    "parse_abort",
    "tokenizer_info",
]

_TOKENIZE_KEYS = {"model", "prompt", "add_special_tokens", "return_token_strs"}
_TOKENIZE_CHAT_KEYS = {
    "model",
    "messages",
    "add_special_tokens",
    "return_token_strs",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "chat_template_kwargs",
    "reasoning_effort",
    "tools",
}


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", param=None)
    return body


def tokenize(
    body: Any, tok: Tokenizer, model: str | ServedModels, features: Features = DEFAULT_FEATURES
) -> dict[str, Any]:
    """vLLM's ``/tokenize`` (and SGLang's ``/v1/tokenize``): ``prompt`` (special tokens added by
    default; SGLang's list of prompts gives lists) or ``messages`` (rendered as
    ``/v1/chat/completions`` renders them; no special tokens added by default) ->
    ``{"count", "max_model_len", "tokens", "token_strs"}``."""
    body = _object(body)
    check_model(body.get("model"), model)
    chat = "messages" in body
    warn_unknown_fields(body, _TOKENIZE_CHAT_KEYS if chat else _TOKENIZE_KEYS)
    add_special = flag(body, "add_special_tokens", not chat)
    if chat:
        text, _ = render_conversation(body, tok, features)
    else:
        text = body.get("prompt")
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            batch = [_within(tok, t, add_special, "prompt") for t in text]
            return {
                "count": [len(ids) for ids in batch],
                "max_model_len": tok.max_model_len,
                "tokens": batch,
                "token_strs": None,
            }
        if not isinstance(text, str):
            raise ValidationError(
                "give prompt (a string or a list of strings) or messages", param="prompt"
            )
    ids = _within(tok, text, add_special, "messages" if chat else "prompt")
    strs = None
    if flag(body, "return_token_strs", False):
        strs = [tok.id_to_token(i) for i in ids]
    return {
        "count": len(ids),
        "max_model_len": tok.max_model_len,
        "tokens": ids,
        "token_strs": strs,
    }


def _within(tok: Tokenizer, text: str, add_special: bool, field: str) -> list[int]:
    """A text's ids; one past the context is refused, as a generation route refuses it (vLLM's
    /tokenize answers any length, but tokenizing a huge text costs hundreds of bytes a token)."""
    check_text_length(text, tok, "the text", field)
    ids = encode_within(tok, text, add_special_tokens=add_special, where="the text", field=field)
    limit = tok.max_model_len
    if limit is not None and len(ids) > limit:
        raise ValidationError(
            f"This model's maximum context length is {limit} tokens. However, the text has "
            f"{len(ids)} tokens.",
            param=field,
        )
    return ids


def detokenize(
    body: Any,
    tok: Tokenizer,
    model: str | ServedModels,
    *,
    skip_special: bool = False,
    keys: tuple[str, ...] = ("prompt",),
) -> dict[str, Any]:
    """vLLM's ``/detokenize`` and SGLang's ``/v1/detokenize``: ``tokens`` (SGLang: or a list of
    such lists) -> the text under ``keys`` (vLLM's ``prompt`` only; SGLang's route gives ``text``
    and ``prompt``). Special tokens are kept unless ``skip_special_tokens`` (default
    ``skip_special``: vLLM keeps them, SGLang skips them); ids the model has and the tokenizer
    lacks have no text."""
    body = _object(body)
    check_model(body.get("model"), model)
    warn_unknown_fields(body, {"model", "tokens", "skip_special_tokens"})
    skip = flag(body, "skip_special_tokens", skip_special)
    ids = body.get("tokens")
    if isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids):
        texts = [_decode(x, tok, skip) for x in ids]
        return dict.fromkeys(keys, texts)
    if not isinstance(ids, list):
        raise ValidationError("tokens must be a list of token ids", param="tokens")
    text = _decode(ids, tok, skip)
    return dict.fromkeys(keys, text)


def _decode(ids: list[Any], tok: Tokenizer, skip: bool) -> str:
    tok.validate_prompt_ids(ids, field="tokens")
    return tok.decode([i for i in ids if tok.is_known(i)], skip_special_tokens=skip)


def tokenizer_info(tok: Tokenizer) -> dict[str, Any]:
    """vLLM's ``/tokenizer_info``: the tokenizer's configuration (``tokenizer_config.json``, its
    special tokens as their text), its class and chat template."""
    out: dict[str, Any] = {}
    for key, value in tok.config.items():
        if key in ("vocab_file", "merges_file", "added_tokens_decoder"):
            continue
        out[key] = value.get("content", value) if isinstance(value, dict) else value
    out.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    if tok.chat_template:
        out["chat_template"] = tok.chat_template
    return out


def version(engine_version: str | None = None) -> dict[str, str]:
    """``/version``: vLLM's shape, the engine's vLLM version as ``version`` (tokenwire's own
    when the engine is not vLLM), tokenwire's as ``tokenwire_version``."""
    return {"version": engine_version or __version__, "tokenwire_version": __version__}


@dataclass(frozen=True)
class ServerFacts:
    """What the info routes report about one server."""

    model: str
    tokenizer: str
    max_model_len: int | None
    max_concurrent_requests: int
    engine: str


def model_info(facts: ServerFacts) -> dict[str, Any]:
    """SGLang's ``/get_model_info``."""
    return {
        "model_path": facts.model,
        "tokenizer_path": facts.tokenizer,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
    }


def server_info(facts: ServerFacts, running: int) -> dict[str, Any]:
    """SGLang's ``/get_server_info``: the server's settings, its version and ``internal_states``
    (one entry: the requests in flight)."""
    return {
        "model_path": facts.model,
        "tokenizer_path": facts.tokenizer,
        "served_model_name": facts.model,
        "context_length": facts.max_model_len,
        "max_running_requests": facts.max_concurrent_requests,
        "engine": facts.engine,
        "frontend": "tokenwire",
        "version": __version__,
        "internal_states": [{"num_running_reqs": running}],
    }


@dataclass(frozen=True)
class AbortRequest:
    """SGLang's ``/abort_request``: one request id (every choice of it), or everything."""

    rid: str
    abort_all: bool


def parse_abort(body: Any) -> AbortRequest:
    """``{"rid": ..., "abort_all": false}``."""
    body = _object(body)
    warn_unknown_fields(body, {"rid", "abort_all"})
    abort_all = flag(body, "abort_all", False)
    rid = body.get("rid")
    if rid is None:
        rid = ""
    if not isinstance(rid, str) or (not rid and not abort_all):
        raise ValidationError("rid must be a non-empty string (or set abort_all)", param="rid")
    return AbortRequest(rid, abort_all)


# ---- the handlers --------------------------------------------------------------------------------


def model_cards(app: App) -> list[dict[str, Any]]:
    """The served models (every name, every LoRA adapter), as ``/v1/models`` lists them."""
    rt = app.runtime
    return rt.models.cards(rt.tokenizer.max_model_len)


async def _models(app: App, receive: Any, send: Any) -> None:
    await respond(send, 200, encode({"object": "list", "data": model_cards(app)}))


async def model(app: App, model_id: str, send: Any) -> None:
    """``GET /v1/models/{id}``: the model's (or adapter's) card, or OpenAI's 404
    ``model_not_found``."""
    try:
        name, _ = check_model(model_id, app.runtime.models)
    except TokenwireError as err:
        await send_error(app.runtime.metrics, send, err, "models")
        return
    card = next(c for c in model_cards(app) if c["id"] == name)
    await respond(send, 200, encode(card))


async def _health(app: App, receive: Any, send: Any) -> None:
    if app.runtime.engine.alive:
        await respond(send, 200, b'{"status":"ok"}')
    else:
        await send_error(
            app.runtime.metrics, send, QueueFullError("the engine is not running"), "health"
        )


async def _json_route(
    app: App,
    receive: Any,
    send: Any,
    route: str,
    answer: Callable[[Any], Any],
    *,
    pure: bool = False,
) -> None:
    """A small JSON route: ``answer(body)`` for the request's JSON body (None for a GET);
    a ``pure`` answer (no server state touched) runs off the event loop for a large body."""
    try:
        if receive is None:
            out = answer(None)
        elif pure:
            out = await limits.parse_body(receive, answer)
        else:
            out = answer(await read_json(receive))
    except ClientDisconnected:
        return
    except TokenwireError as err:
        await send_error(app.runtime.metrics, send, err, route)
        return
    app.runtime.metrics.requests.labels(route, "200").inc()
    await respond(send, 200, encode(out))


async def _tokenize(app: App, receive: Any, send: Any) -> None:
    rt = app.runtime
    tok, name = rt.tokenizer, rt.models
    await _json_route(
        app,
        receive,
        send,
        "tokenize",
        lambda body: tokenize(body, tok, name, rt.features),
        pure=True,
    )


async def _detokenize(app: App, receive: Any, send: Any) -> None:
    tok, name = app.runtime.tokenizer, app.runtime.models
    await _json_route(
        app, receive, send, "detokenize", lambda body: detokenize(body, tok, name), pure=True
    )


async def _detokenize_sglang(app: App, receive: Any, send: Any) -> None:
    tok, name = app.runtime.tokenizer, app.runtime.models

    def answer(body: Any) -> dict[str, Any]:
        return detokenize(body, tok, name, skip_special=True, keys=("prompt", "text"))

    await _json_route(app, receive, send, "detokenize", answer, pure=True)


async def _tokenizer_info(app: App, receive: Any, send: Any) -> None:
    tok = app.runtime.tokenizer
    await _json_route(app, None, send, "tokenizer_info", lambda _: tokenizer_info(tok))


async def _load(app: App, receive: Any, send: Any) -> None:
    """vLLM's ``/load``: the engine requests in flight."""
    running = len(app.runtime.shard)
    await _json_route(app, None, send, "load", lambda _: {"server_load": running})


#: Seconds ``/health_generate`` waits for its one token.
HEALTH_GENERATE_TIMEOUT = 20.0


async def _health_generate(app: App, receive: Any, send: Any) -> None:
    """SGLang's ``/health_generate``: the engine generates one token (greedy, from token 0)."""
    rt = app.runtime
    plan = Plan(
        "generate",
        [[0]],
        SamplingParams(max_new_tokens=1, temperature=0.0).normalize(rt.tokenizer),
        model=rt.models.primary,
    )
    subs = []
    try:
        subs = rt.submit(plan, past_limit=True)  # (a busy server is a healthy one)
        got = await asyncio.wait_for(gather(rt, subs), HEALTH_GENERATE_TIMEOUT)
        if not isinstance(got, Gathered):
            raise QueueFullError("the engine failed to generate")
    except (TokenwireError, asyncio.TimeoutError) as exc:
        for rid, _, sink in subs:
            rt.abort(rid, sink)
        err = exc if isinstance(exc, TokenwireError) else QueueFullError("no token in time")
        await send_error(rt.metrics, send, QueueFullError(err.detail), "health_generate")
        return
    finally:
        rt.finished()
    await respond(send, 200, b"")


async def _version(app: App, receive: Any, send: Any) -> None:
    engine_version = getattr(app.runtime.engine, "vllm_version", None)
    await _json_route(app, None, send, "version", lambda _: version(engine_version))


async def _model_info(app: App, receive: Any, send: Any) -> None:
    await _json_route(app, None, send, "info", lambda _: model_info(app.facts))


async def _server_info(app: App, receive: Any, send: Any) -> None:
    running = len(app.runtime.shard)
    await _json_route(app, None, send, "info", lambda _: server_info(app.facts, running))


async def _abort_request(app: App, receive: Any, send: Any) -> None:
    def abort(body: Any) -> dict[str, Any]:
        req = parse_abort(body)
        return {"aborted": app.runtime.abort_requests(req.rid, abort_all=req.abort_all)}

    await _json_route(app, receive, send, "abort", abort)


async def _metrics(app: App, receive: Any, send: Any) -> None:
    shared = app.runtime.shared_metrics
    if shared is not None:  # several API-server processes: every one's counts, as of now
        await shared.refresh()
        body = shared.render()
    else:
        body = generate_latest(app.runtime.metrics.registry)
    await respond(send, 200, body, [(b"content-type", CONTENT_TYPE_LATEST.encode())])


ROUTES: dict[tuple[str, str], Handler] = {
    ("GET", "/v1/models"): _models,
    ("GET", "/health"): _health,
    ("GET", "/metrics"): _metrics,
    # vLLM's and SGLang's utility routes
    ("POST", "/tokenize"): _tokenize,
    ("POST", "/detokenize"): _detokenize,
    ("GET", "/version"): _version,
    ("GET", "/ping"): _health,
    ("POST", "/ping"): _health,
    ("GET", "/get_model_info"): _model_info,
    ("GET", "/get_server_info"): _server_info,
    ("GET", "/server_info"): _server_info,
    ("POST", "/abort_request"): _abort_request,
    # SGLang's tokenizer routes (its shapes: batches, text) and health with generation
    ("POST", "/v1/tokenize"): _tokenize,
    ("POST", "/v1/detokenize"): _detokenize_sglang,
    ("GET", "/health_generate"): _health_generate,
    # vLLM's server load
    ("GET", "/load"): _load,
}

#: Served with ``--enable-tokenizer-info-endpoint`` (vLLM's flag).
TOKENIZER_INFO_ROUTES: dict[tuple[str, str], Handler] = {
    ("GET", "/tokenizer_info"): _tokenizer_info,
}
