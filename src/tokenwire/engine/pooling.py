"""Pooling at the engine boundary: the request (``PoolingRequest``), the outputs (``Pooled``),
and how an engine says what it can pool.

An engine that pools has, besides the ``Engine`` protocol:

- ``supported_tasks: tuple[str, ...]``: vLLM's ``get_supported_tasks`` (``"generate"`` and
  pooling tasks: ``"embed"``, ``"classify"``, ``"token_embed"``, ``"token_classify"``); read
  after ``start`` (a vLLM engine learns its tasks from the engine processes);
- ``submit_pooling(request)``: like ``submit``, and ``abort(rid)`` drops it too;
- optionally ``pooling_model``: a ``tokenwire.pooling.PoolingModel`` describing its outputs
  (the synthetic engine's; a vLLM engine's come from the model's config).

Its outputs go to the same ``output`` callback as its frames: a ``Pooled`` per engine step,
columnar (the step's request ids, one array each: a vector for ``embed``/``classify``, one row
per token for the ``token_*`` tasks, float32 views of the engine's own buffers where it can),
and the requests the engine failed. A request that fails as a whole (its engine died) gets an
error frame, as a generation does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenwire.engine import LoraAdapter
from tokenwire.pooling.params import PoolingParams
from tokenwire.pooling.tasks import POOLING_TASKS

__all__ = [
    "DEFAULT_TASKS",
    "Pooled",
    "PoolingRequest",
    "engine_pooling_tasks",
    "engine_supported_tasks",
]

#: What an engine that does not say supports.
DEFAULT_TASKS = ("generate",)


@dataclass(frozen=True)
class PoolingRequest:
    """One input to pool: ``prompt_ids`` (validated, within the context), its ``params``, and
    what ``EngineRequest`` also carries for scheduling."""

    rid: str
    prompt_ids: list[int]
    params: PoolingParams
    priority: int = 0
    cache_salt: str | None = None
    lora: LoraAdapter | None = None


@dataclass
class Pooled:
    """One engine step's pooling outputs: ``rids[i]``'s output is ``data[i]``; ``errors`` are
    ``(rid, message)`` for requests the engine failed."""

    rids: list[str]
    data: list[np.ndarray]
    errors: list[tuple[str, str]] = field(default_factory=list)
    #: The engine (data-parallel rank) that ran them.
    engine: int = 0


def engine_supported_tasks(engine: Any) -> tuple[str, ...]:
    """The tasks ``engine`` runs (its optional ``supported_tasks``; generation by default)."""
    tasks = getattr(engine, "supported_tasks", None)
    if tasks is None:
        return DEFAULT_TASKS
    return tuple(str(t) for t in tasks)


def engine_pooling_tasks(engine: Any) -> tuple[str, ...]:
    """The pooling tasks ``engine`` runs (none unless it can ``submit_pooling``)."""
    if not callable(getattr(engine, "submit_pooling", None)):
        return ()
    return tuple(t for t in engine_supported_tasks(engine) if t in POOLING_TASKS)
