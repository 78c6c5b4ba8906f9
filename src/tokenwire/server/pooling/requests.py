"""The pooling routes' requests, parsed into what the engine is asked (a ``PoolingPlan``) and how
the answer is shaped (``PoolingCall``): vLLM's field names and checks, SGLang's extras. Plain
functions of the JSON body (no I/O; a large body is parsed in a worker thread): every problem is
a ``ValidationError`` naming the field.

- ``/v1/embeddings``: ``input`` (a string, strings, token ids, token-id lists, or chat
  ``messages``: one conversation, or a batch of them, in ``messages`` or ``input``), vLLM's
  ``encoding_format`` (``float``, ``base64``, ``bytes``, ``bytes_only``), ``embed_dtype``,
  ``endianness``, ``dimensions``, ``use_activation``, ``truncate_prompt_tokens``,
  ``truncation_side``, ``padding``, ``add_special_tokens``, the chat template options; SGLang's
  ``rid``, ``lora_path``.
- ``/pooling``: the same inputs, any task the model runs (``task``), outputs raw.
- ``/classify`` and ``/v1/classify``: ``input`` (or ``messages``): labels and probabilities;
  SGLang's reward-model form (``text`` / ``input_ids``) answers as ``/encode`` does.
- ``/score``, ``/v1/score``: ``queries`` with ``documents`` (or ``items``, ``data_1``/``data_2``,
  ``text_1``/``text_2``), 1:1, 1:N or N:N; ``/rerank``, ``/v1/rerank``, ``/v2/rerank``: ``query``,
  ``documents``, ``top_n``, ``return_documents`` (Jina's, Cohere's, SGLang's), ``instruction``
  (SGLang's ``instruct``), ``max_tokens_per_query``, ``max_tokens_per_doc``.
- SGLang's ``/encode``: ``text`` or ``input_ids``, one or a batch, answered one object each.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenwire.chat.render import render_chat
from tokenwire.engine import LoraAdapter
from tokenwire.messages.errors import ValidationError
from tokenwire.pooling import (
    PairTemplate,
    PoolingModel,
    PoolingParams,
    TokenBudget,
    encode_pair,
    pooling_inputs,
    route_task_error,
    score_inputs,
    scoring_kind,
    tokenize_inputs,
)
from tokenwire.pooling.inputs import (
    check_truncation,
    returns_type_ids,
    truncate_text_to_tokens,
)
from tokenwire.pooling.vectors import EMBED_DTYPES, ENDIANNESS
from tokenwire.runtime import DEFAULT_FEATURES, Features
from tokenwire.runtime.models import ServedModels
from tokenwire.runtime.pooling import PoolingPlan
from tokenwire.server.fields import check_model, flag, is_int, lora_path, request_id
from tokenwire.server.fields import warn_unknown_fields as _warn_unknown
from tokenwire.server.openai.parse import render_conversation
from tokenwire.tokenizer import Tokenizer, all_ints

__all__ = [
    "Encoding",
    "PoolingCall",
    "PoolingContext",
    "parse_classify",
    "parse_embeddings",
    "parse_encode",
    "parse_pooling",
    "parse_rerank",
    "parse_score",
]

#: Fields every pooling request may carry (vLLM's ``PoolingBasicRequestMixin``).
_BASIC = {
    "model",
    "user",
    "truncate_prompt_tokens",
    "truncation_side",
    "padding",
    "request_id",
    "priority",
    "mm_processor_kwargs",
    "cache_salt",
}
_CHAT = {
    "messages",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "media_io_kwargs",
    "tools",
    "documents",
}
_ENCODING = {"encoding_format", "embed_dtype", "endianness"}
#: SGLang's extras on its embeddings and rerank routes.
_SGLANG = {"rid", "lora_path"}
_SCORING = {
    "use_activation",
    "max_tokens_per_query",
    "max_tokens_per_doc",
    "instruction",
    "chat_template_kwargs",
}

#: Each route's fields (others are ignored, and logged once).
_EMBEDDINGS_FIELDS = (
    {"input", "dimensions", "use_activation"} | _BASIC | _CHAT | _ENCODING | _SGLANG
)
_POOLING_FIELDS = {"input", "task", "dimensions", "use_activation"} | _BASIC | _CHAT | _ENCODING
_CLASSIFY_FIELDS = {"input", "use_activation"} | _BASIC | _CHAT | _SGLANG
_ENCODE_FIELDS = {"text", "input_ids", "rid", "dimensions", "priority", "lora_path", "model"} | {
    "sampling_params",
    "log_metrics",
    "routing_key",
    "return_prompt_token_ids",
}
_RERANK_FIELDS = (
    {"query", "documents", "top_n", "return_documents", "instruct", "rank_fields"}
    | {"max_chunks_per_doc"}
    | _BASIC
    | _SCORING
    | _SGLANG
)


@dataclass(frozen=True)
class PoolingContext:
    """What parsing reads of the server: the tokenizer, the served names, the model's pooling
    task (None: it pools nothing) and facts, the pooler config's defaults, the output options."""

    tok: Tokenizer
    models: ServedModels | str
    task: str | None
    model: PoolingModel = field(default_factory=PoolingModel)
    supported: tuple[str, ...] = ()
    generates: bool = False
    pooler_config: Mapping[str, Any] = field(default_factory=dict)
    features: Features = DEFAULT_FEATURES
    #: The request id the ``X-Request-Id`` header gives (vLLM's: over ``request_id``).
    header_id: str | None = None

    @property
    def max_len(self) -> int | None:
        return self.tok.max_model_len


@dataclass(frozen=True)
class Encoding:
    """How vectors are written: ``float`` (JSON numbers), ``base64`` (of ``embed_dtype`` bytes
    in ``endianness`` order), ``bytes`` / ``bytes_only`` (a binary body, its metadata in a
    header or none)."""

    format: str = "float"
    embed_dtype: str = "float32"
    endianness: str = "native"


@dataclass
class PoolingCall:
    """One parsed pooling request: the ``plan`` for the engine and how its answer is shaped."""

    route: str
    plan: PoolingPlan
    #: The response's ``id`` (vLLM's ``<prefix>-<request id>``).
    response_id: str
    encoding: Encoding = field(default_factory=Encoding)
    #: Score and rerank: how pairs are scored, how many of the inputs are queries (the rest
    #: documents; bi-encoder and late interaction), the documents' texts.
    scoring: str | None = None
    n_queries: int = 0
    documents: list[str] = field(default_factory=list)
    top_n: int = 0
    return_documents: bool = True
    #: SGLang's ``/encode``: the input was one (an object answers) or a batch (a list), and
    #: the request ids of its inputs.
    batch: bool = True
    rids: list[str] | None = None
    #: The model's labels (``/classify``).
    id2label: Mapping[int, str] = field(default_factory=dict)


# ---- shared field readers ------------------------------------------------------------------------


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", param=None)
    return body


def _opt_int(body: Mapping[str, Any], name: str, *, low: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not is_int(value) or (low is not None and value < low):
        more = f" of at least {low}" if low is not None else ""
        raise ValidationError(f"{name} must be an integer{more}, got {value!r:.40}", param=name)
    return value


def _opt_bool(body: Mapping[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ValidationError(f"{name} must be a boolean, got {value!r:.40}", param=name)
    return value


def _choice(body: Mapping[str, Any], name: str, choices: tuple[str, ...], default: str) -> str:
    value = body.get(name)
    if value is None:
        return default
    if value not in choices:
        raise ValidationError(
            f"{name} must be one of {', '.join(choices)}, got {value!r:.40}", param=name
        )
    return value


def _warn_unknown_fields(body: Mapping[str, Any], allowed: set[str]) -> None:
    _warn_unknown(body, allowed)


def _refuse_removed(body: Mapping[str, Any]) -> None:
    """vLLM's removed pooling parameters, refused as vLLM refuses them."""
    if "normalize" in body:
        raise ValidationError(
            "Parameter `normalize` was removed; use `use_activation` instead.", param="normalize"
        )
    task = body.get("task")
    if task == "score":
        raise ValidationError("`score` task was removed; use `classify` instead.", param="task")
    if task == "encode":
        raise ValidationError(
            "`encode` task was removed; use `token_embed` or `token_classify` instead.",
            param="task",
        )
    for name in ("mm_processor_kwargs", "media_io_kwargs"):
        if body.get(name):
            raise ValidationError(f"{name}: multimodal inputs are not supported", param=name)


def _id(body: Mapping[str, Any], ctx: PoolingContext, prefix: str, key: str = "request_id") -> str:
    given = ctx.header_id
    if given is None and body.get(key) is not None:
        given = request_id(body.get(key), key)
    if given is None and body.get("rid") is not None and isinstance(body.get("rid"), str):
        given = request_id(body["rid"], "rid")
    if given is None:
        given = f"{uuid.uuid4().int & ((1 << 64) - 1):016x}"  # (vLLM's random_uuid)
    return f"{prefix}-{given}"


def _scheduling(
    body: Mapping[str, Any], ctx: PoolingContext
) -> tuple[str, LoraAdapter | None, int, str | None]:
    """The model name a response echoes, the adapter, the priority and the cache salt."""
    name, lora = check_model(body.get("model"), ctx.models)
    if lora is None and body.get("lora_path") is not None:
        lora = lora_path(body, ctx.models)
    priority = _opt_int(body, "priority") or 0
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not 0 < len(salt) <= 1024):
        raise ValidationError(
            "cache_salt must be a non-empty string of at most 1024 characters", param="cache_salt"
        )
    return name, lora, priority, salt


def _encoding(body: Mapping[str, Any]) -> Encoding:
    return Encoding(
        _choice(body, "encoding_format", ("float", "base64", "bytes", "bytes_only"), "float"),
        _choice(body, "embed_dtype", EMBED_DTYPES, "float32"),
        _choice(body, "endianness", ENDIANNESS, "native"),
    )


def _truncation(body: Mapping[str, Any], ctx: PoolingContext) -> tuple[int | None, str | None]:
    keep = check_truncation(body.get("truncate_prompt_tokens"), ctx.max_len)
    side = body.get("truncation_side")
    if side is not None and side not in ("left", "right"):
        raise ValidationError(
            "`truncation_side` must be either 'left' or 'right'.", param="truncation_side"
        )
    return keep, side


def _pad(prompts: list[list[int]], body: Mapping[str, Any], ctx: PoolingContext) -> None:
    """vLLM's ``padding: "max_length"``: each input padded to the context length."""
    padding = body.get("padding")
    if padding is None or padding == "do_not_pad":
        return
    if padding != "max_length":
        raise ValidationError(
            f"padding must be max_length or do_not_pad, got {padding!r:.40}", param="padding"
        )
    tok = ctx.tok
    pad = tok.token_to_id(tok.pad_token) if tok.pad_token else None
    if pad is None:
        raise ValidationError("the tokenizer has no padding token", param="padding")
    if ctx.max_len:
        for ids in prompts:
            ids.extend([pad] * (ctx.max_len - len(ids)))


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str)


def _is_conversation(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_message(m) for m in value)


def _conversations(body: Mapping[str, Any]) -> list[list[Any]] | None:
    """The chat conversations a request carries (vLLM's: ``messages``, one conversation or a
    batch; or the same in ``input``), None when it carries plain inputs."""
    value = body.get("messages")
    field_name = "messages"
    if value is None:
        value = body.get("input")
        field_name = "input"
        if not (
            _is_conversation(value)
            or (isinstance(value, list) and value and all(_is_conversation(c) for c in value))
        ):
            return None
    if _is_conversation(value):
        return [value]
    if isinstance(value, list) and value and all(_is_conversation(c) for c in value):
        if len(value) > 2048:
            raise ValidationError(
                f"{field_name} has {len(value)} conversations; the limit is 2048", param=field_name
            )
        return value
    raise ValidationError(
        f"{field_name} must be a list of chat messages (or a list of such lists)", param=field_name
    )


def _inputs(
    body: Mapping[str, Any], ctx: PoolingContext, *, chat_default_special: bool = False
) -> list[list[int]]:
    """A request's inputs as token ids: chat conversations rendered with the chat template
    (no generation prompt and no extra special tokens by default: vLLM's pooling defaults), or
    ``input``'s texts and token ids; truncated, padded and bounded."""
    keep, side = _truncation(body, ctx)
    budget = TokenBudget()
    conversations = _conversations(body)
    if conversations is not None:
        add_special = flag(body, "add_special_tokens", chat_default_special)
        chat_body = dict(body)
        chat_body.setdefault("add_generation_prompt", False)
        if chat_body["add_generation_prompt"] is None:
            chat_body["add_generation_prompt"] = False
        texts = []
        for conversation in conversations:
            chat_body["messages"] = conversation
            text, _ = render_conversation(chat_body, ctx.tok, ctx.features)
            texts.append(text)
        field_name = "messages" if "messages" in body else "input"
        prompts = tokenize_inputs(
            texts,
            ctx.tok,
            add_special=add_special,
            truncate=keep,
            side=side,
            max_len=ctx.max_len,
            budget=budget,
            field=field_name,
        )
    else:
        if body.get("input") is None:
            raise ValidationError("input is required", param="input")
        items = pooling_inputs(body.get("input"), "input")
        prompts = tokenize_inputs(
            items,
            ctx.tok,
            add_special=flag(body, "add_special_tokens", True),
            truncate=keep,
            side=side,
            max_len=ctx.max_len,
            budget=budget,
            field="input",
        )
    _pad(prompts, body, ctx)
    return prompts


def _need(ctx: PoolingContext, route: str, ok: bool) -> None:
    if not ok:
        raise route_task_error(route, ctx.task, ctx.generates)


# ---- the routes ----------------------------------------------------------------------------------


def parse_embeddings(body: Any, ctx: PoolingContext) -> PoolingCall:
    """``POST /v1/embeddings``."""
    body = _object(body)
    _warn_unknown_fields(body, _EMBEDDINGS_FIELDS)
    _refuse_removed(body)
    _need(ctx, "embeddings", ctx.task == "embed")
    name, lora, priority, salt = _scheduling(body, ctx)
    encoding = _encoding(body)
    params = PoolingParams.resolve(
        "embed",
        dimensions=_opt_int(body, "dimensions"),
        use_activation=_opt_bool(body, "use_activation"),
        defaults=ctx.pooler_config,
        model=ctx.model,
        model_name=name,
    )
    prompts = _inputs(body, ctx)
    plan = PoolingPlan("embeddings", prompts, params, name, priority, salt, lora)
    return PoolingCall("embeddings", plan, _id(body, ctx, "embd"), encoding)


def parse_pooling(body: Any, ctx: PoolingContext) -> PoolingCall:
    """``POST /pooling``: any task the model runs (``task``; the model's own by default)."""
    body = _object(body)
    _warn_unknown_fields(body, _POOLING_FIELDS)
    _refuse_removed(body)
    _need(ctx, "pooling", ctx.task is not None)
    if body.get("dimensions") is not None:
        raise ValidationError("dimensions is currently not supported", param="dimensions")
    task = body.get("task") or ctx.task
    assert task is not None
    if task != ctx.task:
        if task not in ctx.supported:
            raise ValidationError(
                f"Unsupported task: {task!r:.40} Supported tasks: {list(ctx.supported)}",
                param="task",
            )
        raise ValidationError(
            f"Try switching the model's pooling_task via --pooler-config.task {task}.",
            param="task",
        )
    name, lora, priority, salt = _scheduling(body, ctx)
    encoding = _encoding(body)
    params = PoolingParams.resolve(
        task,
        dimensions=None,
        use_activation=_opt_bool(body, "use_activation"),
        defaults=ctx.pooler_config,
    )
    prompts = _inputs(body, ctx)
    plan = PoolingPlan("pooling", prompts, params, name, priority, salt, lora)
    return PoolingCall("pooling", plan, _id(body, ctx, "pooling"), encoding)


def parse_classify(body: Any, ctx: PoolingContext) -> PoolingCall:
    """``POST /classify`` and ``/v1/classify`` (vLLM's and SGLang's OpenAI-style shape), or
    SGLang's reward-model form of ``/classify`` (``text`` / ``input_ids``: answered as
    ``/encode`` answers)."""
    body = _object(body)
    if "input" not in body and "messages" not in body and ("text" in body or "input_ids" in body):
        return parse_encode(body, ctx, task="classify", route="classify")
    _warn_unknown_fields(body, _CLASSIFY_FIELDS)
    _refuse_removed(body)
    _need(ctx, "classify", ctx.task == "classify")
    name, lora, priority, salt = _scheduling(body, ctx)
    params = PoolingParams.resolve(
        "classify",
        dimensions=None,
        use_activation=_opt_bool(body, "use_activation"),
        defaults=ctx.pooler_config,
    )
    prompts = _inputs(body, ctx)
    plan = PoolingPlan("classify", prompts, params, name, priority, salt, lora)
    call = PoolingCall("classify", plan, _id(body, ctx, "classify"))
    call.id2label = ctx.model.id2label
    return call


def parse_encode(
    body: Any, ctx: PoolingContext, *, task: str = "embed", route: str = "encode"
) -> PoolingCall:
    """SGLang's ``POST /encode`` (``text`` or ``input_ids``, one or a batch; ``rid``,
    ``dimensions``, ``priority``, ``lora_path``)."""
    body = _object(body)
    _warn_unknown_fields(body, _ENCODE_FIELDS)
    for refused in ("image_data", "video_data", "audio_data", "input_embeds"):
        if body.get(refused) is not None:
            raise ValidationError(f"{refused}: multimodal inputs are not supported", param=refused)
    _need(ctx, route, ctx.task == task)
    name, lora, priority, salt = _scheduling(body, ctx)
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise ValidationError("give either text or input_ids", param="text")
    field_name = "text" if text is not None else "input_ids"
    value = text if text is not None else ids
    batch = isinstance(value, list) and not (value and all_ints(value))
    if text is not None and isinstance(text, list) and text and all_ints(text):
        raise ValidationError("text must be a string or a list of strings", param="text")
    items = pooling_inputs(value, field_name)
    prompts = tokenize_inputs(
        items, ctx.tok, max_len=ctx.max_len, budget=TokenBudget(), field=field_name
    )
    params = PoolingParams.resolve(
        task,
        dimensions=_opt_int(body, "dimensions") if task == "embed" else None,
        use_activation=None,
        defaults=ctx.pooler_config,
        model=ctx.model,
        model_name=name,
    )
    rid = body.get("rid")
    rids: list[str] | None = None
    if isinstance(rid, list):
        if len(rid) != len(prompts) or not all(isinstance(r, str) and r for r in rid):
            raise ValidationError("rid must be a string or one string per input", param="rid")
        rids = list(rid)
    elif rid is not None:
        request_id(rid, "rid")
        rids = [rid] if len(prompts) == 1 else [f"{rid}_{i}" for i in range(len(prompts))]
    plan = PoolingPlan(route, prompts, params, name, priority, salt, lora)
    if rids is None:
        rids = [f"{plan.id}-{i}" for i in range(len(prompts))] if batch else [plan.id]
    call = PoolingCall("encode", plan, plan.id, batch=batch, rids=rids)
    return call


_SCORE_SHAPES = (
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
    ("text_1", "text_2"),
)


def parse_score(body: Any, ctx: PoolingContext) -> PoolingCall:
    """``POST /score`` and ``/v1/score``."""
    body = _object(body)
    shape = next((s for s in _SCORE_SHAPES if s[0] in body and s[1] in body), None)
    if shape is None:
        raise ValidationError(
            "give queries and documents (or queries and items, data_1 and data_2, text_1 and "
            "text_2)",
            param="queries",
        )
    _warn_unknown_fields(body, set(shape) | _BASIC | _SCORING | {"add_special_tokens"})
    data = score_inputs(body[shape[0]], body[shape[1]], shape)
    return _scoring("score", body, ctx, data.queries, data.documents, shape[1])


def parse_rerank(body: Any, ctx: PoolingContext) -> PoolingCall:
    """``POST /rerank``, ``/v1/rerank`` and ``/v2/rerank`` (Jina's and Cohere's shape)."""
    body = _object(body)
    _warn_unknown_fields(body, _RERANK_FIELDS)
    if "query" not in body:
        raise ValidationError("query is required", param="query")
    if "documents" not in body:
        raise ValidationError("documents is required", param="documents")
    top_n = _opt_int(body, "top_n", low=0) or 0
    if body.get("instruct") is not None and body.get("instruction") is None:
        body = {**body, "instruction": body["instruct"]}
    data = score_inputs(body["query"], body["documents"], ("query", "documents"))
    if len(data.queries) != 1:
        raise ValidationError("query must be one string", param="query")
    call = _scoring("rerank", body, ctx, data.queries, data.documents, "documents")
    call.top_n = top_n
    call.return_documents = flag(body, "return_documents", True)
    return call


def _scoring(
    route: str,
    body: Mapping[str, Any],
    ctx: PoolingContext,
    queries: list[str],
    docs: list[str],
    doc_field: str,
) -> PoolingCall:
    """Score and rerank: each document with its query, as the model scores pairs."""
    _refuse_removed(body)
    kind = scoring_kind(ctx.task, ctx.model)
    _need(ctx, route, kind is not None)
    assert ctx.task is not None
    name, lora, priority, salt = _scheduling(body, ctx)
    limits = []
    for key in ("max_tokens_per_query", "max_tokens_per_doc"):
        value = _opt_int(body, key, low=0) or 0
        if value and ctx.max_len is not None and value >= ctx.max_len:
            raise ValidationError(
                f"{key} ({value}) must be less than max_model_len ({ctx.max_len}).", param=key
            )
        limits.append(value)
    per_query, per_doc = limits
    keep, side = _truncation(body, ctx)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValidationError(
            "chat_template_kwargs must be an object", param="chat_template_kwargs"
        )
    instruction = body.get("instruction")
    if instruction is not None:
        if not isinstance(instruction, str):
            raise ValidationError("instruction must be a string", param="instruction")
        kwargs = {"instruction": instruction, **(kwargs or {})}
    params = PoolingParams.resolve(
        ctx.task,
        dimensions=None,
        use_activation=_opt_bool(body, "use_activation"),
        defaults=ctx.pooler_config,
    )
    tok = ctx.tok
    budget = TokenBudget()
    call = PoolingCall(route, PoolingPlan(route, [], params), _id(body, ctx, "score"))
    call.scoring = kind
    call.documents = docs
    if kind == "cross-encoder":
        template = _pair_template(ctx, kwargs)
        prompts: list[list[int]] = []
        per_pair: list[PoolingParams] = []
        pairs = list(zip(queries * len(docs) if len(queries) == 1 else queries, docs))
        for q, d in pairs:
            if per_query:
                q = truncate_text_to_tokens(tok, q, per_query)
            if per_doc and not template.use_sep_token:
                d = truncate_text_to_tokens(tok, d, per_doc)
            ids, first_b = encode_pair(
                tok,
                q,
                d,
                template,
                truncate=keep,
                max_len=ctx.max_len,
                max_tokens_per_doc=per_doc if template.use_sep_token else 0,
                field=doc_field,
            )
            budget.take(len(ids), doc_field)
            prompts.append(ids)
            extra = {"compressed_token_type_ids": first_b} if first_b is not None else None
            per_pair.append(PoolingParams(params.task, None, params.use_activation, extra))
        call.plan = PoolingPlan(route, prompts, per_pair, name, priority, salt, lora)
        return call
    # Bi-encoder and late interaction: queries and documents pooled apart, then compared.
    if per_query:
        queries = [truncate_text_to_tokens(tok, q, per_query) for q in queries]
    if per_doc:
        docs = [truncate_text_to_tokens(tok, d, per_doc) for d in docs]
    prompts = tokenize_inputs(
        [*queries, *docs],
        tok,
        truncate=keep,
        side=side,
        max_len=ctx.max_len,
        budget=budget,
        field=doc_field,
    )
    call.plan = PoolingPlan(route, prompts, params, name, priority, salt, lora)
    call.n_queries = len(queries)
    return call


def _pair_template(ctx: PoolingContext, kwargs: Mapping[str, Any] | None) -> PairTemplate:
    """How the model's pairs are built: the score template ``--chat-template`` gives (vLLM
    applies one only when given), else the tokenizer's pair encoding or the two texts joined."""
    template = ctx.features.chat_template
    render = None
    if template is not None:
        reserved = {"chat_template", "tools", "tokenize"} & set(kwargs or {})
        if reserved:
            raise ValidationError(
                "chat_template_kwargs contains reserved keys that conflict with fixed scorer "
                f"arguments: {sorted(reserved)}",
                param="chat_template_kwargs",
            )
        tok = ctx.tok
        extra = dict(kwargs or {})

        def render(query: str, doc: str) -> str:
            messages = [{"role": "query", "content": query}, {"role": "document", "content": doc}]
            return render_chat(
                template,
                messages,
                bos_token=tok.bos_token,
                eos_token=tok.eos_token,
                add_generation_prompt=False,
                extra=extra,
            )

    return PairTemplate(ctx.model.use_sep_token, returns_type_ids(ctx.tok), render)
