"""Pooling requests in flight: what one HTTP request asks to pool (``PoolingPlan``), its inputs
waiting for their outputs (``PoolingJob``), and the table that matches the engine's ``Pooled``
steps to them (``PoolingRequests``).

A job's inputs go to the engine as they come (one engine request each, the engine batches them),
and their outputs are gathered by index as each engine step brings some; the job's future is set
when the last arrives, or fails at the first error, which also drops its other inputs from the
engine. Nothing here waits or touches a socket: the runtime feeds it the engine's outputs and
the HTTP handler awaits the future.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tokenwire.engine import LoraAdapter
from tokenwire.engine.pooling import Pooled
from tokenwire.messages.errors import InternalError, TokenwireError
from tokenwire.pooling.params import PoolingParams

__all__ = ["PoolingJob", "PoolingPlan", "PoolingRequests"]


@dataclass
class PoolingPlan:
    """What one HTTP request asks the engine to pool: ``prompts`` (token ids, validated), the
    ``params`` of all of them (or one each: a cross-encoder's pairs carry where their second
    halves start), and what every engine request carries for scheduling."""

    route: str
    prompts: list[list[int]]
    params: PoolingParams | list[PoolingParams]
    model: str = ""
    priority: int = 0
    cache_salt: str | None = None
    lora: LoraAdapter | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def params_of(self, index: int) -> PoolingParams:
        p = self.params
        return p[index] if isinstance(p, list) else p

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


class PoolingJob:
    """One plan's inputs in flight: ``future`` gets every output, in the order of the plan's
    prompts (an array each: float32, usually views of the engine's buffers)."""

    __slots__ = ("engine", "future", "outputs", "pending", "plan", "rids", "started")

    def __init__(self, plan: PoolingPlan, rids: list[str]) -> None:
        self.plan = plan
        self.rids = rids
        self.outputs: list[np.ndarray | None] = [None] * len(rids)
        self.pending = len(rids)
        self.future: asyncio.Future[list[np.ndarray]] = asyncio.get_running_loop().create_future()
        #: The engine (data-parallel rank) that ran its first output.
        self.engine = 0
        self.started = time.perf_counter()

    @property
    def done(self) -> bool:
        return self.future.done()


class PoolingRequests:
    """Every pooling input in flight, by engine request id. ``abort`` is called with the engine
    ids of a failed job's other inputs (they are dropped from the engine)."""

    def __init__(self, abort: Callable[[str], None]) -> None:
        self._abort = abort
        self._by_rid: dict[str, tuple[PoolingJob, int]] = {}

    def __len__(self) -> int:
        return len(self._by_rid)

    def __contains__(self, rid: object) -> bool:
        return rid in self._by_rid

    def live_rids(self) -> list[str]:
        return list(self._by_rid)

    def add(self, job: PoolingJob) -> None:
        for i, rid in enumerate(job.rids):
            self._by_rid[rid] = (job, i)

    def on_pooled(self, step: Pooled) -> None:
        """One engine step's outputs, each to its job (a job complete when its last arrives)."""
        by_rid = self._by_rid
        for rid, data in zip(step.rids, step.data):
            entry = by_rid.pop(rid, None)
            if entry is None:
                continue  # (its job failed or was given up: the engine finished it anyway)
            job, index = entry
            job.outputs[index] = data
            if job.pending == len(job.rids):
                job.engine = step.engine
            job.pending -= 1
            if job.pending == 0 and not job.future.done():
                job.future.set_result(job.outputs)  # type: ignore[arg-type]
        for rid, message in step.errors:
            self.fail(rid, InternalError(f"engine: {message}"))

    def fail(self, rid: str, error: TokenwireError) -> None:
        """Input ``rid`` failed: its job fails with ``error``, its other inputs are dropped."""
        entry = self._by_rid.pop(rid, None)
        if entry is None:
            return
        job = entry[0]
        if not job.future.done():
            job.future.set_exception(error)
        self.drop(job)

    def drop(self, job: PoolingJob) -> None:
        """Give ``job`` up (its client went away, it failed): its inputs still in flight leave
        the table and the engine."""
        for rid in job.rids:
            if self._by_rid.pop(rid, None) is not None:
                self._abort(rid)
        if not job.future.done():
            job.future.cancel()
