"""Request parsing and response shaping for the HTTP API, as plain functions (no I/O).

OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` (with vLLM's extra sampling fields) and
SGLang's native ``/generate`` are turned into a ``Plan``: prompts as token ids and one normalized,
verified ``SamplingParams``. Every problem is a ``ValidationError`` naming the field as the client
spelled it. Responses and SSE chunks are built here too.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tokenwire.messages.errors import ModelNotFoundError, TokenwireError, ValidationError
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.messages.sampling import DEFAULT_MAX_STOP_STR_LEN, SamplingParams
from tokenwire.parsers.output import OutputSpec
from tokenwire.server import limits as limits_mod
from tokenwire.server.chat import check_tools, normalize_messages, render_chat, template_roles
from tokenwire.server.features import DEFAULT_FEATURES, Features, forced_schema, output_spec
from tokenwire.server.logprobs import (
    chat_logprobs_request,
    completion_logprobs_request,
    generate_logprobs_request,
)
from tokenwire.server.structured import (
    STRUCTURED_FIELDS,
    check_grammar_params,
    structured_request,
)
from tokenwire.server.templates import chat_template_for, shape_messages
from tokenwire.tokenizer import Tokenizer

__all__ = [
    "Plan",
    "RequestLimits",
    "parse_completion",
    "parse_chat",
    "parse_generate",
    "error_body",
    "check_model",
    "warn_unknown_fields",
    "DEFAULT_COMPLETION_MAX_TOKENS",
]

#: OpenAI's (and vLLM's) default ``max_tokens`` for ``/v1/completions``.
DEFAULT_COMPLETION_MAX_TOKENS = 16
#: SGLang's default ``max_new_tokens`` for ``/generate``.
DEFAULT_GENERATE_MAX_NEW_TOKENS = 128
#: Most choices one request may ask for (prompts times ``n``).
MAX_CHOICES = 256

_json = msgspec.json.Encoder()

log = logging.getLogger("tokenwire.server")


@dataclass
class Plan:
    """What one HTTP request asks the engine for."""

    route: str  # "completion" | "chat" | "generate"
    prompts: list[list[int]]
    params: SamplingParams
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    model: str = ""
    rids: list[str] | None = None  # /generate: the client's request ids
    batch: bool = False  # /generate: the input was a list
    #: Scheduling priority for the engine (vLLM's: lower is sooner).
    priority: int = 0
    #: ``stream_options.continuous_usage_stats`` (with ``include_usage``): usage in every chunk.
    continuous_usage: bool = False
    #: vLLM's ``return_tokens_as_token_ids``: logprob tokens as ``"token_id:{id}"``.
    return_tokens_as_token_ids: bool = False
    #: Completions ``echo``: each prompt's text, given back before its output.
    echo: list[str] | None = None
    #: ``/generate`` ``return_logprob``: ``(logprob_start_len, top_logprobs_num,
    #: return_text_in_logprobs)``.
    sglang_logprobs: tuple[int, int, bool] | None = None
    #: vLLM's ``prompt_logprobs`` was asked for (the response carries them).
    prompt_logprobs: bool = False
    #: Chat: how outputs are parsed (reasoning, tool calls), None for plain text.
    output: OutputSpec | None = None
    #: Chat: ``parallel_tool_calls: false`` keeps only the first call.
    parallel_tool_calls: bool = True
    #: Chat: the message/delta keys the reasoning text goes under.
    reasoning_fields: tuple[str, ...] = ("reasoning",)
    #: The request field the grammar in ``params`` comes from (its refusal names it); None:
    #: ``/generate``'s, named as ``SamplingParams`` names them.
    grammar_field: str | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of the request: each prompt counted once, whatever ``n`` (as OpenAI and
        vLLM count them)."""
        return sum(len(p) for p in self.prompts)

    def openai_head(self, *, chunk: bool) -> dict[str, Any]:
        """The fields every OpenAI response (or streamed chunk) of this request starts with."""
        chat = self.route == "chat"
        if chat:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        prefix = "chatcmpl-" if chat else "cmpl-"
        return {"id": prefix + self.id, "object": obj, "created": self.created, "model": self.model}


# ---- shared helpers ------------------------------------------------------------------------------

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
# Accepted, and only meaningful at their default: anything else is refused, not ignored.
_DEFAULT_ONLY = {
    "suffix": (None, ""),
    "best_of": (None, 1),
    "parallel_tool_calls": (None, True, False),
    "modalities": (None, ["text"]),
    "stream_options": None,  # checked on its own
}
# Fields that only annotate the request (billing, caching, tracing hints): accepted, no effect.
_INFORMATIONAL = {
    "user",
    "model",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
}
# Request fields with an effect beyond sampling, shared by both OpenAI routes (vLLM's names).
_OPENAI_EXTRAS = {"priority", "request_id", "truncate_prompt_tokens", "return_tokens_as_token_ids"}
#: ``reasoning_effort`` values passed on to the chat template (OpenAI's).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
#: Longest client-chosen request id (``request_id``, ``rid``).
MAX_REQUEST_ID_LEN = 256
#: Unknown field names logged (once each) before the log stops naming new ones.
_MAX_WARNED = 256
_warned: set[str] = set()


def check_model(requested: Any, served: str) -> None:
    """``model`` must name the served model (absent or null means it); anything else is OpenAI's
    404 ``model_not_found``."""
    if requested is None or requested == served:
        return
    if not isinstance(requested, str):
        raise ValidationError(f"model must be a string, got {requested!r}", param="model")
    raise ModelNotFoundError(
        f"The model `{requested}` does not exist (this server serves `{served}`).", param="model"
    )


def warn_unknown_fields(body: Mapping[str, Any], allowed: set[str]) -> None:
    """Fields tokenwire does not know are ignored (vLLM's policy), and logged once per name."""
    for key in body:
        if key not in allowed:
            _warn_unknown(key)


def _warn_unknown(key: str) -> None:
    if key in _warned or len(_warned) > _MAX_WARNED:
        return
    _warned.add(key)
    shown = key if len(key) <= 64 else key[:61] + "..."
    if len(_warned) > _MAX_WARNED:
        log.warning("more than %d unknown request fields: no longer naming them", _MAX_WARNED)
    else:
        log.warning("ignoring the unknown request field %r (logged once per field)", shown)


def _check_defaults(body: Mapping[str, Any]) -> None:
    for key, ok in _DEFAULT_ONLY.items():
        if ok is None or key not in body:
            continue
        value = body[key]
        if value is None or any(value == v and type(value) is type(v) for v in ok):
            continue
        raise ValidationError(f"{key}={value!r} is not supported by this server", param=key)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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
                _warn_unknown(f"stream_options.{key}")
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
        if not _is_int(priority) or not -(2**31) <= priority < 2**31:
            raise ValidationError(
                f"priority must be a (32-bit) integer, got {priority!r}", param="priority"
            )
        out["priority"] = priority
    rid = body.get("request_id")
    if rid is not None:
        out["id"] = request_id(rid, "request_id")
    flag = body.get("return_tokens_as_token_ids")
    if flag is not None:
        if not isinstance(flag, bool):
            raise ValidationError(
                f"return_tokens_as_token_ids must be a boolean, got {flag!r}",
                param="return_tokens_as_token_ids",
            )
        out["return_tokens_as_token_ids"] = flag
    return out


def request_id(value: Any, name: str) -> str:
    """A client-chosen request id (``request_id``, the ``X-Request-Id`` header), checked."""
    if not isinstance(value, str) or not value or len(value) > MAX_REQUEST_ID_LEN:
        raise ValidationError(
            f"{name} must be a non-empty string of at most {MAX_REQUEST_ID_LEN} characters",
            param=name,
        )
    return value


def _truncate(prompts: list[list[int]], body: Mapping[str, Any], tok: Tokenizer) -> None:
    """vLLM's ``truncate_prompt_tokens``: keep each prompt's last k tokens (-1: the context
    length)."""
    k = body.get("truncate_prompt_tokens")
    if k is None:
        return
    limit = tok.max_model_len
    if not _is_int(k) or k < -1 or k == 0:
        raise ValidationError(
            f"truncate_prompt_tokens must be -1 or a positive integer, got {k!r}",
            param="truncate_prompt_tokens",
        )
    if k == -1:
        if limit is None:
            return
        k = limit
    if limit is not None and k > limit:
        raise ValidationError(
            f"truncate_prompt_tokens ({k}) is greater than the context length ({limit})",
            param="truncate_prompt_tokens",
        )
    for i, p in enumerate(prompts):
        if len(p) > k:
            prompts[i] = p[-k:]


def _n(body: Mapping[str, Any]) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if not _is_int(n) or n < 1:
        raise ValidationError(f"n must be a positive integer, got {n!r}", param="n")
    return n


def _max_tokens(body: Mapping[str, Any]) -> tuple[str, Any]:
    given = [k for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None]
    if len(given) > 1:
        raise ValidationError(
            "set only one of max_tokens and max_completion_tokens", param="max_completion_tokens"
        )
    return (given[0], body[given[0]]) if given else ("max_tokens", None)


@dataclass(frozen=True)
class RequestLimits:
    """Server-wide bounds on what one request may ask (each a 400 naming the field past it)."""

    #: Longest stop string, in UTF-8 bytes.
    max_stop_str_len: int = DEFAULT_MAX_STOP_STR_LEN


DEFAULT_LIMITS = RequestLimits()


def _params(
    body: Mapping[str, Any],
    tok: Tokenizer,
    prompts: list[list[int]],
    default_max: int | None,
    prompt_field: str,
    limits: RequestLimits,
) -> SamplingParams:
    """SamplingParams from OpenAI fields (null means the default), normalized and verified."""
    names = {internal: external for external, internal in _SAMPLING_FIELDS.items()}
    max_key, max_value = _max_tokens(body)
    names["max_new_tokens"] = max_key
    data: dict[str, Any] = {}
    for external, internal in _SAMPLING_FIELDS.items():
        if body.get(external) is not None:
            data[internal] = body[external]
    longest = max(len(p) for p in prompts)
    limit = tok.max_model_len
    if max_value is None:
        if default_max is None:
            max_value = (limit - longest) if limit else None
        else:
            max_value = default_max if not limit else max(0, min(default_max, limit - longest))
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
    return params


def check_text_length(text: str, tok: Tokenizer, where: str, field: str) -> None:
    """Refuse, before tokenizing it, a text too long to fit the context whatever its tokens."""
    most = limits_mod.max_prompt_chars(tok)
    if most is not None and len(text) > most:
        raise ValidationError(
            f"{where} has {len(text)} characters: more tokens than this model's maximum context "
            f"length of {tok.max_model_len}",
            param=field,
        )


def _prompt_ids(
    value: Any, tok: Tokenizer, field: str, *, add_special: bool, check_length: bool = True
) -> list[list[int]]:
    """``prompt`` (text, token ids, or a batch of either) as token id lists."""
    if isinstance(value, str):
        batch: list[Any] = [value]
    elif isinstance(value, list) and value and all(_is_int(v) for v in value):
        batch = [value]
    elif isinstance(value, list) and value:
        batch = value
    else:
        raise ValidationError(
            f"{field} must be a string, a list of token ids, or a non-empty batch of either",
            param=field,
        )
    out = []
    for i, p in enumerate(batch):
        where = field if len(batch) == 1 else f"{field}[{i}]"
        if isinstance(p, str):
            if check_length:
                check_text_length(p, tok, where, field)
            ids = tok.encode(p, add_special_tokens=add_special)
        elif isinstance(p, list) and all(_is_int(v) for v in p):
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


# ---- the three routes ----------------------------------------------------------------------------

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
    "tools",
    "tool_choice",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "reasoning_effort",
}


def parse_completion(
    body: Any,
    tok: Tokenizer,
    model: str,
    *,
    limits: RequestLimits = DEFAULT_LIMITS,
    features: Features = DEFAULT_FEATURES,
) -> Plan:
    """``/v1/completions``."""
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", param=None)
    check_model(body.get("model"), model)
    warn_unknown_fields(body, _COMPLETION_KEYS)
    _check_defaults(body)
    if "prompt" not in body:
        raise ValidationError("prompt is required", param="prompt")
    stream, include_usage, continuous = _stream_flags(body)
    n = _n(body)
    extras = _openai_extras(body)
    prompts = _prompt_ids(
        body["prompt"],
        tok,
        "prompt",
        add_special=True,
        check_length=body.get("truncate_prompt_tokens") is None,
    )
    _truncate(prompts, body, tok)
    _check_choices(len(prompts) * n)
    params = _params(body, tok, prompts, DEFAULT_COMPLETION_MAX_TOKENS, "prompt", limits)
    grammar_field = _constrain(params, body, features)
    top, echo, prompt_top = completion_logprobs_request(body, features.max_logprobs)
    params.logprobs, params.prompt_logprobs = top, prompt_top
    return Plan(
        "completion",
        prompts,
        params,
        n,
        stream,
        include_usage,
        model,
        continuous_usage=continuous,
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
    model: str,
    *,
    limits: RequestLimits = DEFAULT_LIMITS,
    features: Features = DEFAULT_FEATURES,
) -> Plan:
    """``/v1/chat/completions``: the conversation rendered with the tokenizer's template."""
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", param=None)
    check_model(body.get("model"), model)
    warn_unknown_fields(body, _CHAT_KEYS)
    _check_defaults(body)
    if "messages" not in body:
        raise ValidationError("messages is required", param="messages")
    text, options = render_conversation(body, tok, features)
    stream, include_usage, continuous = _stream_flags(body)
    n = _n(body)
    _check_choices(n)
    extras = _openai_extras(body)
    if body.get("truncate_prompt_tokens") is None:
        check_text_length(text, tok, "the rendered conversation", "messages")
    ids = tok.encode(text, add_special_tokens=False)
    if not ids:
        raise ValidationError("the rendered conversation is empty", param="messages")
    prompts = [ids]
    _truncate(prompts, body, tok)
    params = _params(body, tok, prompts, None, "messages", limits)
    grammar_field = _constrain(params, body, features)
    params.logprobs, params.prompt_logprobs = chat_logprobs_request(body, features.max_logprobs)
    spec = output_spec(body, features, text, options["extra"])
    forced = forced_schema(body)
    if forced is not None:
        if params.json_schema or params.regex or params.ebnf:
            raise ValidationError(
                "tool_choice required or a named function constrains the output itself: drop "
                "response_format",
                param="tool_choice",
            )
        params.json_schema = forced
        grammar_field = "tool_choice"
    tools_cls = spec.tools if spec is not None else None
    reasoning_cls = spec.reasoning if spec is not None else None
    special = getattr(tools_cls, "needs_special_tokens", False) or getattr(
        reasoning_cls, "needs_special_tokens", False
    )
    if special and body.get("skip_special_tokens") is None:  # the call markup is special tokens
        params.skip_special_tokens = False
    return Plan(
        "chat",
        prompts,
        params,
        n,
        stream,
        include_usage,
        model,
        continuous_usage=continuous,
        output=spec,
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        reasoning_fields=features.reasoning_fields(),
        prompt_logprobs=params.prompt_logprobs is not None,
        grammar_field=grammar_field,
        **extras,
    )


def render_conversation(
    body: Mapping[str, Any], tok: Tokenizer, features: Features = DEFAULT_FEATURES
) -> tuple[str, dict[str, Any]]:
    """A chat request's ``messages`` rendered with the template it gets (its prompt text), and
    the ``render_chat`` options used."""
    template = chat_template_for(
        body,
        tok.chat_template,
        features.chat_template,
        trust_request=features.trust_request_chat_template,
    )
    messages = normalize_messages(body["messages"], roles=template_roles(template))
    shape_messages(messages, features.chat_template_content_format, template)
    options = chat_template_options(body)
    text = render_chat(
        template, messages, bos_token=tok.bos_token, eos_token=tok.eos_token, **options
    )
    return text, options


def _constrain(params: SamplingParams, body: Mapping[str, Any], features: Features) -> str | None:
    """The request's structured-output fields onto ``params`` (a 400 when the engine cannot
    constrain decoding); the request field they came from."""
    field, grammar = structured_request(body, supported=features.structured_outputs)
    for name, value in grammar.items():
        setattr(params, name, value)
    return field


def chat_template_options(body: Mapping[str, Any]) -> dict[str, Any]:
    """``render_chat`` keyword arguments from a chat request: ``add_generation_prompt``,
    ``continue_final_message``, ``tools``, ``chat_template_kwargs`` and ``reasoning_effort``
    (passed to the template as vLLM does). Which template renders is ``chat_template_for``'s
    business."""

    def flag(name: str) -> bool | None:
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise ValidationError(f"{name} must be a boolean, got {value!r}", param=name)
        return value

    agp = flag("add_generation_prompt")
    cfm = flag("continue_final_message") is True
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
        "add_generation_prompt": not cfm if agp is None else agp,
        "continue_final_message": cfm,
        "tools": tools,
        "extra": kwargs,
    }


_GENERATE_KEYS = {
    "text",
    "input_ids",
    "sampling_params",
    "stream",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "image_data",
    "lora_path",
    "priority",
}


def parse_generate(
    body: Any,
    tok: Tokenizer,
    model: str,
    *,
    limits: RequestLimits = DEFAULT_LIMITS,
    features: Features = DEFAULT_FEATURES,
) -> Plan:
    """SGLang's ``/generate``: ``text`` or ``input_ids``, ``sampling_params``, ``stream``,
    ``rid`` (one or a batch)."""
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", param=None)
    warn_unknown_fields(body, _GENERATE_KEYS)
    for key in ("image_data", "lora_path"):
        if body.get(key):
            raise ValidationError(f"{key} is not supported by this server", param=key)
    has_text = body.get("text") is not None
    has_ids = body.get("input_ids") is not None
    if has_text == has_ids:
        raise ValidationError("give exactly one of text and input_ids", param="text")
    field_name = "text" if has_text else "input_ids"
    value = body[field_name]
    batch = isinstance(value, list) and (has_text or (value and isinstance(value[0], list)))
    if has_text and not (
        isinstance(value, str)
        or (isinstance(value, list) and all(isinstance(t, str) for t in value))
    ):
        raise ValidationError("text must be a string or a list of strings", param="text")
    if has_ids and not (
        isinstance(value, list)
        and (all(_is_int(v) for v in value) or all(isinstance(v, list) for v in value))
    ):
        raise ValidationError(
            "input_ids must be a list of token ids or a list of such lists", param="input_ids"
        )
    sglang_lp = generate_logprobs_request(body, features.max_logprobs)
    prompts = _prompt_ids(value, tok, field_name, add_special=True)
    _check_choices(len(prompts))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ValidationError(f"stream must be a boolean, got {stream!r}", param="stream")
    sp = body.get("sampling_params")
    if isinstance(sp, list):
        if len(sp) != 1 and len(sp) != len(prompts):
            raise ValidationError(
                "sampling_params must be one object or one per prompt", param="sampling_params"
            )
        if any(x != sp[0] for x in sp):
            raise ValidationError(
                "different sampling_params per prompt are not supported; send separate requests",
                param="sampling_params",
            )
        sp = sp[0]
    check_grammar_params(sp, supported=features.structured_outputs)
    params = SamplingParams.from_dict(sp)
    limit = tok.max_model_len
    longest = max(len(p) for p in prompts)
    if limit and longest >= limit:
        raise ValidationError(
            f"the prompt ({longest} tokens) leaves no room in the context length {limit}",
            param=field_name,
        )
    if params.max_new_tokens is None:
        # ``max_new_tokens: null`` means "no limit": the context length is the limit.
        params.max_new_tokens = (limit - longest) if limit else None
    elif limit and longest + params.max_new_tokens > limit:
        raise ValidationError(
            f"prompt ({longest} tokens) plus max_new_tokens ({params.max_new_tokens}) is "
            f"over the context length {limit}",
            param="max_new_tokens",
        )
    params.normalize(tok, max_stop_str_len=limits.max_stop_str_len)
    params.verify(tok.model_vocab_size)
    if sglang_lp is not None:
        params.logprobs = params.prompt_logprobs = sglang_lp[1]
    rids = body.get("rid")
    if rids is not None:
        rid_list = [rids] if isinstance(rids, str) else rids
        if (
            not isinstance(rid_list, list)
            or len(rid_list) != len(prompts)
            or not all(isinstance(r, str) and r for r in rid_list)
            or len(set(rid_list)) != len(rid_list)
        ):
            raise ValidationError(
                "rid must be a non-empty string, or one distinct string per prompt", param="rid"
            )
        rids = rid_list
    priority = body.get("priority")
    if priority is not None and (not _is_int(priority) or not -(2**31) <= priority < 2**31):
        raise ValidationError(
            f"priority must be a (32-bit) integer, got {priority!r}", param="priority"
        )
    return Plan(
        "generate",
        prompts,
        params,
        1,
        stream,
        False,
        model,
        rids=rids,
        batch=bool(batch),
        priority=priority or 0,
        sglang_logprobs=(
            None if sglang_lp is None else (*sglang_lp, body.get("return_text_in_logprobs") is True)
        ),
    )


def _check_choices(count: int) -> None:
    if count > MAX_CHOICES:
        raise ValidationError(
            f"this request asks for {count} completions; the limit is {MAX_CHOICES}", param="n"
        )


# ---- responses -----------------------------------------------------------------------------------


#: Longest error message sent to a client (the messages quote client input only briefly anyway).
MAX_ERROR_MESSAGE = 1024


def error_body(err: TokenwireError) -> dict[str, Any]:
    """OpenAI's error shape. A client's error (4xx) reads as its bare detail, its kind in
    ``type``; a server error keeps its kind in the message too (where it failed)."""
    message = err.detail if err.status < 500 else str(err)
    if len(message) > MAX_ERROR_MESSAGE:  # never echo a client's input at length
        message = message[: MAX_ERROR_MESSAGE - 3] + "..."
    return {
        "error": {
            "message": message,
            "type": err.error_type,
            "param": err.param,
            "code": err.code if err.code is not None else err.status,
        }
    }


def encode(obj: Any) -> bytes:
    """JSON bytes."""
    return _json.encode(obj)


def sse(obj: Any) -> bytes:
    """One server-sent event."""
    return b"data: " + _json.encode(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def usage(
    prompt_tokens: int,
    completion_tokens: int,
    reasoning_tokens: int | None = None,
    *,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    """OpenAI's usage object (``completion_tokens_details.reasoning_tokens`` when the server
    parses reasoning or the engine counts it; ``prompt_tokens_details.cached_tokens`` when the
    engine reports cached prompt tokens)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def reasoning_count(engine: int, parsed: int | None) -> int | None:
    """Reasoning tokens for the usage: the engine's count when it reports one, else the server's
    parser's (None: neither, and the usage leaves it out)."""
    return engine if engine else parsed


def matched_stop(fr: FinishReason | None) -> Any:
    """SGLang's ``matched_stop``: the stop token id (EOS included), token id sequence, string or
    regex pattern that ended the request; None otherwise."""
    return fr.matched() if fr is not None else None


def finish_fields(fr: FinishReason | None, eos: tuple[int, ...]) -> tuple[str | None, Any]:
    """OpenAI ``finish_reason`` and vLLM ``stop_reason``."""
    if fr is None:
        return None, None
    return fr.openai_finish_reason, fr.stop_reason(eos)


class ChunkWriter:
    """Streaming chunks of one OpenAI response, with the fixed parts serialized once."""

    def __init__(self, plan: Plan, eos: tuple[int, ...]) -> None:
        self.plan = plan
        self.eos = eos
        chat = plan.route == "chat"
        self._head = _json.encode(plan.openai_head(chunk=True))[:-1] + b',"choices":[{"index":'
        self._tail = b',"usage":null}\n\n' if plan.include_usage else b"}\n\n"
        self._chat = chat
        # Per choice: everything before the text, and everything after it.
        key = b',"delta":{"content":' if chat else b',"text":'
        after = (
            b'},"logprobs":null,"finish_reason":null}]'
            if chat
            else (b',"logprobs":null,"finish_reason":null}]')
        )
        self._before: dict[int, bytes] = {}
        self._key = key
        self._after = after + self._tail
        self._after_choices = after
        self._continuous = plan.continuous_usage

    def _usage_tail(self, index: int, completion_tokens: int) -> bytes:
        """Continuous usage: the choice's prompt and its completion tokens so far (vLLM's)."""
        prompt_tokens = len(self.plan.prompts[index // self.plan.n])
        return b',"usage":' + _json.encode(usage(prompt_tokens, completion_tokens)) + b"}\n\n"

    def delta(self, index: int, text: str, completion_tokens: int = 0) -> bytes:
        """An intermediate chunk carrying ``text`` (``completion_tokens`` of the choice so far
        matter only with continuous usage)."""
        before = self._before.get(index)
        if before is None:
            before = self._before[index] = b"data: " + self._head + str(index).encode() + self._key
        if self._continuous:
            return (
                before
                + _json.encode(text)
                + self._after_choices
                + self._usage_tail(index, completion_tokens)
            )
        return before + _json.encode(text) + self._after

    def role(self, index: int) -> bytes:
        """The chat stream's first chunk for a choice: the assistant role."""
        body = b',"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
        tail = self._usage_tail(index, 0) if self._continuous else self._tail
        return b"data: " + self._head + str(index).encode() + body + tail

    def chunk(self, index: int, payload: dict[str, Any], completion_tokens: int = 0) -> bytes:
        """A chunk for choice ``index`` with the given fields (``delta`` or ``text``,
        ``logprobs``, ``finish_reason``...); ``completion_tokens`` of the choice so far matter
        only with continuous usage."""
        body = b"," + _json.encode(payload)[1:-1] + b"}]"
        tail = self._usage_tail(index, completion_tokens) if self._continuous else self._tail
        return b"data: " + self._head + str(index).encode() + body + tail

    def final(
        self,
        index: int,
        text: str,
        fr: FinishReason | None,
        completion_tokens: int = 0,
        *,
        delta: dict[str, Any] | None = None,
        reason: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> bytes:
        """The chunk that ends a choice (chat: ``delta`` replaces the plain content delta;
        ``reason`` overrides the finish reason, as ``tool_calls`` does)."""
        finish, stop_reason = finish_fields(fr, self.eos)
        if delta is None:
            delta = {"content": text} if text else {}
        payload = ({"delta": delta} if self._chat else {"text": text}) | {
            "logprobs": None,
            "finish_reason": reason or finish,
            "stop_reason": stop_reason,
            "matched_stop": matched_stop(fr),
        }
        if extra:
            payload |= extra  # logprobs, prompt_logprobs
        return self.chunk(index, payload, completion_tokens)

    def usage(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        reasoning_tokens: int | None = None,
        *,
        cached_tokens: int = 0,
    ) -> bytes:
        """The last chunk when ``include_usage``: no choices, the usage."""
        counts = usage(
            prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens=cached_tokens
        )
        return sse(self.plan.openai_head(chunk=True) | {"choices": [], "usage": counts})
