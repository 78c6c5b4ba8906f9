"""Request fields every API reads the same way: the ``model`` a request names, unknown fields
(ignored and logged once, vLLM's policy), client-chosen request ids, prompts as text or token ids
(bounded before they are tokenized), and how many completions one request may ask for. Every
problem is a ``ValidationError`` naming the field as the client spelled it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tokenwire.context_length import encode_truncated, encode_within, max_prompt_chars
from tokenwire.engine import LoraAdapter
from tokenwire.messages.errors import ModelNotFoundError, ValidationError
from tokenwire.runtime.models import ServedModels
from tokenwire.tokenizer import Tokenizer, all_ints

__all__ = [
    "MAX_CHOICES",
    "MAX_REQUEST_ID_LEN",
    "check_choices",
    "check_model",
    "check_text_length",
    "flag",
    "is_int",
    "lora_path",
    "prompt_ids",
    "request_id",
    "warn_unknown",
    "warn_unknown_fields",
]

#: Most choices one request may ask for (prompts times ``n``).
MAX_CHOICES = 256

#: Longest client-chosen request id (``request_id``, ``rid``).
MAX_REQUEST_ID_LEN = 256

#: Unknown field names logged (once each) before the log stops naming new ones.
_MAX_WARNED = 256
_warned: set[str] = set()
#: Characters of an unknown field's name that are logged and remembered.
_SHOWN_NAME = 48

log = logging.getLogger("tokenwire.server")


def check_model(requested: Any, served: str | ServedModels) -> tuple[str, LoraAdapter | None]:
    """``model`` must name a served model or adapter (absent or null: the model); anything else
    is OpenAI's 404 ``model_not_found``. Returns the name a response echoes and the adapter."""
    if not isinstance(served, str):
        return served.resolve(requested)
    if requested is None or requested == served:
        return served, None
    if not isinstance(requested, str):
        raise ValidationError(f"model must be a string, got {requested!r}", param="model")
    raise ModelNotFoundError(
        f"The model `{requested}` does not exist (this server serves `{served}`).", param="model"
    )


def lora_path(body: Mapping[str, Any], served: str | ServedModels) -> LoraAdapter | None:
    """SGLang's ``lora_path``: the adapter a request names (one, even for a batch)."""
    value = body.get("lora_path")
    if isinstance(value, list):
        if not all(v is None or isinstance(v, str) for v in value):
            raise ValidationError("lora_path must be a name or a list of names", param="lora_path")
        names = set(value)
        if len(names) > 1:
            raise ValidationError(
                "different lora_path values per prompt are not supported; send separate requests",
                param="lora_path",
            )
        value = next(iter(names), None)
    if isinstance(served, str):
        if value:
            raise ValidationError("this server has no LoRA adapters", param="lora_path")
        return None
    return served.adapter(value, "lora_path")


def warn_unknown_fields(body: Mapping[str, Any], allowed: set[str]) -> None:
    """Fields tokenwire does not know are ignored (vLLM's policy), and logged once per name."""
    for key in body:
        if key not in allowed:
            warn_unknown(key)


def warn_unknown(key: str) -> None:
    """Log an unknown field's name once (its first few dozen characters: what is kept is bounded
    whatever the names clients send)."""
    shown = key if len(key) <= _SHOWN_NAME else key[: _SHOWN_NAME - 3] + "..."
    if shown in _warned or len(_warned) > _MAX_WARNED:
        return
    _warned.add(shown)
    if len(_warned) > _MAX_WARNED:
        log.warning("more than %d unknown request fields: no longer naming them", _MAX_WARNED)
    else:
        log.warning("ignoring the unknown request field %r (logged once per field)", shown)


def is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    """A boolean field (null: ``default``)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValidationError(f"{name} must be a boolean, got {value!r:.60}", param=name)
    return value


def request_id(value: Any, name: str) -> str:
    """A client-chosen request id (``request_id``, the ``X-Request-Id`` header), checked."""
    if not isinstance(value, str) or not value or len(value) > MAX_REQUEST_ID_LEN:
        raise ValidationError(
            f"{name} must be a non-empty string of at most {MAX_REQUEST_ID_LEN} characters",
            param=name,
        )
    return value


def check_text_length(text: str, tok: Tokenizer, where: str, field: str) -> None:
    """Refuse, before tokenizing it, a text too long to fit the context whatever its tokens."""
    most = max_prompt_chars(tok)
    if most is not None and len(text) > most:
        raise ValidationError(
            f"{where} has {len(text)} characters: more tokens than this model's maximum context "
            f"length of {tok.max_model_len}",
            param=field,
        )


def prompt_ids(
    value: Any,
    tok: Tokenizer,
    field: str,
    *,
    add_special: bool,
    truncate: tuple[int, str] | None = None,
    n: int = 1,
) -> list[list[int]]:
    """``prompt`` (text, token ids, or a batch of either) as token id lists. The batch times
    ``n`` is checked against ``MAX_CHOICES`` before anything is tokenized; a text is refused as
    soon as it is certainly past the context length, or, with ``truncate`` (how many tokens to
    keep, and the side cut: vLLM's ``truncation_side``), only the tokens kept are made."""
    if isinstance(value, str):
        batch: list[Any] = [value]
    elif isinstance(value, list) and value and all_ints(value):
        batch = [value]
    elif isinstance(value, list) and value:
        batch = value
    else:
        raise ValidationError(
            f"{field} must be a string, a list of token ids, or a non-empty batch of either",
            param=field,
        )
    check_choices(len(batch) * n)
    out = []
    for i, p in enumerate(batch):
        where = field if len(batch) == 1 else f"{field}[{i}]"
        if isinstance(p, str):
            if truncate is None:
                check_text_length(p, tok, where, field)
                ids = encode_within(
                    tok, p, add_special_tokens=add_special, where=where, field=field
                )
            else:
                keep, side = truncate
                ids = encode_truncated(tok, p, keep, side=side, add_special_tokens=add_special)
        elif isinstance(p, list) and (p is value or all_ints(p)):  # (value: checked above)
            ids = list(p)
            tok.validate_prompt_ids(ids, field=where)
        else:
            raise ValidationError(
                f"{where} must be a string or a list of integer token ids", param=field
            )
        if not ids:
            raise ValidationError(f"{where} is empty", param=field)
        out.append(ids)
    return out


def check_choices(count: int) -> None:
    if count > MAX_CHOICES:
        raise ValidationError(
            f"this request asks for {count} completions; the limit is {MAX_CHOICES}", param="n"
        )
