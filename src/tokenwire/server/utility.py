"""The utility routes clients and dashboards call besides generation, as plain functions (no I/O):
vLLM's ``/tokenize`` and ``/detokenize``, ``/version``, SGLang's ``/get_model_info``,
``/get_server_info`` and ``/abort_request``. Each takes the parsed JSON body and returns the JSON
answer, or raises a ``TokenwireError`` naming the field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenwire import __version__
from tokenwire.messages.errors import ValidationError
from tokenwire.server.api import check_model, render_conversation, warn_unknown_fields
from tokenwire.server.features import DEFAULT_FEATURES, Features
from tokenwire.tokenizer import Tokenizer

__all__ = [
    "AbortRequest",
    "tokenize",
    "detokenize",
    "version",
    "model_info",
    "server_info",
    "parse_abort",
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


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValidationError(f"{name} must be a boolean, got {value!r}", param=name)
    return value


def tokenize(
    body: Any, tok: Tokenizer, model: str, features: Features = DEFAULT_FEATURES
) -> dict[str, Any]:
    """vLLM's ``/tokenize``: ``prompt`` (special tokens added by default) or ``messages``
    (rendered as ``/v1/chat/completions`` renders them; no special tokens added by default) ->
    ``{"count", "max_model_len", "tokens", "token_strs"}``."""
    body = _object(body)
    check_model(body.get("model"), model)
    chat = "messages" in body
    warn_unknown_fields(body, _TOKENIZE_CHAT_KEYS if chat else _TOKENIZE_KEYS)
    add_special = _flag(body, "add_special_tokens", not chat)
    if chat:
        text, _ = render_conversation(body, tok, features)
    else:
        text = body.get("prompt")
        if not isinstance(text, str):
            raise ValidationError("give prompt (a string) or messages", param="prompt")
    ids = tok.encode(text, add_special_tokens=add_special)
    strs = None
    if _flag(body, "return_token_strs", False):
        strs = [tok.id_to_token(i) for i in ids]
    return {
        "count": len(ids),
        "max_model_len": tok.max_model_len,
        "tokens": ids,
        "token_strs": strs,
    }


def detokenize(body: Any, tok: Tokenizer, model: str) -> dict[str, Any]:
    """vLLM's ``/detokenize``: ``tokens`` -> ``{"prompt": text}`` (special tokens kept, as vLLM
    decodes them)."""
    body = _object(body)
    check_model(body.get("model"), model)
    warn_unknown_fields(body, {"model", "tokens"})
    ids = body.get("tokens")
    if not isinstance(ids, list):
        raise ValidationError("tokens must be a list of token ids", param="tokens")
    tok.validate_prompt_ids(ids, field="tokens")
    for pos, i in enumerate(ids):
        if not tok.is_known(i):
            raise ValidationError(
                f"tokens[{pos}] = {i} has no text: the tokenizer's ids are 0..{tok.vocab_size - 1}",
                param="tokens",
            )
    return {"prompt": tok.decode(ids, skip_special_tokens=False)}


def version() -> dict[str, str]:
    """``/version``."""
    return {"version": __version__}


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
    abort_all = _flag(body, "abort_all", False)
    rid = body.get("rid")
    if rid is None:
        rid = ""
    if not isinstance(rid, str) or (not rid and not abort_all):
        raise ValidationError("rid must be a non-empty string (or set abort_all)", param="rid")
    return AbortRequest(rid, abort_all)
