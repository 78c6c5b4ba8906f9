"""vLLM V1 EngineCore wire protocol, both sides, as plain functions and structs (no sockets).

What travels (vLLM 0.32/0.33, msgpack through ``msgspec``; see the project's engine notes):

- Handshake (ROUTER bound by the frontend, DEALER per engine with identity = rank as 2 bytes LE):
  the engine sends ``{"status": "HELLO", "local", "headless"}``; the frontend answers with the
  init metadata ``{"addresses": {"inputs", "outputs", ...}, "parallel_config": {}}``; the engine
  connects a DEALER to every input address and a PUSH to every output address, sends its ready
  response (a map) on each input socket, then ``{"status": "READY", ...}`` on the handshake.
- Requests, frontend to engine on the input ROUTER: ``[identity, type, payload]`` with type
  ``ADD`` (an ``EngineCoreRequest`` positional array, its ``SamplingParams`` a map of the
  non-default fields), ``ABORT`` (a list of request ids), ``UTILITY``
  (``[client_index, call_id, method, args]``).
- Outputs, engine to frontend on the output PULL: ``EngineCoreOutputs`` (a positional array of
  per-request ``EngineCoreOutput`` arrays), or the single frame ``ENGINE_CORE_DEAD``.

Decoding is tolerant: fields newer releases append at the end are skipped, fields tokenwire does
not use are left undecoded.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from tokenwire.engine import EngineRequest, LoraAdapter
from tokenwire.messages.errors import CodecError
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.messages.frames import Decoded
from tokenwire.messages.sampling import TOP_K_ALL, SamplingParams
from tokenwire.multimodal.layout import wire_features

__all__ = [
    "ABORT",
    "ADD",
    "ENGINE_CORE_DEAD",
    "FINISH_ABORT",
    "FINISH_ERROR",
    "FINISH_LENGTH",
    "FINISH_REPETITION",
    "FINISH_STOP",
    "UTILITY",
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "EngineEos",
    "OutputBatch",
    "StepOutput",
    "StepOutputs",
    "UtilityOutput",
    "decode_add",
    "decode_array",
    "logprob_arrays",
    "logprobs_lists",
    "logprobs_tensors",
    "prefill_stats_map",
    "scheduler_stats_map",
    "decode_handshake",
    "decode_outputs",
    "decode_ready_response",
    "encode_abort",
    "encode_add",
    "encode_array",
    "encode_handshake",
    "encode_init",
    "encode_outputs",
    "encode_ready_response",
    "encode_utility",
    "engine_index_in",
    "decode_scheduler_stats",
    "prefix_cache_increments",
    "event_times",
    "request_ids_in",
    "scheduler_stats",
    "engine_identity",
    "sampling_params_map",
    "sampling_params_from_map",
]

ADD = b"\x00"
ABORT = b"\x01"
START_DP_WAVE = b"\x02"
UTILITY = b"\x03"
#: The one-frame message a dying engine sends on its output socket.
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"

# vLLM's FinishReason (an IntEnum on the wire).
FINISH_STOP = 0
FINISH_LENGTH = 1
FINISH_ABORT = 2
FINISH_ERROR = 3
FINISH_REPETITION = 4

_encode = msgspec.msgpack.Encoder().encode
_decode_any = msgspec.msgpack.Decoder().decode


def engine_identity(rank: int) -> bytes:
    """The ZMQ identity of data-parallel rank ``rank``."""
    return rank.to_bytes(2, "little")


# ---- handshake -----------------------------------------------------------------------------------


def encode_handshake(status: str, *, local: bool = False, headless: bool = True) -> bytes:
    """An engine's HELLO or READY message."""
    return _encode({"status": status, "local": local, "headless": headless})


def decode_handshake(payload: bytes) -> dict[str, Any]:
    """An engine's HELLO or READY message (``CodecError`` when it is not one)."""
    try:
        msg = _decode_any(payload)
    except msgspec.DecodeError as exc:
        raise CodecError(f"handshake message: {exc}") from None
    if not isinstance(msg, dict) or msg.get("status") not in ("HELLO", "READY"):
        raise CodecError(f"handshake message is not HELLO or READY: {msg!r:.200}")
    return msg


def encode_init(inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
    """The frontend's answer to HELLO: where the engine connects its input and output sockets."""
    return _encode(
        {
            "addresses": {
                "inputs": list(inputs),
                "outputs": list(outputs),
                "coordinator_input": None,
                "coordinator_output": None,
                "frontend_stats_publish_address": None,
            },
            "parallel_config": {},
        }
    )


def decode_init(payload: bytes) -> tuple[list[str], list[str]]:
    """The engine's view of the init metadata: ``(input addresses, output addresses)``."""
    msg = _decode_any(payload)
    try:
        addresses = msg["addresses"]
        return list(addresses["inputs"]), list(addresses["outputs"])
    except (KeyError, TypeError):
        raise CodecError(f"init metadata without addresses: {msg!r:.200}") from None


#: vLLM's version the engine side of this module writes (the layouts are 0.32's).
VLLM_VERSION = "0.32.0"


def encode_ready_response(**fields: Any) -> bytes:
    """An engine's ready response (``EngineCoreReadyResponse`` as a map, every field of vLLM
    0.32's, as a GPU engine with no LoRA, no KV events and no sleep mode fills them)."""
    base: dict[str, Any] = {
        "max_model_len": 4096,
        "num_gpu_blocks": 0,
        "block_size": 16,
        "dp_stats_address": None,
        "dtype": "bfloat16",
        "vllm_version": VLLM_VERSION,
        "world_size": 1,
        "data_parallel_size": 1,
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "decode_context_parallel_size": 1,
        "data_parallel_rank": 0,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "instance_id": "0",
        "supports_lora": False,
        "max_loras": 0,
        "mamba_block_size": None,
        "kv_cache_size_tokens": None,
        "kv_cache_max_concurrency": None,
        "kv_events_config": None,
        "weight_transfer_backend": None,
        "enable_sleep_mode": False,
        "supports_draft_weight_updates": False,
        "effective_attention_block_size": None,
    }
    base.update(fields)
    return _encode(base)


def decode_ready_response(payload: bytes) -> dict[str, Any]:
    """An engine's ready response (empty for engines that send an empty one)."""
    if not payload:
        return {}
    try:
        msg = _decode_any(payload)
    except msgspec.DecodeError as exc:
        raise CodecError(f"the engine's ready response: {exc}") from None
    if not isinstance(msg, dict):
        raise CodecError("the engine's ready response is not a map")
    return msg


# ---- requests ------------------------------------------------------------------------------------


#: The grammar backend vLLM engines are asked to use (vLLM's frontend picks one per request; an
#: engine supports one, chosen by its first constrained request). xgrammar is vLLM's first choice.
STRUCTURED_OUTPUTS_BACKEND = "xgrammar"


@dataclass(frozen=True)
class EngineEos:
    """What vLLM's own frontend derives from the model's configs for every request: the primary
    EOS id (the tokenizer's) and the extra EOS ids of ``generation_config.json``, which it adds to
    ``stop_token_ids`` (so they finish with that id as ``stop_reason``)."""

    eos_token_id: int | None
    extra_eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_ids(cls, eos_token_ids: Sequence[int]) -> EngineEos:
        ids = list(eos_token_ids)
        return cls(ids[0] if ids else None, tuple(ids[1:]))


def sampling_params_map(
    params: SamplingParams,
    prompt_len: int,
    max_model_len: int | None,
    eos: EngineEos,
    *,
    structured_backend: str = STRUCTURED_OUTPUTS_BACKEND,
) -> dict[str, Any]:
    """vLLM's ``SamplingParams`` (non-default fields only) for one tokenwire request. Stop strings
    and regexes stay in the frontend; token-level stops, length and sampling go to the engine."""
    out: dict[str, Any] = {}
    if params.top_k == 1:
        out["temperature"] = 0.0  # greedy: vLLM's argmax path
    else:
        if params.temperature != 1.0:
            out["temperature"] = params.temperature
        if params.top_k != TOP_K_ALL:
            out["top_k"] = params.top_k
    if params.top_p != 1.0:
        out["top_p"] = params.top_p
    if params.min_p != 0.0:
        out["min_p"] = params.min_p
    for key in ("presence_penalty", "frequency_penalty"):
        if getattr(params, key) != 0.0:
            out[key] = getattr(params, key)
    if params.repetition_penalty != 1.0:
        out["repetition_penalty"] = params.repetition_penalty
    if params.sampling_seed is not None:
        out["seed"] = params.sampling_seed
    max_tokens = params.max_new_tokens
    if max_tokens is None:
        max_tokens = max(max_model_len - prompt_len, 0) if max_model_len else 1 << 31
    # vLLM generates at least one token; a request for none (prompt logprobs only) gets one, which
    # the frontend drops.
    out["max_tokens"] = max(max_tokens, 1)
    if params.min_new_tokens:
        out["min_tokens"] = params.min_new_tokens
    stop_ids = list(params.stop_token_ids or [])
    all_stops = set(stop_ids)
    if eos.eos_token_id is not None:
        all_stops.add(eos.eos_token_id)
    if eos.extra_eos_token_ids:
        all_stops.update(eos.extra_eos_token_ids)
        if not params.ignore_eos:
            stop_ids = list(dict.fromkeys([*eos.extra_eos_token_ids, *stop_ids]))
    if stop_ids:
        out["stop_token_ids"] = stop_ids
    if params.ignore_eos:
        out["ignore_eos"] = True
    elif eos.eos_token_id is not None:
        out["_eos_token_id"] = eos.eos_token_id
    if all_stops:
        out["_all_stop_token_ids"] = sorted(all_stops)
    if params.logprob_token_ids:
        out["logprob_token_ids"] = list(params.logprob_token_ids)  # (their count is logprobs)
    elif params.logprobs is not None:
        out["logprobs"] = params.logprobs
    if params.prompt_logprobs is not None:
        out["prompt_logprobs"] = params.prompt_logprobs
    if params.logit_bias:
        out["logit_bias"] = {int(k): float(v) for k, v in params.logit_bias.items()}
    if params.allowed_token_ids is not None:
        out["allowed_token_ids"] = list(params.allowed_token_ids)
    if params.bad_words_token_ids:
        # vLLM's frontend sends bad words tokenized; the engine reads only the ids.
        out["_bad_words_token_ids"] = [list(ids) for ids in params.bad_words_token_ids]
    if params.thinking_token_budget is not None:
        out["thinking_token_budget"] = params.thinking_token_budget
    if params.extra_args:
        out["extra_args"] = dict(params.extra_args)
    if params.repetition_detection:
        out["repetition_detection"] = dict(params.repetition_detection)
    structured = _structured_outputs(params, structured_backend)
    if structured is not None:
        out["structured_outputs"] = structured
    return out


def _structured_outputs(params: SamplingParams, backend: str) -> dict[str, Any] | None:
    out: dict[str, Any]
    if params.json_schema is not None:
        out = {"json": params.json_schema}
    elif params.regex is not None:
        out = {"regex": params.regex}
    elif params.ebnf is not None:
        out = {"grammar": params.ebnf}
    elif params.structural_tag is not None:
        out = {"structural_tag": params.structural_tag}
    else:
        return None
    out["_backend"] = backend  # set by vLLM's own frontend; the engine requires it
    return out


def lora_request(adapter: LoraAdapter) -> list[Any]:
    """vLLM's ``LoRARequest`` (a positional array: name, id, path)."""
    return [adapter.name, adapter.id, adapter.path]


def encode_add(
    request: EngineRequest,
    sampling: dict[str, Any],
    *,
    client_index: int = 0,
    priority: int = 0,
    arrival_time: float | None = None,
    aux: list[Any] | None = None,
) -> bytes:
    """An ``EngineCoreRequest`` payload (the ADD type byte travels as its own frame). A
    multimodal request's tensors go to ``aux`` (a list holding the payload's own slot first):
    they travel as frames after the payload, in that order (vLLM's side buffers)."""
    arrival = time.time() if arrival_time is None else arrival_time
    mm = None
    if request.mm_features:
        if aux is None:
            raise ValueError("a request with mm_features needs aux frames")
        mm = wire_features(request.mm_features, aux)
    fields: list[Any] = [
        request.rid,
        request.prompt_ids,
        mm,  # mm_features
        sampling,
        None,  # pooling_params
        arrival,
        None if request.lora is None else lora_request(request.lora),
        request.cache_salt,
        request.data_parallel_rank,
    ]
    if client_index or priority or request.session_id is not None:
        # prompt_embeds, prompt_is_token_ids, client_index, current_wave, priority
        fields += [None, None, client_index, 0, priority]
    if request.session_id is not None:
        # trace_headers, resumable, external_req_id, reasoning_ended, reasoning_parser_kwargs,
        # abort_immediately, session_id
        fields += [None, False, None, None, None, False, request.session_id]
    return _encode(fields)


def encode_abort(rids: Iterable[str]) -> bytes:
    """An ABORT payload."""
    return _encode(list(rids))


def encode_utility(client_index: int, call_id: int, method: str, args: Sequence[Any]) -> bytes:
    """A UTILITY payload."""
    return _encode([client_index, call_id, method, list(args)])


# ---- engine side of requests ---------------------------------------------------------------------


@dataclass
class AddRequest:
    """A decoded ADD, as an engine sees it."""

    rid: str
    prompt_ids: list[int]
    sampling: dict[str, Any]
    client_index: int = 0
    priority: int = 0
    #: A pooling request's ``PoolingParams`` array (``sampling`` is then empty).
    pooling: list[Any] | None = None
    #: The ``LoRARequest`` (name, id, path), the prefix cache's salt, the session.
    lora: list[Any] | None = None
    cache_salt: str | None = None
    session_id: str | None = None


def decode_add(payload: bytes) -> AddRequest:
    """An ``EngineCoreRequest`` (``CodecError`` if it is not one)."""
    try:
        msg = _decode_any(payload)
    except msgspec.DecodeError as exc:
        raise CodecError(f"ADD: {exc}") from None
    if not isinstance(msg, list) or len(msg) < 9 or not isinstance(msg[0], str):
        raise CodecError("ADD is not an EngineCoreRequest array")
    prompt = msg[1] or []
    sampling = msg[3]
    pooling = msg[4] if isinstance(msg[4], list) else None
    if not isinstance(sampling, dict) and pooling is None:
        raise CodecError("ADD with neither sampling params nor pooling params")
    client_index = msg[11] if len(msg) > 11 and isinstance(msg[11], int) else 0
    priority = msg[13] if len(msg) > 13 and isinstance(msg[13], int) else 0
    lora = msg[6] if isinstance(msg[6], list) and len(msg[6]) >= 3 else None
    salt = msg[7] if isinstance(msg[7], str) else None
    session = msg[20] if len(msg) > 20 and isinstance(msg[20], str) else None
    return AddRequest(
        msg[0], list(prompt), sampling or {}, client_index, priority, pooling, lora, salt, session
    )


def sampling_params_from_map(sp: dict[str, Any]) -> SamplingParams:
    """tokenwire's ``SamplingParams`` for a vLLM sampling-params map (what a mock engine honours:
    length, min length, token stops, EOS only when ``_eos_token_id`` is given, seed, logprobs,
    prompt logprobs and structured outputs)."""
    temperature = float(sp.get("temperature", 1.0))
    top_k = int(sp.get("top_k", 0) or 0)
    params = SamplingParams(
        max_new_tokens=int(sp.get("max_tokens", 16)),
        min_new_tokens=int(sp.get("min_tokens", 0)),
        stop_token_ids=list(sp.get("stop_token_ids") or []) or None,
        ignore_eos=bool(sp.get("ignore_eos", False)) or sp.get("_eos_token_id") is None,
        sampling_seed=sp.get("seed"),
        temperature=1.0 if temperature < 1e-6 else temperature,
        top_k=1 if temperature < 1e-6 else (top_k if top_k > 0 else TOP_K_ALL),
        logprobs=sp.get("logprobs"),
        prompt_logprobs=sp.get("prompt_logprobs"),
    )
    grammar = _grammar_from_map(sp.get("structured_outputs"))
    if grammar is not None:
        setattr(params, *grammar)
    params.normalized = True
    return params


def _grammar_from_map(so: Any) -> tuple[str, str] | None:
    """The ``SamplingParams`` grammar field for vLLM's ``structured_outputs`` map (what any vLLM
    frontend sends: ``json``, ``json_object``, ``regex``, ``choice``, ``grammar`` or
    ``structural_tag``), or None."""
    if not isinstance(so, dict):
        return None
    if so.get("json") is not None:
        value = so["json"]
        return "json_schema", value if isinstance(value, str) else json.dumps(value)
    if so.get("json_object"):
        return "json_schema", '{"type": "object"}'
    if so.get("regex") is not None:
        return "regex", str(so["regex"])
    if so.get("choice"):
        return "regex", "(?:" + "|".join(re.escape(str(c)) for c in so["choice"]) + ")"
    if so.get("grammar") is not None:
        return "ebnf", str(so["grammar"])
    if so.get("structural_tag") is not None:
        return "structural_tag", str(so["structural_tag"])
    return None


# ---- outputs -------------------------------------------------------------------------------------


#: vLLM's extension type for array bytes carried inline.
_RAW_VIEW = 3
#: A field kept undecoded (a nil until the engine sends something else).
_NIL = msgspec.Raw(b"\xc0")


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request's part of an engine step: the fields tokenwire reads (the later ones, prefill
    stats and whatever newer releases append, are skipped undecoded)."""

    request_id: str
    new_token_ids: list[int]
    #: ``LogprobsLists`` / ``LogprobsTensors`` as decoded msgpack (arrays as
    #: ``[dtype, shape, raw bytes or aux frame index]``), or None.
    new_logprobs: Any = None
    new_prompt_logprobs_tensors: Any = None
    pooling_output: Any = None
    finish_reason: int | None = None
    stop_reason: int | str | None = None
    #: The request's scheduler events since its last output (with stats on): ``EngineCoreEvent``
    #: maps (``type``: 1 queued, 2 scheduled, 3 preempted; ``timestamp``: the engine's
    #: monotonic clock), or None.
    events: Any = None
    #: The KV transfer parameters of a request's last output (prefill/decode disaggregation).
    kv_transfer_params: Any = None
    ec_transfer_params: msgspec.Raw = _NIL
    trace_headers: msgspec.Raw = _NIL
    #: On a request's first output: its prefill (``num_cached_tokens``: from the prefix cache).
    prefill_stats: dict[str, Any] | None = None


class UtilityOutput(msgspec.Struct, array_like=True, gc=False):
    """The result of a UTILITY call: ``result`` is ``[type info, value]``."""

    call_id: int
    failure_message: str | None = None
    result: Any = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One message from an engine (``finished_requests`` and the wave fields that follow are
    skipped: DP waves are for MoE engines, and every output says when its request finished)."""

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: msgspec.Raw = _NIL
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == _RAW_VIEW:
        return data
    raise CodecError(f"extension type {code} is not supported (only raw array bytes)")


_outputs_decoder = msgspec.msgpack.Decoder(EngineCoreOutputs, ext_hook=_ext_hook)
_outputs_encoder = msgspec.msgpack.Encoder()


def encode_outputs(outputs: EngineCoreOutputs | StepOutputs) -> bytes:
    """An engine's output message."""
    return _outputs_encoder.encode(outputs)


def decode_outputs(payload: bytes | memoryview) -> EngineCoreOutputs:
    """An engine's output message (``CodecError`` if malformed)."""
    try:
        return _outputs_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CodecError(f"EngineCoreOutputs: {exc}") from None


def scheduler_stats(msg: EngineCoreOutputs) -> tuple[dict[str, Any], float] | None:
    """The message's scheduler stats (``num_running_reqs``, ``num_waiting_reqs``,
    ``kv_cache_usage``, ...) and when the engine took them, by its own clock (the message's
    timestamp; None when the message carries no stats, or stats that are not a map).

    vLLM attaches a step's stats to one frontend's message only: the first with outputs in that
    step, or a stats-only message to client 0 when there are none. With several API servers, each
    holds stats of a different age; the timestamp says which are the newest."""
    if msg.scheduler_stats == _NIL:
        return None
    stats = decode_scheduler_stats(msg.scheduler_stats)
    return None if stats is None else (stats, msg.timestamp)


def decode_scheduler_stats(raw: msgspec.Raw) -> dict[str, Any] | None:
    """A message's scheduler stats as kept undecoded, decoded (None: not a map)."""
    try:
        stats = _decode_any(raw)
    except msgspec.DecodeError:
        return None
    return stats if isinstance(stats, dict) else None


class _PrefixCacheCounts(msgspec.Struct):
    queries: Any = 0
    hits: Any = 0


class _PrefixCacheOnly(msgspec.Struct):
    """The one field of ``SchedulerStats`` read each step; the others are skipped undecoded."""

    prefix_cache_stats: _PrefixCacheCounts | None = None


_decode_prefix_cache = msgspec.msgpack.Decoder(_PrefixCacheOnly).decode


def prefix_cache_increments(raw: msgspec.Raw) -> tuple[int, int]:
    """The ``(queries, hits)`` a step's scheduler stats (kept undecoded) add to the prefix
    cache's counters: 0 for a count that is not an integer, ``(0, 0)`` where the stats or their
    ``prefix_cache_stats`` are not a map."""
    try:
        cache = _decode_prefix_cache(raw).prefix_cache_stats
    except msgspec.DecodeError:  # ValidationError included: not a map, or a field of no map
        return 0, 0
    if cache is None:
        return 0, 0
    q, h = cache.queries, cache.hits
    return (q if isinstance(q, int) else 0), (h if isinstance(h, int) else 0)


#: ``EngineCoreEventType``: QUEUED, SCHEDULED.
EVENT_QUEUED = 1
EVENT_SCHEDULED = 2


#: ``EngineCoreEventType.PREEMPTED``.
EVENT_PREEMPTED = 3


def preemptions(events: Any) -> int:
    """How many PREEMPTED events an output's ``events`` carry."""
    n = 0
    for event in events if isinstance(events, list) else ():
        kind = (
            event.get("type")
            if isinstance(event, dict)
            else (event[0] if isinstance(event, list) and event else None)
        )
        n += kind == EVENT_PREEMPTED
    return n


def event_times(events: Any) -> tuple[float, float]:
    """``(queued, scheduled)`` timestamps from an output's ``events`` (0.0 for one it does not
    carry; the first SCHEDULED counts, as vLLM ignores the rescheduling after a preemption)."""
    queued = scheduled = 0.0
    for event in events if isinstance(events, list) else ():
        if isinstance(event, dict):
            kind, at = event.get("type"), event.get("timestamp")
        elif isinstance(event, list) and len(event) == 2:
            kind, at = event
        else:
            continue
        if not isinstance(at, (int, float)):
            continue
        if kind == EVENT_QUEUED and not queued:
            queued = float(at)
        elif kind == EVENT_SCHEDULED and not scheduled:
            scheduled = float(at)
    return queued, scheduled


def request_ids_in(payload: bytes | memoryview) -> list[str]:
    """The request ids a malformed output message still names (so each can be told), if any."""
    try:
        msg = _decode_any(payload)
    except msgspec.DecodeError:
        return []
    if not isinstance(msg, list) or len(msg) < 2 or not isinstance(msg[1], list):
        return []
    return [o[0] for o in msg[1] if isinstance(o, list) and o and isinstance(o[0], str)]


def engine_index_in(payload: bytes | memoryview) -> int | None:
    """The engine index a malformed output message starts with (its first field), if it can
    still be read: the message is a msgpack array whose first element is a small integer."""
    data = bytes(payload[:16])
    if not data:
        return None
    head = data[0]
    if 0x90 <= head <= 0x9F:
        pos = 1
    elif head == 0xDC:
        pos = 3
    elif head == 0xDD:
        pos = 5
    else:
        return None
    if pos >= len(data):
        return None
    first = data[pos]
    if first <= 0x7F:
        return first
    sizes = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
    size = sizes.get(first)
    if size is None or pos + 1 + size > len(data):
        return None
    return int.from_bytes(data[pos + 1 : pos + 1 + size], "big")


_REPETITION = FinishReason.from_json({"type": "repetition"})

#: Torch dtype names (tensors) as numpy dtypes; numpy arrays carry ``dtype.str`` already.
_TORCH_DTYPES = {"int64": "<i8", "int32": "<i4", "float32": "<f4", "float16": "<f2"}


def decode_array(spec: Any, frames: Sequence[Any]) -> np.ndarray:
    """An array as vLLM's encoder writes it: ``(dtype, shape, data)``, the data inline (raw
    bytes) or the index of one of the message's ``frames`` (vLLM numbers them from the message's
    own frame, 0: the first extra frame is 1)."""
    try:
        dtype, shape, data = spec
        if isinstance(data, int) and not 0 < data < len(frames):
            raise IndexError(f"no frame {data}")
        buf = frames[data] if isinstance(data, int) else data
        if dtype == "bfloat16":
            arr = (np.frombuffer(buf, "<u2").astype("<u4") << 16).view("<f4")
        else:
            arr = np.frombuffer(buf, np.dtype(_TORCH_DTYPES.get(dtype, dtype)))
        return arr.reshape(shape)
    except (TypeError, ValueError, IndexError) as exc:
        raise CodecError(f"array: {exc}") from None


def logprob_arrays(value: Any, frames: Sequence[Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(token ids, logprobs)``, each ``[positions, 1 + top]`` (column 0 the sampled or prompt
    token), from a decoded ``LogprobsLists`` or ``LogprobsTensors`` field; None when it is nil."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) < 2:
        raise CodecError("logprobs are not a (token ids, logprobs, ...) tuple")
    ids = decode_array(value[0], frames)
    lps = decode_array(value[1], frames)
    if ids.ndim != 2 or ids.shape != lps.shape:
        raise CodecError("logprob arrays of different shapes")
    return ids.astype(np.int32, copy=False), lps.astype(np.float32, copy=False)


def logprob_ranks(value: Any, frames: Sequence[Any]) -> np.ndarray | None:
    """The ranks of the sampled or prompt tokens (``[positions]``) a decoded ``LogprobsLists``
    or ``LogprobsTensors`` field carries third, or None."""
    if not isinstance(value, list) or len(value) < 3 or value[2] is None:
        return None
    ranks = decode_array(value[2], frames).reshape(-1)
    return ranks.astype(np.int64, copy=False)


class _Family:
    """One logprob family (``out`` or ``in``) of a step, gathered request by request (with the
    chosen or prompt tokens' ranks when the engine gives them: ``{kind}_rank``, -1 unsaid)."""

    def __init__(self) -> None:
        self.ranks: list[np.ndarray] = []
        self.any_rank = False
        self.lens: list[int] = []
        self.ids: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.top_ids: list[np.ndarray] = []
        self.top_values: list[np.ndarray] = []
        self.poslens: list[int] = []

    def add(
        self, got: tuple[np.ndarray, np.ndarray] | None, top: int, ranks: np.ndarray | None = None
    ) -> None:
        if got is None:
            self.lens.append(0)
            return
        ids, lps = got
        n = ids.shape[0]
        if ranks is not None and len(ranks) >= n:
            self.any_rank = True
            self.ranks.append(ranks[:n])
        else:
            self.ranks.append(np.full(n, -1, dtype=np.int64))
        k = min(top, ids.shape[1] - 1)
        self.lens.append(n)
        self.ids.append(ids[:, 0])
        self.values.append(lps[:, 0])
        self.top_ids.append(ids[:, 1 : 1 + k].reshape(-1))
        self.top_values.append(lps[:, 1 : 1 + k].reshape(-1))
        self.poslens += [k] * n

    def families(self, kind: str) -> dict[str, tuple]:
        if not self.ids:
            return {}
        offsets = np.zeros(len(self.lens) + 1, dtype=np.int64)
        np.cumsum(self.lens, out=offsets[1:])
        values = np.concatenate(self.values)
        ids = np.concatenate(self.ids)
        poslens = np.asarray(self.poslens, dtype=np.int64)
        posoff = np.zeros(len(poslens) + 1, dtype=np.int64)
        np.cumsum(poslens, out=posoff[1:])
        tops = [np.concatenate(self.top_values), np.concatenate(self.top_ids)]
        out = {
            f"{kind}_lp": (offsets.tolist(), [values, ids], None, None),
            f"{kind}_topk": (offsets.tolist(), tops, poslens, posoff),
        }
        if self.any_rank:
            out[f"{kind}_rank"] = (offsets.tolist(), [np.concatenate(self.ranks), ids], None, None)
        return out


class OutputBatch:
    """One output message turned into what the frontend needs: a ``Decoded`` step for the shard,
    the requests the engine failed (``ERROR``), and the requests that are over."""

    __slots__ = ("decoded", "errors", "finished")

    def __init__(self, decoded: Decoded, errors: list[tuple[str, str]], finished: list[str]):
        self.decoded = decoded
        self.errors = errors
        self.finished = finished


def to_batch(
    outputs: Sequence[EngineCoreOutput],
    prompt_lens: dict[str, int],
    max_tokens: dict[str, int | None],
    logprobs: dict[str, tuple[int, int]] | None = None,
    frames: Sequence[Any] = (),
) -> OutputBatch:
    """Columns for the shard from one step's outputs. ``prompt_lens``, ``max_tokens`` and
    ``logprobs`` (top counts for output and prompt tokens, for requests that asked) are the
    frontend's per-request records (the engine does not repeat them); ``frames`` are the
    message's frames (its own first, then the extra ones where large logprob arrays travel). A
    request that asked for no tokens (``max_tokens`` 0: vLLM made one) gets none."""
    n = len(outputs)
    if logprobs is None and not any(max_tokens.get(o.request_id, 1) == 0 for o in outputs):
        # The common step: columns by comprehension, the finished few looked at one by one.
        rids = [o.request_id for o in outputs]
        chunks = [o.new_token_ids for o in outputs]
        codes = [o.finish_reason for o in outputs]
        finishes: list[FinishReason | None] = [None] * n
        errors: list[tuple[str, str]] = []
        finished: list[str] = []
        if codes.count(None) != n:
            failed = []
            for j, code in enumerate(codes):
                if code is not None:
                    rid = rids[j]
                    finished.append(rid)
                    fin = _finish(code, outputs[j], chunks[j], max_tokens.get(rid))
                    if fin is None:
                        errors.append((rid, _error_message(code)))
                        failed.append(j)
                    finishes[j] = fin
            for j in reversed(failed):
                del rids[j], chunks[j], finishes[j]
        tok_lens = list(map(len, chunks))
        total = sum(tok_lens)
        token_ids = np.fromiter(itertools.chain.from_iterable(chunks), np.int32, total)
        get = prompt_lens.get
        prompts = [get(rid, 0) for rid in rids]
        decoded = Decoded(True, rids, tok_lens, token_ids, finishes, prompts)
        return OutputBatch(decoded, errors, finished)
    return _to_batch_general(outputs, prompt_lens, max_tokens, logprobs, frames)


#: Finish codes of requests that end well (their tokens reach the shard).
ENDS = frozenset({FINISH_STOP, FINISH_LENGTH, FINISH_ABORT, FINISH_REPETITION})


def _error_message(code: int) -> str:
    return f"the engine failed the request (finish reason {code})"


def _finish(
    code: int, out: EngineCoreOutput, ids: list[int], max_tokens: int | None
) -> FinishReason | None:
    """tokenwire's finish reason for vLLM's code (None: the request failed, ``ERROR``)."""
    if code == FINISH_STOP:
        reason = out.stop_reason
        if reason is None:  # EOS: the last token
            return FinishReason.stop(ids[-1] if ids else None)
        return FinishReason.stop(reason)
    if code == FINISH_LENGTH:
        return FinishReason.length(max_tokens)
    if code == FINISH_ABORT:
        return FinishReason.abort("aborted by the engine")
    if code == FINISH_REPETITION:
        return _REPETITION
    return None  # FINISH_ERROR, or a code newer than this module


def _to_batch_general(
    outputs: Sequence[EngineCoreOutput],
    prompt_lens: dict[str, int],
    max_tokens: dict[str, int | None],
    logprobs: dict[str, tuple[int, int]] | None,
    frames: Sequence[Any],
) -> OutputBatch:
    """``to_batch`` request by request: logprobs, requests that asked for no tokens."""
    rids: list[str] = []
    tok_lens: list[int] = []
    chunks: list[list[int]] = []
    finishes: list[FinishReason | None] = []
    prompts: list[int] = []
    errors: list[tuple[str, str]] = []
    finished: list[str] = []
    get_prompt = prompt_lens.get
    lp_out: _Family | None = None
    lp_in: _Family | None = None
    for out in outputs:
        rid = out.request_id
        ids = out.new_token_ids
        code = out.finish_reason
        fin: FinishReason | None = None
        if max_tokens.get(rid, -1) == 0:
            ids = []
            if code is not None:
                code = FINISH_LENGTH
        if code is not None:
            finished.append(rid)
            fin = _finish(code, out, ids, max_tokens.get(rid))
            if fin is None:
                errors.append((rid, _error_message(code)))
                continue
        if logprobs is not None and (lp_out is not None or rid in logprobs):
            if lp_out is None or lp_in is None:
                lp_out, lp_in = _Family(), _Family()
                for _ in rids:  # the requests before: none
                    lp_out.add(None, 0)
                    lp_in.add(None, 0)
            top_out, top_in = logprobs.get(rid, (-1, -1))
            got = logprob_arrays(out.new_logprobs, frames) if top_out >= 0 else None
            lp_out.add(None if got is None else (got[0][: len(ids)], got[1][: len(ids)]), top_out)
            prompt_lp = out.new_prompt_logprobs_tensors
            got_in = logprob_arrays(prompt_lp, frames) if top_in >= 0 else None
            ranks_in = logprob_ranks(prompt_lp, frames) if got_in is not None else None
            lp_in.add(got_in, top_in, ranks_in)
        rids.append(rid)
        tok_lens.append(len(ids))
        chunks.append(ids)
        finishes.append(fin)
        prompts.append(get_prompt(rid, 0))
    flat = [t for c in chunks for t in c] if len(chunks) != 1 else chunks[0]
    token_ids = np.array(flat, dtype=np.int32) if flat else np.empty(0, dtype=np.int32)
    families = None
    if lp_out is not None and lp_in is not None:
        families = lp_out.families("out") | lp_in.families("in")
    decoded = Decoded(True, rids, tok_lens, token_ids, finishes, prompts, families or None)
    return OutputBatch(decoded, errors, finished)


# ---- engine side of outputs ----------------------------------------------------------------------


class StepOutput(msgspec.Struct, array_like=True, gc=False):
    """``EngineCoreOutput`` as an engine writes it: every field of vLLM 0.32's layout (an
    ``array_like`` struct is written whole, defaults included, as vLLM's is)."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: Any = None
    new_prompt_logprobs_tensors: Any = None
    pooling_output: Any = None
    finish_reason: int | None = None
    stop_reason: int | str | None = None
    #: ``[{"type": QUEUED (1) | SCHEDULED (2) | PREEMPTED (3), "timestamp": monotonic}]``, on a
    #: request's first output.
    events: list[dict[str, Any]] | None = None
    kv_transfer_params: Any = None
    ec_transfer_params: Any = None
    trace_headers: Any = None
    #: ``PrefillStats`` as a map, on a request's first output.
    prefill_stats: dict[str, int] | None = None
    routed_experts: Any = None
    num_nans_in_logits: int = 0
    mm_cache_miss_hashes: Any = None
    new_sampling_mask: Any = None
    spec_decode_metrics: Any = None
    prompt_token_id_logprobs: Any = None


class StepOutputs(msgspec.Struct, array_like=True, gc=False):
    """``EngineCoreOutputs`` as an engine writes it (all nine fields of vLLM 0.32's)."""

    engine_index: int = 0
    outputs: list[StepOutput] = []
    #: ``SchedulerStats`` as a map (``scheduler_stats_map``).
    scheduler_stats: dict[str, Any] | None = None
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None
    finished_requests: list[str] | None = None
    wave_complete: int | None = None
    start_wave: int | None = None
    #: What a step's message carries (``"default"`` until weights are updated); nil on replies
    #: to utility calls.
    weight_version: str | None = None


#: A step's message's weight version, as an engine whose weights were never updated sets it.
WEIGHT_VERSION = "default"
EVENT_QUEUED = 1
EVENT_SCHEDULED = 2


def prefill_stats_map(prompt_len: int, cached: int = 0) -> dict[str, int]:
    """``PrefillStats`` of a prompt of ``prompt_len`` tokens, ``cached`` of them found cached."""
    return {
        "num_prompt_tokens": prompt_len,
        "num_computed_tokens": prompt_len - cached,
        "num_cached_tokens": cached,
        "num_local_cached_tokens": cached,
        "num_external_cached_tokens": 0,
        "num_cache_creation_tokens": 0,
    }


def scheduler_stats_map(
    running: int,
    waiting: int,
    kv_cache_usage: float,
    *,
    prefix_requests: int = 0,
    prefix_queries: int = 0,
    prefix_hits: int = 0,
    prefix_reset: bool = False,
    running_lora_adapters: dict[str, int] | None = None,
    waiting_lora_adapters: dict[str, int] | None = None,
) -> dict[str, Any]:
    """``SchedulerStats`` as vLLM 0.32's engine writes it: every field, and the prefix-cache
    stats of the requests first scheduled in the step (``reset`` after ``reset_prefix_cache``)."""
    return {
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_skipped_waiting_reqs": 0,
        "num_kv_fetch_reqs_by_stage": {
            "waiting_to_start": 0,
            "in_progress": 0,
            "completed_waiting": 0,
        },
        "step_counter": 0,
        "current_wave": 0,
        "kv_cache_usage": float(kv_cache_usage),
        "iteration_details": None,
        "prefix_cache_stats": {
            "reset": prefix_reset,
            "requests": prefix_requests,
            "queries": prefix_queries,
            "hits": prefix_hits,
            "preempted_requests": 0,
            "preempted_queries": 0,
            "preempted_hits": 0,
            "hits_by_source": {},
        },
        "connector_prefix_cache_stats": None,
        "kv_cache_eviction_events": [],
        "spec_decoding_stats": None,
        "kv_connector_stats": None,
        "ec_connector_stats": None,
        "waiting_lora_adapters": waiting_lora_adapters or {},
        "running_lora_adapters": running_lora_adapters or {},
        "cudagraph_stats": None,
        "perf_stats": None,
    }


#: Arrays at least this large travel as frames of their own (vLLM's
#: ``VLLM_MSGPACK_ZERO_COPY_THRESHOLD``), smaller ones inline.
ZERO_COPY_THRESHOLD = 256


def encode_array(arr: np.ndarray, aux: list[bytes], dtype_name: str | None = None) -> list[Any]:
    """An array as vLLM's encoder writes it: ``[dtype, shape, data]``, the data inline (raw view
    extension) below ``ZERO_COPY_THRESHOLD`` bytes, else the index of a frame appended to
    ``aux`` (index 1 is the frame after the message's own, as vLLM numbers them). Numpy arrays
    name their dtype as numpy does (``<i4``), tensors as torch does (``dtype_name``: ``int32``)."""
    arr = np.ascontiguousarray(arr)
    name = dtype_name or arr.dtype.str
    data = arr.tobytes()
    if len(data) < ZERO_COPY_THRESHOLD:
        return [name, list(arr.shape), msgspec.msgpack.Ext(_RAW_VIEW, data)]
    aux.append(data)
    return [name, list(arr.shape), len(aux)]


def logprobs_lists(
    ids: np.ndarray, logprobs: np.ndarray, ranks: np.ndarray, aux: list[bytes]
) -> list[Any]:
    """vLLM's ``LogprobsLists`` (a step's sampled-token logprobs: ``ids`` and ``logprobs`` of
    shape ``[tokens, 1 + top]``, column 0 the sampled token, ``ranks`` its rank)."""
    return [
        encode_array(ids.astype("<i4", copy=False), aux),
        encode_array(logprobs.astype("<f4", copy=False), aux),
        encode_array(ranks.astype("<i8", copy=False), aux),
        None,
    ]


def logprobs_tensors(
    ids: np.ndarray, logprobs: np.ndarray, ranks: np.ndarray, aux: list[bytes]
) -> list[Any]:
    """vLLM's ``LogprobsTensors`` (prompt logprobs, torch tensors on the wire: one row per
    prompt token after the first)."""
    return [
        encode_array(ids.astype("<i4", copy=False), aux, "int32"),
        encode_array(logprobs.astype("<f4", copy=False), aux, "float32"),
        encode_array(ranks.astype("<i4", copy=False), aux, "int32"),
        None,
        None,
    ]


def outputs_for_step(
    engine_index: int,
    rows: Iterable[tuple[str, list[int], int | None, int | str | None]],
    *,
    stats: dict[str, Any] | None = None,
    timestamp: float | None = None,
) -> StepOutputs:
    """An engine's message for one step: ``(rid, new ids, finish code, stop reason)`` rows, and
    scheduler stats (a ``SchedulerStats`` map)."""
    return StepOutputs(
        engine_index=engine_index,
        outputs=[
            StepOutput(rid, ids, finish_reason=code, stop_reason=reason)
            for rid, ids, code, reason in rows
        ],
        scheduler_stats=stats,
        timestamp=time.monotonic() if timestamp is None else timestamp,
        weight_version=WEIGHT_VERSION,
    )
