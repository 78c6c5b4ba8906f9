"""``EngineCoreRequest.mm_features`` in vLLM 0.32's wire layout, as its ``MsgpackEncoder``
writes a list of ``MultiModalFeatureSpec``: one map per item (``data``, ``modality``,
``identifier``, ``mm_position``, ``mm_hash``), ``data`` a map of field name to
``{"data": tensor, "field": [factory, kwargs]}``, each tensor ``[dtype, shape, data]`` with its
bytes inline (``Ext(3)``) below the zero-copy threshold and otherwise the index of a side buffer
(a frame of its own after the request's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

__all__ = ["ZERO_COPY_THRESHOLD", "Field", "MMFeature", "wire_features"]

#: ``VLLM_MSGPACK_ZERO_COPY_THRESHOLD``'s default: tensors smaller than this travel inline.
ZERO_COPY_THRESHOLD = 256
_RAW_VIEW = 3


@dataclass(frozen=True)
class Field:
    """One processed tensor of an item and how vLLM batches it (``MultiModalFieldConfig``):
    ``flat`` (rows ``slices`` of a concatenation, along ``dim``), ``batched`` (one per item) or
    ``shared``."""

    data: np.ndarray
    kind: str  # "flat" | "batched" | "shared"
    keep_on_cpu: bool = False
    dim: int = 0
    batch_size: int = 1


@dataclass(frozen=True)
class MMFeature:
    """One item's ``MultiModalFeatureSpec``: its processed fields (None when the engine has it
    cached), modality, cache ``identifier`` and ``mm_hash``, and where its placeholder tokens
    are in the prompt."""

    modality: str
    mm_hash: str
    offset: int
    length: int
    fields: dict[str, Field] | None = field(default=None)
    identifier: str | None = None


def _tensor(arr: np.ndarray, aux: list[Any], threshold: int) -> list[Any]:
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if arr.ndim == 0 or arr.nbytes < threshold:
        data: Any = msgspec.msgpack.Ext(_RAW_VIEW, arr.tobytes())
    else:
        data = len(aux)
        aux.append(memoryview(arr).cast("B"))
    return [arr.dtype.name, list(arr.shape), data]


def _field(f: Field, slices: list[list[list[Any]]] | None) -> list[Any]:
    if f.kind == "flat":
        return ["flat", {"keep_on_cpu": f.keep_on_cpu, "slices": slices, "dim": f.dim}]
    if f.kind == "batched":
        return ["batched", {"keep_on_cpu": f.keep_on_cpu}]
    if f.kind == "shared":
        return ["shared", {"keep_on_cpu": f.keep_on_cpu, "batch_size": f.batch_size}]
    raise ValueError(f"unknown field kind {f.kind!r}")


def wire_features(
    features: Sequence[MMFeature], aux: list[Any], threshold: int = ZERO_COPY_THRESHOLD
) -> list[dict[str, Any]]:
    """``features`` as msgpack-ready values; the side buffers are appended to ``aux`` (whose
    length is the index the next one gets: 1 when only the request's own frame precedes).

    A ``flat`` field carries the slices of every item of its modality in the prompt (vLLM's
    field config is the whole prompt's), each item's rows counted one after the other."""
    slices: dict[tuple[str, str], list[list[list[Any]]]] = {}
    for f in features:
        for name, fl in (f.fields or {}).items():
            if fl.kind == "flat":
                rows = slices.setdefault((f.modality, name), [])
                start = rows[-1][0][1] if rows else 0
                rows.append([[start, start + int(fl.data.shape[fl.dim]), None]])
    out = []
    for f in features:
        data = None
        if f.fields is not None:
            data = {
                name: {
                    "data": _tensor(fl.data, aux, threshold),
                    "field": _field(fl, slices.get((f.modality, name))),
                }
                for name, fl in f.fields.items()
            }
        out.append(
            {
                "data": data,
                "modality": f.modality,
                "identifier": f.identifier or f.mm_hash,
                "mm_position": {"offset": f.offset, "length": f.length, "is_embed": None},
                "mm_hash": f.mm_hash,
            }
        )
    return out
