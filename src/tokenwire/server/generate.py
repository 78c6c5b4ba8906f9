"""SGLang's native ``/generate``: a request (``text`` or ``input_ids``, ``sampling_params``,
``stream``, ``rid``, one or a batch) as a ``Plan``, and its answers in SGLang's shape (streamed
chunks carry the text and output ids so far; the last ``meta_info`` carries ``matched_stop``,
``cached_tokens`` and ``reasoning_tokens``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenwire.messages.egress import Done, Error, Frame
from tokenwire.messages.errors import ValidationError
from tokenwire.messages.sampling import SamplingParams
from tokenwire.multimodal import MediaItem, MediaLimits
from tokenwire.multimodal.parts import generate_media
from tokenwire.runtime import DEFAULT_FEATURES, Features, Plan, Runtime
from tokenwire.runtime.models import ServedModels
from tokenwire.server.config import DEFAULT_LIMITS, RequestLimits
from tokenwire.server.extras import (
    ENGINE_FIELDS,
    INFORMATIONAL,
    REFUSED,
    check_refused,
    check_special_spacing,
    engine_fields,
)
from tokenwire.server.fields import (
    check_choices,
    flag,
    is_int,
    lora_path,
    prompt_ids,
    warn_unknown_fields,
)
from tokenwire.server.http import SSE_DONE, sse
from tokenwire.server.logprobs import GenerateLogprobs, TokenStrings, generate_logprobs_request
from tokenwire.server.streaming import (
    Gathered,
    Streamer,
    Subs,
    count_finish,
    gather,
    matched_stop,
    serve_plan,
)
from tokenwire.structured import check_grammar_params
from tokenwire.tokenizer import Tokenizer, all_ints

if TYPE_CHECKING:
    from tokenwire.server.app import App, Handler

__all__ = [
    "DEFAULT_GENERATE_MAX_NEW_TOKENS",
    "ROUTES",
    "GenerateStreamer",
    "generate",
    "parse_generate",
]

#: SGLang's default ``max_new_tokens`` for ``/generate``.
DEFAULT_GENERATE_MAX_NEW_TOKENS = 128

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
    "lora_path",
    "priority",
    "return_prompt_token_ids",
    "modalities",
    "image_data",
    "audio_data",
    "video_data",
    "mm_processor_kwargs",
    *REFUSED,
    *ENGINE_FIELDS,
    *INFORMATIONAL,
}


def _with_placeholders(
    value: str | list[str], media: list[list[MediaItem]], placeholders: Mapping[str, str]
) -> str | list[str]:
    """Each text prompt with its media's placeholders put first, when it names none of them."""
    texts = [value] if isinstance(value, str) else list(value)
    for p, items in enumerate(media[: len(texts)]):
        marks = [placeholders[i.modality] for i in items if i.modality in placeholders]
        if marks and not any(m in texts[p] for m in set(marks)):
            texts[p] = "".join(marks) + texts[p]
    return texts[0] if isinstance(value, str) else texts


def parse_generate(
    body: Any,
    tok: Tokenizer,
    model: str | ServedModels,
    *,
    limits: RequestLimits = DEFAULT_LIMITS,
    features: Features = DEFAULT_FEATURES,
) -> Plan:
    """SGLang's ``/generate``: ``text`` or ``input_ids``, ``sampling_params``, ``stream``,
    ``rid`` (one or a batch)."""
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", param=None)
    warn_unknown_fields(body, _GENERATE_KEYS)
    check_refused(body)
    if body.get("modalities") not in (None, [], ["text"]):
        raise ValidationError("modalities other than text are not supported", param="modalities")
    lora = lora_path(body, model)
    if lora is not None and "lora" not in features.engine_fields:
        raise ValidationError(
            "LoRA adapters need an engine that serves them; this server's engine does not",
            param="lora_path",
        )
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
        isinstance(value, list) and (all_ints(value) or all(isinstance(v, list) for v in value))
    ):
        raise ValidationError(
            "input_ids must be a list of token ids or a list of such lists", param="input_ids"
        )
    sglang_lp = generate_logprobs_request(body, features.max_logprobs)
    media = generate_media(body)
    if media is not None and not any(media):
        media = None
    if has_text and media is not None and features.media is not None:
        value = _with_placeholders(value, media, features.media.placeholders)
    prompts = prompt_ids(value, tok, field_name, add_special=True)
    if media is not None:
        if len(media) != len(prompts):
            raise ValidationError(
                f"{len(media)} lists of media for {len(prompts)} prompts", param="image_data"
            )
        limits_of = features.media_limits or MediaLimits(frozenset())
        for items in media:
            limits_of.check(items, param=items[0].field.split("[")[0] if items else "image_data")
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
    params = SamplingParams.from_dict(_with_defaults(sp, features))
    n = params.n
    if n < 1:
        raise ValidationError(f"n must be at least 1, got {n}", param="n")
    params.n = 1  # (SGLang's parallel sampling: n requests per prompt, fanned out here)
    check_choices(len(prompts) * n)
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
    check_special_spacing(params, tok, "spaces_between_special_tokens")
    if sglang_lp is not None:
        params.logprobs = params.prompt_logprobs = sglang_lp[1]
    engine_kw = engine_fields(body, tok, features, params)
    by_ids = params.logprob_token_ids is not None
    if by_ids:
        if sglang_lp is None:
            raise ValidationError(
                "token_ids_logprob needs return_logprob: true", param="token_ids_logprob"
            )
        params.logprobs = len(params.logprob_token_ids or ())
        sglang_lp = (sglang_lp[0], 0)
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
    if priority is not None and (not is_int(priority) or not -(2**31) <= priority < 2**31):
        raise ValidationError(
            f"priority must be a (32-bit) integer, got {priority!r}", param="priority"
        )
    extra: dict[str, Any] = {}
    if n > 1:  # the samples get rids of their own (the client's rid as their prefix)
        if rids is not None:
            if len(rids) != 1:
                raise ValidationError(
                    "with n > 1, rid must be one string (the samples are rid-0, rid-1, ...)",
                    param="rid",
                )
            extra["id"] = rids[0]
        rids = None
    return Plan(
        "generate",
        prompts,
        params,
        n,
        stream,
        False,
        model if isinstance(model, str) else model.primary,
        rids=rids,
        batch=bool(batch) or n > 1,
        priority=priority or 0,
        sglang_logprobs=(
            None if sglang_lp is None else (*sglang_lp, body.get("return_text_in_logprobs") is True)
        ),
        sglang_logprobs_by_ids=by_ids,
        lora=lora,
        return_prompt_token_ids=flag(body, "return_prompt_token_ids", False),
        media=media,
        media_options=_generate_media_options(body) if media is not None else {},
        **engine_kw,
        **extra,
    )


def _generate_media_options(body: dict[str, Any]) -> dict[str, Any]:
    kwargs = body.get("mm_processor_kwargs")
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise ValidationError("mm_processor_kwargs must be an object", param="mm_processor_kwargs")
    return {"mm_processor_kwargs": kwargs}


def _with_defaults(sp: Any, features: Features) -> Any:
    """``sampling_params`` with the model's generation defaults for the sampling values it omits
    (as SGLang's preferred sampling params; ``max_new_tokens`` keeps SGLang's default)."""
    defaults = features.generation_defaults.values
    if not defaults or (sp is not None and not isinstance(sp, dict)):
        return sp
    out = dict(sp or {})
    for key, value in defaults.items():
        if key != "max_new_tokens" and out.get(key) is None:
            out[key] = value
    return out


async def collect_generate(rt: Runtime, plan: Plan, subs: Subs) -> tuple[int, Any]:
    got = await gather(rt, subs)
    if not isinstance(got, Gathered):
        return got
    out = [
        _generate_body(rid, "".join(got.texts[k]), got.ids[k], got.finals[k], plan, plan.prompts[p])
        for k, (rid, p, _) in enumerate(subs)
    ]
    shapers = _generate_logprobs(rt, plan, subs)
    if shapers is not None:
        for k, body in enumerate(out):
            extras = [e for x in got.extras[k] for e in (x if isinstance(x, list) else [x])]
            shapers[k].take(got.ids[k], extras)
            body["meta_info"] |= shapers[k].meta()
    return 200, (out if plan.batch else out[0])


def _generate_logprobs(rt: Runtime, plan: Plan, subs: Subs) -> list[GenerateLogprobs] | None:
    """Per request of a ``/generate`` call, its logprob lists, when ``return_logprob``."""
    if plan.sglang_logprobs is None:
        return None
    start, top, with_text = plan.sglang_logprobs
    strings = TokenStrings(rt.tokenizer)
    by_ids = plan.sglang_logprobs_by_ids
    return [
        GenerateLogprobs(strings, plan.prompts[p], start, top, with_text, by_ids=by_ids)
        for _, p, _ in subs
    ]


def _generate_body(
    rid: str, text: str, ids: list[int], final: Any, plan: Plan, prompt: list[int]
) -> dict:
    """SGLang's response shape; the last one of a request also carries ``cached_tokens``,
    ``reasoning_tokens`` and ``matched_stop``."""
    fr = final.finish_reason if final is not None else None
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": fr.to_json() if fr is not None else None,
        "prompt_tokens": len(prompt),
        "completion_tokens": final.completion_tokens if final is not None else len(ids),
    }
    if final is not None:
        meta["cached_tokens"] = final.cached_tokens
        meta["reasoning_tokens"] = final.reasoning_tokens
        meta["matched_stop"] = matched_stop(fr)
    out = {"text": text, "output_ids": ids, "meta_info": meta}
    if plan.return_prompt_token_ids:
        out["prompt_token_ids"] = prompt
    return out


class GenerateStreamer(Streamer):
    """SGLang's streaming: every chunk carries the text and output ids so far."""

    def __init__(self, rt: Runtime, plan: Plan, subs: Subs) -> None:
        super().__init__(rt, subs)
        self.plan = plan
        self.texts = ["" for _ in subs]
        self.ids: list[list[int]] = [[] for _ in subs]
        self.logprobs = _generate_logprobs(rt, plan, subs)

    def feed(self, batch: list[tuple[int, Any]]) -> bytes:
        """SSE bytes for a batch of items. Each chunk carries everything so far, so of a
        choice's items that wait together only the last makes one (as SGLang's streams take
        only their newest output)."""
        self.tracker.chunk()
        out: list[bytes] = []
        last = len(batch) - 1
        for k, (index, item) in enumerate(batch):
            if isinstance(item, Error):
                out.append(self.error(item.error))
                break
            self.texts[index] += item.text
            self.ids[index].extend(item.token_ids)
            if self.logprobs is not None:
                self.logprobs[index].take(item.token_ids, item.extras)
            if (
                k < last
                and batch[k + 1][0] == index
                and isinstance(item, Frame)
                and not isinstance(batch[k + 1][1], Error)
            ):
                continue  # the choice's next item says it all, and more
            rid, p, _ = self.subs[index]
            final = item if isinstance(item, Done) else None
            body = _generate_body(
                rid, self.texts[index], self.ids[index], final, self.plan, self.plan.prompts[p]
            )
            if self.logprobs is not None:
                body["meta_info"] |= self.logprobs[index].meta()
            if final is None:
                body["meta_info"]["completion_tokens"] = item.completion_tokens
            else:
                self.open.discard(index)
                count_finish(self.rt, final, self.tracker, self.texts[index])
            if self.plan.batch:
                body["index"] = index
            out.append(sse(body) + (SSE_DONE if not self.open else b""))
        return b"".join(out)


async def generate(app: App, receive: Any, send: Any) -> None:
    """``POST /generate``."""
    rt = app.runtime
    config = app.config

    def plan_of(body: Any) -> Plan:
        return parse_generate(
            body, rt.tokenizer, rt.models, limits=config.limits, features=rt.features
        )

    def streamer(plan: Plan, subs: Subs) -> GenerateStreamer:
        return GenerateStreamer(rt, plan, subs)

    def gathered(plan: Plan, subs: Subs) -> Any:
        return collect_generate(rt, plan, subs)

    await serve_plan(rt, receive, send, "generate", plan_of, streamer, gathered)


ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "/generate"): generate,
    ("PUT", "/generate"): generate,  # (SGLang serves both)
}
