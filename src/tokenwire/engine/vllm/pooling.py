"""Pooling over vLLM's EngineCore protocol, both sides, as plain functions (no sockets).

- A pooling ADD is an ``EngineCoreRequest`` with no sampling params and vLLM's
  ``PoolingParams`` (a positional array: ``use_activation, dimensions, step_tag_id,
  returned_token_ids, task, requires_token_ids, skip_reading_prefix_cache,
  late_interaction_params, extra_kwargs, output_kind``, trailing defaults left out) filled as
  vLLM's frontend fills them (``PoolingParams.verify``: the task set, activation resolved,
  ``skip_reading_prefix_cache`` false except for the token-wise tasks).
- Its output is the request's one ``EngineCoreOutput`` with ``pooling_output`` set (a tensor:
  ``[dtype, shape, data]``, the data inline below 256 bytes, else the index of one of the
  message's extra frames) and finish reason ``STOP``. ``pooled_outputs`` takes a message's
  pooling outputs out (float32 views of the frames, no copy) and leaves the rest.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from tokenwire.engine.pooling import Pooled, PoolingRequest
from tokenwire.engine.vllm import protocol as wire
from tokenwire.messages.errors import CodecError
from tokenwire.pooling.params import PoolingParams

__all__ = [
    "decode_pooling_params",
    "encode_pooling_add",
    "pooled_outputs",
    "pooling_output",
    "pooling_params_array",
]

#: vLLM's ``RequestOutputKind.FINAL_ONLY`` (a pooling request's only kind).
_FINAL_ONLY = 2
#: Defaults of the ``PoolingParams`` fields, in order (trailing ones equal to these are left out).
_DEFAULTS: tuple[Any, ...] = (None, None, None, None, None, False, None, None, None, _FINAL_ONLY)


def pooling_params_array(params: PoolingParams) -> list[Any]:
    """vLLM's ``PoolingParams`` for ``params``, as its frontend sends them."""
    token_wise = params.task.startswith("token_")
    fields: list[Any] = [
        params.use_activation,
        params.dimensions,
        None,  # step_tag_id
        None,  # returned_token_ids
        params.task,
        False,  # requires_token_ids
        token_wise,  # skip_reading_prefix_cache
        None,  # late_interaction_params
        dict(params.extra_kwargs) if params.extra_kwargs else None,
    ]
    while fields and fields[-1] == _DEFAULTS[len(fields) - 1]:
        fields.pop()
    return fields


def decode_pooling_params(value: Any) -> PoolingParams:
    """tokenwire's ``PoolingParams`` from vLLM's array (what a mock engine reads)."""
    if not isinstance(value, list):
        raise CodecError("pooling params are not a PoolingParams array")
    fields = list(value) + list(_DEFAULTS[len(value) :])
    use_activation, dimensions, _, _, task, _, _, _, extra = fields[:9]
    if not isinstance(task, str):
        raise CodecError("pooling params without a task")
    return PoolingParams(
        task,
        dimensions if isinstance(dimensions, int) else None,
        True if use_activation is None else bool(use_activation),
        extra if isinstance(extra, dict) else None,
    )


def encode_pooling_add(
    request: PoolingRequest,
    *,
    client_index: int = 0,
    arrival_time: float | None = None,
) -> bytes:
    """An ``EngineCoreRequest`` payload for one input to pool."""
    fields: list[Any] = [
        request.rid,
        request.prompt_ids,
        None,  # mm_features
        None,  # sampling_params
        pooling_params_array(request.params),
        time.time() if arrival_time is None else arrival_time,
        None if request.lora is None else wire.lora_request(request.lora),
        request.cache_salt,
        None,  # data_parallel_rank
    ]
    if client_index or request.priority:
        # prompt_embeds, prompt_is_token_ids, client_index, current_wave, priority
        fields += [None, None, client_index, 0, request.priority]
    return wire._encode(fields)


def pooling_output(spec: Any, frames: Sequence[Any]) -> np.ndarray:
    """An output tensor as float32 (a view of the frame's bytes when it is float32 already)."""
    arr = wire.decode_array(spec, frames)
    if arr.dtype != np.float32:
        arr = arr.astype(np.float32)
    return arr


def pooled_outputs(
    outputs: Sequence[Any],
    frames: Sequence[Any],
    pooling: Collection[str],
    engine: int = 0,
) -> tuple[list[Any], Pooled | None]:
    """A message's outputs split: those of other requests (in order), and the pooling requests'
    (those in ``pooling``) as one ``Pooled`` (None when there are none). An output that ends
    without a tensor, or with ``ERROR`` or ``ABORT``, is an error of its request."""
    rest: list[Any] = []
    rids: list[str] = []
    data: list[np.ndarray] = []
    errors: list[tuple[str, str]] = []
    for out in outputs:
        rid = out.request_id
        if rid not in pooling:
            rest.append(out)
            continue
        code = out.finish_reason
        if out.pooling_output is None:
            if code is not None:
                errors.append((rid, f"the engine ended the request with no output ({code})"))
            continue  # (a step that had nothing for it yet)
        if code not in (None, wire.FINISH_STOP, wire.FINISH_LENGTH):
            errors.append((rid, f"the engine failed the request (finish reason {code})"))
            continue
        try:
            data.append(pooling_output(out.pooling_output, frames))
        except CodecError as exc:
            errors.append((rid, f"undecodable pooling output: {exc}"))
            continue
        rids.append(rid)
    if not rids and not errors:
        return rest, None
    return rest, Pooled(rids, data, errors, engine)
