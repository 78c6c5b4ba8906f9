"""vLLM's and SGLang's request fields beyond OpenAI's, so that nothing a peer honours is dropped
without a word: each is honoured (by the frontend, or carried to an engine that declares it in
``supported_request_fields``) or refused with a 400 naming it as the client spelled it.

- ``REFUSED``: fields tokenwire does not honour (beam search, hidden states, sessions, multimodal
  knobs, disaggregation bootstrap...), accepted only at their do-nothing values.
- ``INFORMATIONAL``: fields that only label a request for its caller's bookkeeping.
- ``engine_fields``: what an engine does (allowed ids, bad words, logprobs of given ids, the
  thinking budget, extension arguments, repetition detection, the cache salt, the engine rank),
  checked and put on ``SamplingParams`` or returned for the ``Plan``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenwire.messages.errors import ValidationError
from tokenwire.messages.sampling import SamplingParams
from tokenwire.runtime import Features
from tokenwire.server.fields import is_int
from tokenwire.tokenizer import Tokenizer, all_ints

__all__ = [
    "ENGINE_FIELDS",
    "INFORMATIONAL",
    "REFUSED",
    "bad_words_token_ids",
    "check_chat_refused",
    "check_refused",
    "engine_fields",
]

#: Most ``logprob_token_ids`` (vLLM's ``MAX_LOGPROB_TOKEN_IDS``).
MAX_LOGPROB_TOKEN_IDS = 128
#: Most ``bad_words`` entries.
MAX_BAD_WORDS = 128
#: Longest ``cache_salt`` (vLLM's).
MAX_CACHE_SALT = 1024

_OFF = (None, False, 0, "", [], {})

#: Field -> why it is refused. Refused unless null, false, zero or empty (``length_penalty`` and
#: ``routed_experts_prompt_start`` at their defaults, ``modalities`` text only).
REFUSED: dict[str, str] = {
    "use_beam_search": "beam search is not supported",
    "length_penalty": "length_penalty applies to beam search, which is not supported",
    "prompt_embeds": "prompt embeddings are not supported",
    "input_embeds": "input embeddings are not supported",
    "watermarking": "watermarking is not supported",
    "watermark": "watermarking is not supported",
    "session_params": "sessions are not supported",
    "return_hidden_states": "hidden states are not returned by this server",
    "return_routed_experts": "routed experts are not returned by this server",
    "routed_experts_prompt_start": "routed experts are not returned by this server",
    "routed_experts_start_len": "routed experts are not returned by this server",
    "return_indexer_topk": "indexer top-k is not returned by this server",
    "return_spec_tokens_details": "speculative decoding details are not returned",
    "return_meta_info": "SGLang's sglext meta info is not returned",
    "return_input_ids_in_sglext": "SGLang's sglext is not returned",
    "return_output_ids_in_sglext": "SGLang's sglext is not returned",
    "return_sampling_mask": "sampling masks are not returned",
    "sampling_logprobs_mode": "sampling logprob modes are not supported",
    "return_flat_raw_top_logprobs": "flat raw logprobs are not returned",
    "return_flat_raw_output_top_logprobs": "flat raw logprobs are not returned",
    "return_flat_raw_top_logprobs_b64": "flat raw logprobs are not returned",
    "return_bytes": "raw output bytes are not returned",
    "return_entropy": "entropies are not returned",
    "custom_logit_processor": "custom logit processors are not supported",
    "custom_params": "custom_params feed custom logit processors, which are not supported",
    "ec_transfer_params": "encoder-cache transfer (multimodal disaggregation) is not supported",
    "bootstrap_host": "prefill/decode disaggregation is not supported",
    "bootstrap_port": "prefill/decode disaggregation is not supported",
    "bootstrap_room": "prefill/decode disaggregation is not supported",
    "bootstrap_pair_key": "prefill/decode disaggregation is not supported",
    "disagg_prefill_dp_rank": "prefill/decode disaggregation is not supported",
    "decode_tp_size": "prefill/decode disaggregation is not supported",
    "require_reasoning": "forced reasoning is not supported",
    "task": "DeepSeek-V4 quick-instruction tasks are not supported",
    "images_config": "multimodal inputs are not supported",
    "video_config": "multimodal inputs are not supported",
    "max_dynamic_patch": "multimodal inputs are not supported",
    "min_dynamic_patch": "multimodal inputs are not supported",
    "image_max_dynamic_patch": "multimodal inputs are not supported",
    "video_max_dynamic_patch": "multimodal inputs are not supported",
    "use_audio_in_video": "multimodal inputs are not supported",
    "mm_hashes": "multimodal inputs are not supported",
    "mm_content_hashes": "multimodal inputs are not supported",
    "positional_embed_overrides": "embedding overrides are not supported",
}

_DEFAULTS = {"length_penalty": (1, 1.0), "modalities": (["text"],)}

#: Fields that only label a request (billing, metrics, tracing, classification) or matter only
#: on other endpoints: accepted, no effect here.
INFORMATIONAL = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "verbosity",
        "custom_labels",
        "extra_key",
        "log_metrics",
        "no_logs",
        "routing_key",
        "conversation_id",
        # vLLM: only its render endpoints read these; generation ignores them
        "mm_payload",
        "return_mm_kwargs",
        "return_token_offsets",
    }
)

#: Engine-side fields -> the ``REQUEST_FIELDS`` capability an engine declares for them.
ENGINE_FIELDS = {
    "allowed_token_ids": "allowed_token_ids",
    "bad_words": "bad_words",
    "logprob_token_ids": "logprob_token_ids",
    "token_ids_logprob": "logprob_token_ids",
    "thinking_token_budget": "thinking_token_budget",
    "max_thinking_tokens": "thinking_token_budget",
    "vllm_xargs": "vllm_xargs",
    "kv_transfer_params": "kv_transfer_params",
    "repetition_detection": "repetition_detection",
    "cache_salt": "cache_salt",
    "data_parallel_rank": "data_parallel_rank",
    "routed_dp_rank": "data_parallel_rank",
    "session_id": "session_id",
}


def _off(name: str, value: Any) -> bool:
    if any(value == v and type(value) is type(v) for v in _OFF):
        return True
    return any(value == v for v in _DEFAULTS.get(name, ()))


def check_refused(body: Mapping[str, Any]) -> None:
    """A 400 naming the first ``REFUSED`` field the request sets."""
    if REFUSED.keys().isdisjoint(body):
        return
    for name, why in REFUSED.items():
        if name in body and not _off(name, body[name]):
            raise ValidationError(f"{name}: {why} by this server", param=name)


def check_chat_refused(body: Mapping[str, Any]) -> None:
    """The chat-only refusals: SGLang's pre-tokenized ``input_ids``."""
    if body.get("input_ids") is not None:
        raise ValidationError(
            "input_ids: pre-tokenized chat prompts are not supported by this server (send them "
            "as the prompt of /v1/completions)",
            param="input_ids",
        )


def _ids(value: Any, name: str, tok: Tokenizer, *, most: int | None = None) -> list[int]:
    if not isinstance(value, list) or not value or not all_ints(value):
        raise ValidationError(f"{name} must be a non-empty list of token ids", param=name)
    if most is not None and len(value) > most:
        raise ValidationError(f"{name} has {len(value)} ids, more than {most}", param=name)
    top = tok.model_vocab_size
    bad = [v for v in value if not 0 <= v < top]
    if bad:
        raise ValidationError(
            f"{name} has ids outside the model's vocabulary [0, {top}): {bad[:5]}", param=name
        )
    return list(value)


def bad_words_token_ids(words: Any, tok: Tokenizer, name: str = "bad_words") -> list[list[int]]:
    """``bad_words`` as the id sequences vLLM's frontend makes of them: each word alone, and,
    when the tokenizer gives a leading space its own word token, with one."""
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise ValidationError(f"{name} must be a list of strings", param=name)
    if len(words) > MAX_BAD_WORDS:
        raise ValidationError(f"{name} has more than {MAX_BAD_WORDS} entries", param=name)
    out: list[list[int]] = []
    for word in dict.fromkeys(words):
        if not word:
            raise ValidationError(f"{name} cannot contain an empty string", param=name)
        plain = tok.encode(word.lstrip(), add_special_tokens=False)
        if not plain:
            raise ValidationError(f"{name} entries must tokenize to at least one token", param=name)
        out.append(plain)
        spaced = tok.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return out


def _json_object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValidationError(f"{name} must be a JSON object", param=name)
    return value


def _xargs(value: Any, name: str) -> dict[str, Any]:
    value = _json_object(value, name)
    scalar = (str, int, float)
    for key, v in value.items():
        ok = (isinstance(v, scalar) and not isinstance(v, bool)) or (
            isinstance(v, list)
            and all(isinstance(x, scalar) and not isinstance(x, bool) for x in v)
        )
        if not ok:
            raise ValidationError(
                f"{name}[{key!r:.40}] must be a string, a number or a list of them", param=name
            )
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, int) and not -(2**63) <= x < 2**64:
                raise ValidationError(f"{name} integers must fit in 64 bits", param=name)
    return value


def _repetition(value: Any, name: str) -> dict[str, int]:
    value = _json_object(value, name)
    keys = ("max_pattern_size", "min_pattern_size", "min_count")
    out: dict[str, int] = {}
    for key in value:
        if key not in keys:
            raise ValidationError(f"{name}: unknown key {key!r:.40}", param=name)
        if not is_int(value[key]):
            raise ValidationError(f"{name}.{key} must be an integer", param=name)
        out[key] = value[key]
    most, least, count = (out.get(k, 0) for k in keys)
    if most < 0 or least < 0 or least > most:
        raise ValidationError(
            f"{name}: max_pattern_size and min_pattern_size must be >= 0, with "
            "min_pattern_size <= max_pattern_size",
            param=name,
        )
    if most > 0 and count < 2:
        raise ValidationError(f"{name}: min_count must be >= 2", param=name)
    return out


def engine_fields(
    body: Mapping[str, Any], tok: Tokenizer, features: Features, params: SamplingParams
) -> dict[str, Any]:
    """The engine-side fields of a request: sampling ones put on ``params``, the others returned
    as ``Plan`` keyword arguments (``cache_salt``, ``data_parallel_rank``, ``session_id``). A
    field the engine does not declare is a 400 naming it."""
    if ENGINE_FIELDS.keys().isdisjoint(body):
        given = []
    else:
        given = [k for k in ENGINE_FIELDS if body.get(k) is not None and body.get(k) != []]
    for name in given:
        if ENGINE_FIELDS[name] not in features.engine_fields:
            raise ValidationError(
                f"{name} needs an engine that honours it; this server's engine does not",
                param=name,
            )
    out: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name in given:
        value = body[name]
        if name == "allowed_token_ids":
            params.allowed_token_ids = _ids(value, name, tok)
        elif name == "bad_words":
            params.bad_words_token_ids = bad_words_token_ids(value, tok)
        elif name in ("logprob_token_ids", "token_ids_logprob"):
            params.logprob_token_ids = _ids(value, name, tok, most=MAX_LOGPROB_TOKEN_IDS)
        elif name in ("thinking_token_budget", "max_thinking_tokens"):
            if not is_int(value) or value < -1:
                raise ValidationError(
                    f"{name} must be a non-negative integer (or -1: no budget)", param=name
                )
            if value >= 0:
                if features.reasoning_parser is None:
                    raise ValidationError(
                        f"{name} needs a server started with --reasoning-parser (vLLM's rule: "
                        "the engine must know where thinking ends)",
                        param=name,
                    )
                params.thinking_token_budget = value
        elif name == "vllm_xargs":
            extra.update(_xargs(value, name))
        elif name == "kv_transfer_params":
            extra["kv_transfer_params"] = _json_object(value, name)
        elif name == "repetition_detection":
            params.repetition_detection = _repetition(value, name)
        elif name == "cache_salt":
            if not isinstance(value, str) or not 1 <= len(value) <= MAX_CACHE_SALT:
                raise ValidationError(
                    f"{name} must be a string of 1 to {MAX_CACHE_SALT} characters", param=name
                )
            out["cache_salt"] = value
        elif name in ("data_parallel_rank", "routed_dp_rank"):
            if not is_int(value) or not 0 <= value < 1 << 16:
                raise ValidationError(f"{name} must be an engine rank (>= 0)", param=name)
            out["data_parallel_rank"] = value
        elif name == "session_id":
            if not isinstance(value, str) or not 1 <= len(value) <= 256:
                raise ValidationError(f"{name} must be a string of 1 to 256 characters", param=name)
            out["session_id"] = value
    if extra:
        params.extra_args = extra
    return out


def _spaces_specials(tok: Tokenizer) -> bool:
    specials = sorted(tok.special_ids)[:2]
    if len(specials) < 2:
        return False
    a, b = specials
    return tok.decode([a, b], False) != tok.decode([a], False) + tok.decode([b], False)


def check_special_spacing(params: SamplingParams, tok: Tokenizer, name: str) -> None:
    """``spaces_between_special_tokens: false`` (with special tokens kept) on a tokenizer whose
    decoder puts spaces between them (WordPiece's) is refused; on the others it changes nothing
    and is accepted."""
    if params.spaces_between_special_tokens or params.skip_special_tokens:
        return
    if tok.derived("spaces_between_special_tokens", _spaces_specials):
        raise ValidationError(
            f"{name}: false is not supported with this tokenizer (its decoder puts spaces "
            "between special tokens)",
            param=name,
        )
