"""OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` requests (with vLLM's extra fields)
as a ``Plan``: prompts as token ids (a chat's conversation rendered with its template) and one
normalized, verified ``SamplingParams``. Every problem is a ``ValidationError`` naming the field
as the client spelled it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tokenwire.chat import (
    chat_template_for,
    check_tools,
    normalize_messages,
    render_chat,
    shape_messages,
    template_roles,
)
from tokenwire.context_length import encode_truncated, encode_within
from tokenwire.engine import LoraAdapter
from tokenwire.messages.errors import ValidationError
from tokenwire.messages.sampling import SamplingParams
from tokenwire.multimodal import MediaItem, MediaLimits
from tokenwire.runtime import DEFAULT_FEATURES, Features, Plan
from tokenwire.runtime.models import ServedModels
from tokenwire.server.config import DEFAULT_LIMITS, RequestLimits
from tokenwire.server.extras import (
    ENGINE_FIELDS,
    INFORMATIONAL,
    REFUSED,
    check_chat_refused,
    check_refused,
    check_special_spacing,
    engine_fields,
)
from tokenwire.server.fields import (
    check_choices,
    check_model,
    check_text_length,
    flag,
    is_int,
    lora_path,
    prompt_ids,
    request_id,
    warn_unknown,
    warn_unknown_fields,
)
from tokenwire.server.logprobs import chat_logprobs_request, completion_logprobs_request
from tokenwire.server.openai.beam import BEAM_FIELDS, beam_request
from tokenwire.server.openai.tools import forced_schema, output_spec, strict_tag
from tokenwire.server.template_sandbox import brings_template, render_request_template
from tokenwire.structured import STRUCTURED_FIELDS, structured_request
from tokenwire.tokenizer import Tokenizer

__all__ = [
    "DEFAULT_COMPLETION_MAX_TOKENS",
    "REASONING_EFFORTS",
    "chat_template_options",
    "parse_chat",
    "parse_completion",
    "render_conversation",
]

#: OpenAI's (and vLLM's) default ``max_tokens`` for ``/v1/completions``.
DEFAULT_COMPLETION_MAX_TOKENS = 16

# OpenAI/vLLM request field -> SamplingParams field.
_SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "logit_bias": "logit_bias",
    "seed": "sampling_seed",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "min_tokens": "min_new_tokens",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "include_stop_str_in_output": "no_stop_trim",
}

_SAMPLING_ITEMS = tuple(_SAMPLING_FIELDS.items())
#: ``SamplingParams`` name -> the request field it came from (for errors)
_SAMPLING_NAMES = {internal: external for external, internal in _SAMPLING_FIELDS.items()}

# Accepted, and only meaningful at their default: anything else is refused, not ignored.
_DEFAULT_ONLY = {
    "suffix": (None, ""),
    "best_of": (None, 1),
    "parallel_tool_calls": (None, True, False),
    "modalities": (None, ["text"]),
    "stream_options": None,  # checked on its own
}

# Fields that only annotate the request (billing, caching, tracing hints): accepted, no effect.
_INFORMATIONAL = {"model", *INFORMATIONAL}

# Request fields with an effect beyond sampling, shared by both OpenAI routes (vLLM's and
# SGLang's names), and those refused unless at their do-nothing values.
_OPENAI_EXTRAS = {
    "priority",
    "request_id",
    "rid",
    "truncate_prompt_tokens",
    "truncation_side",
    "return_tokens_as_token_ids",
    "add_special_tokens",
    "return_token_ids",
    "stream_interval",
    "stop_regex",
    "no_stop_trim",
    "lora_path",
    "return_cached_tokens_details",
    *REFUSED,
    *ENGINE_FIELDS,
}

#: ``reasoning_effort`` values passed on to the chat template (OpenAI's).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def _check_defaults(body: Mapping[str, Any]) -> None:
    for key, ok in _DEFAULT_ONLY.items():
        if ok is None or key not in body:
            continue
        value = body[key]
        if value is None or any(value == v and type(value) is type(v) for v in ok):
            continue
        raise ValidationError(f"{key}={value!r} is not supported by this server", param=key)


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """``stream``, ``stream_options.include_usage`` and ``continuous_usage_stats`` (vLLM's:
    usage in every chunk, only together with ``include_usage``)."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ValidationError(f"stream must be a boolean, got {stream!r}", param="stream")
    opts = body.get("stream_options")
    include_usage = continuous = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise ValidationError(
                "stream_options must be an object with include_usage", param="stream_options"
            )
        for key in opts:
            if key not in ("include_usage", "continuous_usage_stats"):
                warn_unknown(f"stream_options.{key}")
        for key in ("include_usage", "continuous_usage_stats"):
            if opts.get(key) is not None and not isinstance(opts[key], bool):
                raise ValidationError(
                    f"stream_options.{key} must be a boolean, got {opts[key]!r}",
                    param="stream_options",
                )
        if not stream:
            raise ValidationError(
                "stream_options is only allowed with stream=true", param="stream_options"
            )
        include_usage = opts.get("include_usage") is True
        continuous = include_usage and opts.get("continuous_usage_stats") is True
    return stream, include_usage, continuous


def _openai_extras(body: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``priority``, ``request_id`` and ``return_tokens_as_token_ids`` as ``Plan``
    keyword arguments."""
    out: dict[str, Any] = {}
    priority = body.get("priority")
    if priority is not None:
        if not is_int(priority) or not -(2**31) <= priority < 2**31:
            raise ValidationError(
                f"priority must be a (32-bit) integer, got {priority!r}", param="priority"
            )
        out["priority"] = priority
    for name in ("rid", "request_id"):  # (SGLang's rid, vLLM's request_id: the latter wins)
        rid = body.get(name)
        if rid is not None:
            out["id"] = request_id(rid, name)
    if body.get("return_tokens_as_token_ids") is not None:
        out["return_tokens_as_token_ids"] = flag(body, "return_tokens_as_token_ids", False)
    out["return_token_ids"] = flag(body, "return_token_ids", False)
    out["cached_details"] = flag(body, "return_cached_tokens_details", False)
    return out


def _truncation(body: Mapping[str, Any], tok: Tokenizer) -> tuple[int, str] | None:
    """vLLM's ``truncate_prompt_tokens`` (how many of each prompt's tokens to keep; -1: the
    context length) and ``truncation_side`` (the side cut: ``left``, the default, or
    ``right``), or None."""
    k = body.get("truncate_prompt_tokens")
    if k is None:
        return None
    limit = tok.max_model_len
    if not is_int(k) or k < -1 or k == 0:
        raise ValidationError(
            f"truncate_prompt_tokens must be -1 or a positive integer, got {k!r}",
            param="truncate_prompt_tokens",
        )
    if k == -1:
        if limit is None:
            return None
        k = limit
    if limit is not None and k > limit:
        raise ValidationError(
            f"truncate_prompt_tokens ({k}) is greater than the context length ({limit})",
            param="truncate_prompt_tokens",
        )
    side = body.get("truncation_side")
    if side not in (None, "left", "right"):
        raise ValidationError(
            f"truncation_side must be left or right, got {side!r:.40}", param="truncation_side"
        )
    return k, side or "left"


def _truncate(prompts: list[list[int]], truncate: tuple[int, str] | None) -> None:
    """Keep ``truncate``'s count of each prompt's tokens, cutting its side."""
    if truncate is None:
        return
    keep, side = truncate
    for i, p in enumerate(prompts):
        if len(p) > keep:
            prompts[i] = p[:keep] if side == "right" else p[-keep:]


def _n(body: Mapping[str, Any]) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if not is_int(n) or n < 1:
        raise ValidationError(f"n must be a positive integer, got {n!r}", param="n")
    return n


def _max_tokens(body: Mapping[str, Any]) -> tuple[str, Any]:
    given = [k for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None]
    if len(given) > 1:
        raise ValidationError(
            "set only one of max_tokens and max_completion_tokens", param="max_completion_tokens"
        )
    return (given[0], body[given[0]]) if given else ("max_tokens", None)


def _params(
    body: Mapping[str, Any],
    tok: Tokenizer,
    prompts: list[list[int]],
    default_max: int | None,
    prompt_field: str,
    limits: RequestLimits,
    features: Features,
) -> SamplingParams:
    """SamplingParams from OpenAI fields (null means the default: the model's generation
    default, else the API's), normalized and verified."""
    names = dict(_SAMPLING_NAMES)
    max_key, max_value = _max_tokens(body)
    names["max_new_tokens"] = max_key
    data: dict[str, Any] = {}
    defaults = features.generation_defaults
    model_values = defaults.values
    for external, internal in _SAMPLING_ITEMS:
        value = body.get(external)
        if value is None:
            value = model_values.get(internal)
        if value is not None:
            data[internal] = value
    # SGLang's names on its OpenAI routes (stop_regex, no_stop_trim), vLLM's stream_interval
    for name in ("stop_regex", "no_stop_trim", "stream_interval"):
        if body.get(name) is not None:
            if name == "no_stop_trim" and "no_stop_trim" in data and body[name] != data[name]:
                raise ValidationError(
                    "no_stop_trim and include_stop_str_in_output disagree", param=name
                )
            data[name] = body[name]
            names[name] = name
    if data.get("top_k") == 0:  # vLLM's "no top-k"
        data["top_k"] = -1
    longest = max(len(p) for p in prompts)
    limit = tok.max_model_len
    if max_value is None:
        if default_max is None:
            # (chat: the model's max_new_tokens, as vLLM takes it, within the context)
            max_value = (limit - longest) if limit else None
            model_max = defaults.get("max_new_tokens")
            if model_max is not None:
                max_value = model_max if max_value is None else min(model_max, max_value)
        else:
            max_value = default_max if not limit else max(0, min(default_max, limit - longest))
    cap = defaults.max_tokens_cap
    if cap is not None and (max_value is None or (is_int(max_value) and max_value > cap)):
        max_value = cap  # (vLLM's override_max_tokens: every request, whatever it asks)
    data["max_new_tokens"] = max_value
    params = SamplingParams.from_dict(data, names=names)
    if limit is not None:
        if longest >= limit:
            raise ValidationError(
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"has {longest} tokens.",
                param=prompt_field,
            )
        if params.max_new_tokens is not None and longest + params.max_new_tokens > limit:
            raise ValidationError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{longest + params.max_new_tokens} tokens ({longest} in the prompt, "
                f"{params.max_new_tokens} in the completion). Please reduce the length of the "
                f"prompt or {max_key}.",
                param=max_key,
            )
    params.normalize(tok, names=names, max_stop_str_len=limits.max_stop_str_len)
    params.verify(tok.model_vocab_size, names=names)
    check_special_spacing(params, tok, "spaces_between_special_tokens")
    return params


_COMPLETION_KEYS = (
    set(_SAMPLING_FIELDS)
    | set(_DEFAULT_ONLY)
    | _INFORMATIONAL
    | _OPENAI_EXTRAS
    | {"prompt", "max_tokens", "max_completion_tokens", "n", "stream"}
    | STRUCTURED_FIELDS
    | {"logprobs", "top_logprobs", "echo", "prompt_logprobs"}
)
_CHAT_KEYS = (_COMPLETION_KEYS - {"prompt", "suffix", "best_of"}) | {
    "messages",
    "mm_processor_kwargs",
    "media_io_kwargs",
    "tools",
    "tool_choice",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "reasoning_effort",
    "documents",
    "thinking",
    "include_reasoning",
    "separate_reasoning",
    "stream_reasoning",
    "return_prompt_token_ids",
    "return_prompt_text",
    "input_ids",
}


def _common(body: Any, model: str | ServedModels, keys: set[str]) -> tuple[str, LoraAdapter | None]:
    """What both OpenAI routes check first: a JSON object, the model (or adapter) it names,
    fields no peer knows (logged), fields honoured only at their default, fields refused."""
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", param=None)
    name, lora = check_model(body.get("model"), model)
    lora = lora_path(body, model) or lora
    warn_unknown_fields(body, keys)
    _check_defaults(body)
    if body.get("use_beam_search") is True:  # (beam search: served, see beam.py)
        check_refused({k: v for k, v in body.items() if k not in BEAM_FIELDS})
    else:
        check_refused(body)
    return name, lora


def parse_completion(
    body: Any,
    tok: Tokenizer,
    model: str | ServedModels,
    *,
    limits: RequestLimits = DEFAULT_LIMITS,
    features: Features = DEFAULT_FEATURES,
) -> Plan:
    """``/v1/completions``."""
    name, lora = _common(body, model, _COMPLETION_KEYS)
    if "prompt" not in body:
        raise ValidationError("prompt is required", param="prompt")
    stream, include_usage, continuous = _stream_flags(body)
    n = _n(body)
    extras = _openai_extras(body)
    extras.setdefault("return_tokens_as_token_ids", features.return_tokens_as_token_ids)
    truncate = _truncation(body, tok)
    prompts = prompt_ids(
        body["prompt"],
        tok,
        "prompt",
        add_special=flag(body, "add_special_tokens", True),
        truncate=truncate,
        n=n,
    )
    _truncate(prompts, truncate)
    params = _params(body, tok, prompts, DEFAULT_COMPLETION_MAX_TOKENS, "prompt", limits, features)
    grammar_field = _constrain(params, body, features)
    top, echo, prompt_top = completion_logprobs_request(
        body, features.max_logprobs, tok.model_vocab_size
    )
    params.logprobs, params.prompt_logprobs = top, prompt_top
    extras |= _engine_side(body, tok, features, params)
    extras["cached_details"] |= features.prompt_tokens_details
    _check_lora(lora, features)
    return Plan(
        "completion",
        prompts,
        params,
        n,
        stream,
        include_usage,
        name,
        beam=beam_request(body, n, stream),
        continuous_usage=continuous,
        lora=lora,
        echo=_echo_texts(body["prompt"], prompts, tok) if echo else None,
        prompt_logprobs=body.get("prompt_logprobs") is not None,
        grammar_field=grammar_field,
        **extras,
    )


def _echo_texts(value: Any, prompts: list[list[int]], tok: Tokenizer) -> list[str]:
    """The prompts as ``echo`` gives them back: a text prompt as sent, token ids decoded."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(p, str) for p in value):
        return list(value)
    return [tok.decode(p, False) for p in prompts]


def parse_chat(
    body: Any,
    tok: Tokenizer,
    model: str | ServedModels,
    *,
    limits: RequestLimits = DEFAULT_LIMITS,
    features: Features = DEFAULT_FEATURES,
) -> Plan:
    """``/v1/chat/completions``: the conversation rendered with the tokenizer's template."""
    name, lora = _common(body, model, _CHAT_KEYS)
    check_chat_refused(body)
    if "messages" not in body:
        raise ValidationError("messages is required", param="messages")
    media: list[MediaItem] = []
    text, options = render_conversation(body, tok, features, media)
    stream, include_usage, continuous = _stream_flags(body)
    n = _n(body)
    check_choices(n)
    extras = _openai_extras(body)
    extras.setdefault("return_tokens_as_token_ids", features.return_tokens_as_token_ids)
    truncate = _truncation(body, tok)
    add_special = flag(body, "add_special_tokens", False)
    if truncate is None:
        check_text_length(text, tok, "the rendered conversation", "messages")
        ids = encode_within(
            tok,
            text,
            add_special_tokens=add_special,
            where="the rendered conversation",
            field="messages",
        )
    else:
        keep, side = truncate
        ids = encode_truncated(tok, text, keep, side=side, add_special_tokens=add_special)
    if not ids:
        raise ValidationError("the rendered conversation is empty", param="messages")
    prompts = [ids]
    params = _params(body, tok, prompts, None, "messages", limits, features)
    grammar_field = _constrain(params, body, features)
    params.logprobs, params.prompt_logprobs = chat_logprobs_request(
        body, features.max_logprobs, tok.model_vocab_size
    )
    extras |= _engine_side(body, tok, features, params)
    extras["cached_details"] |= features.prompt_tokens_details
    _check_lora(lora, features)
    spec = output_spec(body, features, text, options["extra"])
    if (
        spec is not None
        and spec.reasoning is not None
        and not flag(body, "separate_reasoning", True)
    ):
        # SGLang's separate_reasoning: false keeps the thinking in the content, as written
        spec = dataclasses.replace(spec, reasoning=None, prompt_in_reasoning=False)
        spec = spec if spec.tools is not None else None
    forced = forced_schema(body)
    if forced is not None:
        # tool_choice required or a named function constrains the output itself; with
        # response_format too, the tool constraint wins (stock vLLM and OpenAI answer 200)
        params.regex = params.ebnf = params.structural_tag = None
        params.json_schema = forced
        grammar_field = "tool_choice"
    elif (
        spec is not None
        and spec.tools is not None  # tool_choice auto
        and features.structured_outputs
        and not (params.json_schema or params.regex or params.ebnf or params.structural_tag)
    ):  # --tool-strict-level: a strict tool's call follows its schema (a format constraint
        # the request sets itself stays the one in force, as vLLM's does)
        tag = strict_tag(body, features, spec.tools)
        if tag is not None:
            params.structural_tag = tag
            grammar_field = "tools"
    tools_cls = spec.tools if spec is not None else None
    reasoning_cls = spec.reasoning if spec is not None else None
    special = getattr(tools_cls, "needs_special_tokens", False) or getattr(
        reasoning_cls, "needs_special_tokens", False
    )
    if special and body.get("skip_special_tokens") is None:  # the call markup is special tokens
        params.skip_special_tokens = False
    media_plan = None
    if media:
        media_plan = {"media": [media], "media_options": _media_options(body)}
    return Plan(
        "chat",
        prompts,
        params,
        n,
        stream,
        include_usage,
        name,
        beam=beam_request(body, n, stream),
        continuous_usage=continuous,
        lora=lora,
        output=spec,
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        # vLLM's include_reasoning: false drops the thinking (it is still parsed out)
        reasoning_fields=(
            features.reasoning_fields() if flag(body, "include_reasoning", True) else ()
        ),
        stream_reasoning=flag(body, "stream_reasoning", True),
        prompt_logprobs=params.prompt_logprobs is not None,
        grammar_field=grammar_field,
        echo=_chat_echo(body),
        return_prompt_token_ids=flag(body, "return_prompt_token_ids", False),
        prompt_text=text if flag(body, "return_prompt_text", False) else None,
        **(media_plan or {}),
        **extras,
    )


def _media_options(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's ``mm_processor_kwargs`` and ``media_io_kwargs`` (vLLM's fields)."""
    out: dict[str, Any] = {}
    for name in ("mm_processor_kwargs", "media_io_kwargs"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, dict) or (
            name == "media_io_kwargs" and not all(isinstance(v, dict) for v in value.values())
        ):
            raise ValidationError(f"{name} must be an object", param=name)
        out[name] = value
    return out


def _check_lora(lora: Any, features: Features, field: str = "model") -> None:
    if lora is not None and "lora" not in features.engine_fields:
        raise ValidationError(
            "LoRA adapters need an engine that serves them; this server's engine does not",
            param=field,
        )


def _chat_echo(body: Mapping[str, Any]) -> list[str] | None:
    """vLLM's chat ``echo``: the last message's text, when it is the assistant's (the answer
    it continues), goes before the output."""
    if not flag(body, "echo", False):
        return None
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if isinstance(last, dict) and last.get("role") == "assistant":
        content = last.get("content")
        if isinstance(content, str):
            return [content]
        if isinstance(content, list):
            return ["".join(p.get("text", "") for p in content if isinstance(p, dict))]
    return [""]


def _engine_side(
    body: Mapping[str, Any], tok: Tokenizer, features: Features, params: SamplingParams
) -> dict[str, Any]:
    """The engine-side fields (``extras.engine_fields``) and ``logprob_token_ids``' count."""
    out = engine_fields(body, tok, features, params)
    if params.logprob_token_ids is not None:
        name = "logprob_token_ids" if body.get("logprob_token_ids") else "token_ids_logprob"
        if params.logprobs is None:
            raise ValidationError(f"when using {name}, logprobs must be set", param=name)
        params.logprobs = len(params.logprob_token_ids)  # their columns, after the sampled one
    return out


def render_conversation(
    body: Mapping[str, Any],
    tok: Tokenizer,
    features: Features = DEFAULT_FEATURES,
    media: list[MediaItem] | None = None,
) -> tuple[str, dict[str, Any]]:
    """A chat request's ``messages`` rendered with the template it gets (its prompt text), and
    the ``render_chat`` options used. A multimodal model's media parts are collected into
    ``media`` (their placeholders rendered); a text-only model refuses them."""
    template = chat_template_for(
        body,
        tok.chat_template,
        features.chat_template,
        trust_request=features.trust_request_chat_template,
    )
    collect = None if features.media is None else (media if media is not None else [])
    messages = normalize_messages(body["messages"], roles=template_roles(template), media=collect)
    if collect:
        (features.media_limits or MediaLimits(features.media.modalities)).check(collect)
    placeholders = features.media.placeholders if features.media is not None else None
    shape_messages(messages, features.chat_template_content_format, template, placeholders)
    options = chat_template_options(body, features.default_chat_template_kwargs)
    # A request's own template (trusted) renders in a worker process, bounded in time and memory.
    render = render_request_template if brings_template(body) else render_chat
    text = render(template, messages, bos_token=tok.bos_token, eos_token=tok.eos_token, **options)
    return text, options


def _constrain(params: SamplingParams, body: Mapping[str, Any], features: Features) -> str | None:
    """The request's structured-output fields onto ``params`` (a 400 when the engine cannot
    constrain decoding); the request field they came from."""
    field, grammar = structured_request(body, supported=features.structured_outputs)
    for name, value in grammar.items():
        setattr(params, name, value)
    return field


def chat_template_options(
    body: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``render_chat`` keyword arguments from a chat request: ``add_generation_prompt``,
    ``continue_final_message``, ``tools``, ``chat_template_kwargs`` (over the server's
    ``defaults``, ``--default-chat-template-kwargs``) and ``reasoning_effort`` (passed to the
    template as vLLM does). Which template renders is ``chat_template_for``'s business."""

    cfm = flag(body, "continue_final_message", False)
    agp = flag(body, "add_generation_prompt", not cfm)
    if cfm and agp:
        raise ValidationError(
            "set at most one of continue_final_message and add_generation_prompt",
            param="continue_final_message",
        )
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ValidationError(
            "chat_template_kwargs must be an object", param="chat_template_kwargs"
        )
    if defaults:
        kwargs = {**defaults, **kwargs}
    for name in ("documents", "thinking"):  # vLLM's documents, SGLang's thinking config
        if body.get(name) is not None and name not in kwargs:
            if name == "documents" and not isinstance(body[name], list):
                raise ValidationError("documents must be a list of objects", param=name)
            kwargs = {**kwargs, name: body[name]}
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise ValidationError(
                f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}",
                param="reasoning_effort",
            )
        kwargs = {"reasoning_effort": effort} | kwargs
    tools = body.get("tools")
    if tools is not None:
        check_tools(tools)
    return {
        "add_generation_prompt": agp,
        "continue_final_message": cfm,
        "tools": tools,
        "extra": kwargs,
    }
