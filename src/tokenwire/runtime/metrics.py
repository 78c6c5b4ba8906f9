"""Prometheus metrics of one server.

vLLM's series under vLLM's names (``vllm:*``), labels (``model_name``, ``engine``) and histogram
buckets, for everything the frontend can know, so vLLM's dashboards and alerts read tokenwire
unchanged; tokenwire's own series under ``tokenwire_*``.

Latency histograms are observed for every streamed chunk, so they are kept as plain bucket counts
(updated from the event loop thread only, no lock) and exposed through a custom collector in the
standard histogram format; counters and gauges are prometheus-client's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

__all__ = [
    "E2E_BUCKETS",
    "ITL_BUCKETS",
    "TTFT_BUCKETS",
    "EngineCollector",
    "EngineSeries",
    "LoopHistogram",
    "Metrics",
    "SharedMetrics",
    "request_tokens_buckets",
]

# vLLM's bucket boundaries (vllm/v1/metrics/buckets.py, 0.32), so its dashboards' quantiles read
# the same here.
#: ``vllm:time_to_first_token_seconds``.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
#: ``vllm:inter_token_latency_seconds`` and ``vllm:request_time_per_output_token_seconds``.
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
#: End-to-end, queue, prefill, decode and inference time of a request.
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
#: ``vllm:request_params_n``.
N_BUCKETS = (1, 2, 5, 10, 20)
#: ``tokenwire_egress_step_seconds``: frontend time per engine step.
EGRESS_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)

#: The finish reasons vLLM counts (``vllm:request_success_total{finished_reason}``), made at
#: start so that dashboards see every series from the first scrape.
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")

_LABELS = ("model_name", "engine")


def request_tokens_buckets(max_model_len: int | None) -> list[float]:
    """vLLM's buckets for token counts of a request: 1, 2, 5, 10, 20, 50... up to the context
    length (vLLM's ``build_1_2_5_buckets``)."""
    top = max_model_len if max_model_len and max_model_len > 0 else 1 << 17
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > top:
                return out
            out.append(float(m * scale))
        scale *= 10


class _LoopChild:
    """One label set of a ``LoopHistogram``."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)


class LoopHistogram:
    """A histogram observed from one thread (the event loop), with optional labels: ``labels``
    gives one label set's child (cache it: it is the cheap thing to ``observe``)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        registry: CollectorRegistry,
        labelnames: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._bounds = [*sorted(buckets), float("inf")]
        self._children: dict[tuple[str, ...], _LoopChild] = {}
        #: When the histogram was made (its ``_created`` sample, as prometheus-client's own).
        self.created = time.time()
        if not self.labelnames:
            self._children[()] = _LoopChild(self._bounds)
        registry.register(self)

    def labels(self, *values: str) -> _LoopChild:
        """The child of one label set (made on first use)."""
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _LoopChild(self._bounds)
        return child

    def observe(self, value: float) -> None:
        """Observe ``value`` (a histogram without labels)."""
        self._children[()].observe(value)

    @property
    def count(self) -> int:
        """Observations of every label set."""
        return sum(c.count for c in self._children.values())

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            self.name, self.documentation, labels=list(self.labelnames) or None
        )
        for values, child in self._children.items():
            cumulative = []
            total = 0
            for bound, n in zip(self._bounds, child.counts):
                total += n
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), total))
            family.add_metric(list(values), cumulative, child.sum, timestamp=None)
            family.samples.append(
                type(family.samples[-1])(
                    self.name + "_created", dict(zip(self.labelnames, values)), self.created
                )
            )
        yield family

    def describe(self) -> list:
        return []


class CachedLabels:
    """A labelled prometheus-client metric whose ``labels`` keeps each label set's child
    (prometheus-client's own checks and joins its label values on every call)."""

    __slots__ = ("_children", "metric")

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        """The child of one label set (the metric's own, made on first use)."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


class EngineSeries:
    """The children of one engine's series (``engine`` label), bound once: what the hot paths
    update."""

    __slots__ = (
        "decode",
        "e2e",
        "egress_step",
        "generation_tokens",
        "_metrics",
        "inference",
        "itl",
        "label",
        "max_num_generation_tokens",
        "params_max_tokens",
        "params_n",
        "prefill",
        "prefill_kv_computed",
        "prompt_tokens",
        "prompt_tokens_cached",
        "queue",
        "request_generation_tokens",
        "request_prompt_tokens",
        "success",
        "time_per_output_token",
        "ttft",
    )

    def __init__(self, m: Metrics, engine: int) -> None:
        labels = (m.model_name, str(engine))
        self._metrics = m
        self.label = engine
        self.prompt_tokens = m.prompt_tokens.labels(*labels)
        self.generation_tokens = m.generation_tokens.labels(*labels)
        self.success = {r: m.request_success.labels(*labels, r) for r in FINISHED_REASONS}
        self.ttft = m.ttft.labels(*labels)
        self.itl = m.itl.labels(*labels)
        self.e2e = m.e2e.labels(*labels)
        self.queue = m.queue_time.labels(*labels)
        self.prefill = m.prefill_time.labels(*labels)
        self.decode = m.decode_time.labels(*labels)
        self.inference = m.inference_time.labels(*labels)
        self.time_per_output_token = m.time_per_output_token.labels(*labels)
        self.request_prompt_tokens = m.request_prompt_tokens.labels(*labels)
        self.request_generation_tokens = m.request_generation_tokens.labels(*labels)
        self.prefill_kv_computed = m.request_prefill_kv_computed_tokens.labels(*labels)
        self.prompt_tokens_cached = m.prompt_tokens_cached.labels(*labels)
        self.params_n = m.params_n.labels(*labels)
        self.params_max_tokens = m.params_max_tokens.labels(*labels)
        self.max_num_generation_tokens = m.max_num_generation_tokens.labels(*labels)
        self.egress_step = m.egress_step.labels(str(engine))

    def finished(self, reason: str, count: int = 1) -> None:
        """One request (choice), or ``count`` of them, finished with ``reason``."""
        counter = self.success.get(reason)
        if counter is None:  # a reason vLLM does not have (an engine's own)
            counter = self.success[reason] = self._metrics.request_success.labels(
                self._metrics.model_name, str(self.label), reason
            )
        counter.inc(count)


class Metrics:
    """Every series of one server: vLLM's (per engine: ``engine(index)`` binds them) and
    tokenwire's own (requests by route and status, errors by kind, frontend time per engine step,
    requests in flight)."""

    def __init__(self, model_name: str = "tokenwire", max_model_len: int | None = None) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        r = self.registry
        labels = list(_LABELS)
        # ---- tokenwire's own
        self.requests = CachedLabels(
            Counter(
                "tokenwire_requests",
                "HTTP requests by route and status",
                ["route", "status"],
                registry=r,
            )
        )
        self.request_errors = CachedLabels(
            Counter(
                "tokenwire_request_errors",
                "Requests ended by an error, by kind (the error's type; client_stalled: a "
                "streaming client that stopped reading)",
                ["error_type"],
                registry=r,
            )
        )
        self.egress_step = LoopHistogram(
            "tokenwire_egress_step_seconds",
            "Frontend time per engine step (frame to every stream)",
            EGRESS_BUCKETS,
            r,
            ["engine"],
        )
        self.in_flight = Gauge(
            "tokenwire_requests_in_flight", "Engine requests in flight", registry=r
        )
        # ---- vLLM's
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r
        )
        self.prompt_tokens_cached = Counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            labels,
            registry=r,
        )
        self.request_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=r,
        )

        def hist(name: str, doc: str, buckets: Sequence[float]) -> LoopHistogram:
            return LoopHistogram(name, doc, buckets, r, labels)

        self.ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            E2E_BUCKETS,
        )
        self.queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            E2E_BUCKETS,
        )
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            E2E_BUCKETS,
        )
        self.decode_time = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            E2E_BUCKETS,
        )
        self.inference_time = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            E2E_BUCKETS,
        )
        self.time_per_output_token = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        tokens = request_tokens_buckets(max_model_len)
        self.request_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.request_prefill_kv_computed_tokens = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )
        self.params_n = hist(
            "vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS
        )
        self.params_max_tokens = hist(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        self.max_num_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self._engines: dict[int, EngineSeries] = {}
        self.engine(0)

    def engine(self, index: int) -> EngineSeries:
        """Engine ``index``'s series (made on first use)."""
        series = self._engines.get(index)
        if series is None:
            series = self._engines[index] = EngineSeries(self, index)
        return series


class EngineCollector:
    """Engine-side gauges, read at scrape time from what the engines last reported: vLLM's
    requests running and waiting and KV cache usage (``vllm:*``, per engine), and tokenwire's
    live engines and KV cache capacity. Requests waiting in tokenwire's own queue
    (``queue.waiting``, before any engine) count among the engines' waiting ones, shared out
    evenly, so that whoever reads ``vllm:num_requests_waiting`` sees every request waiting."""

    def __init__(
        self,
        engine: object,
        registry: CollectorRegistry,
        model_name: str = "tokenwire",
        queue: object = None,
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.queue = queue
        registry.register(self)

    def stats_taken_at(self) -> dict[str, float]:
        """When each engine (by its ``engine`` label) took the scheduler stats these gauges
        show, by that engine's clock (empty for an engine without scheduler stats)."""
        taken = getattr(self.engine, "scheduler_stats_at", None) or {}
        return {str(rank): float(at) for rank, at in taken.items()}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = getattr(self.engine, "scheduler_stats", None)
        alive = GaugeMetricFamily("tokenwire_engines_alive", "Engines able to serve")
        engines = getattr(self.engine, "engines", None)
        if engines is not None:
            alive.add_metric([], sum(1 for e in engines if e["alive"]))
        else:
            alive.add_metric([], 1 if getattr(self.engine, "alive", False) else 0)
        yield alive
        capacity = GaugeMetricFamily(
            "tokenwire_kv_cache_capacity_tokens",
            "KV cache capacity in tokens, as each engine reported when it started",
            labels=["engine"],
        )
        for e in engines or ():
            if e.get("kv_capacity_tokens") is not None:
                capacity.add_metric([str(e["rank"])], float(e["kv_capacity_tokens"]))
        yield capacity
        model = self.model_name
        queued = getattr(self.queue, "waiting", 0) or 0
        if stats is None:
            # An engine without scheduler stats (the synthetic one) may still count its batch.
            for name, attr, doc in _SCHEDULER_SERIES:
                value = getattr(self.engine, attr, None)
                if isinstance(value, (int, float)):
                    if attr == "waiting":
                        value += queued
                    family = GaugeMetricFamily(name, doc, labels=list(_LABELS))
                    family.add_metric([model, "0"], float(value))
                    yield family
            return
        yield from self._engine_counts(model, stats)
        # (an engine that has sent no scheduler stats yet shows 0, as vLLM's gauges start)
        known = {e["rank"] for e in engines or () if isinstance(e.get("rank"), int)}
        ranks = sorted(set(stats) | known)
        for name, key, doc in _SCHEDULER_STATS:
            family = GaugeMetricFamily(name, doc, labels=list(_LABELS))
            for rank in ranks:
                values = stats.get(rank)
                value = values.get(key) if values is not None else 0
                values = values or {}
                if key == "num_waiting_reqs" and isinstance(value, (int, float)):
                    # vLLM's gauge counts the requests its scheduler skipped too.
                    skipped = values.get("num_skipped_waiting_reqs")
                    value += skipped if isinstance(skipped, (int, float)) else 0
                    if queued:
                        i = ranks.index(rank)
                        value += queued // len(ranks) + (1 if i < queued % len(ranks) else 0)
                if isinstance(value, (int, float)):
                    family.add_metric([model, str(rank)], float(value))
            yield family

    def _engine_counts(self, model: str, stats: dict) -> Iterator[Metric]:
        """vLLM's series from what the engines report beside the requests: step sizes,
        preemptions, prefix cache queries and hits, the waiting requests by reason, the KV
        cache's settings."""
        fold = getattr(self.engine, "fold_rank_stats", None)
        ranks = fold() if fold is not None else {}
        if ranks:
            hist = HistogramMetricFamily(
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                labels=list(_LABELS),
            )
            preempt = CounterMetricFamily(
                "vllm:num_preemptions",
                "Cumulative number of preemption from the engine.",
                labels=list(_LABELS),
            )
            queries = CounterMetricFamily(
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                labels=list(_LABELS),
            )
            hits = CounterMetricFamily(
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                labels=list(_LABELS),
            )
            for rank, r in sorted(ranks.items()):
                labels = [model, str(rank)]
                hist.add_metric(labels, r.iteration_buckets(), r.iteration_sum)
                preempt.add_metric(labels, r.preemptions, created=r.created)
                queries.add_metric(labels, r.prefix_queries, created=r.created)
                hits.add_metric(labels, r.prefix_hits, created=r.created)
            yield from (hist, preempt, queries, hits)
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV "
            "transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            labels=[*_LABELS, "reason"],
        )
        for rank, values in sorted(stats.items()):
            for reason, key in (
                ("capacity", "num_waiting_reqs"),
                ("deferred", "num_skipped_waiting_reqs"),
            ):
                value = values.get(key)
                if isinstance(value, (int, float)):
                    by_reason.add_metric([model, str(rank), reason], float(value))
        yield by_reason
        config = getattr(self.engine, "cache_config", None) or {}
        if config:
            info = GaugeMetricFamily(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                labels=["engine", *sorted(next(iter(config.values())))],
            )
            for rank, labels in sorted(config.items()):
                info.add_metric([str(rank), *(labels[k] for k in sorted(labels))], 1.0)
            yield info

    def describe(self) -> list:
        return []


#: The scheduler gauges: vLLM's name, the engine's stats key, the help.
_SCHEDULER_STATS = (
    (
        "vllm:num_requests_running",
        "num_running_reqs",
        "Number of requests in model execution batches.",
    ),
    (
        "vllm:num_requests_waiting",
        "num_waiting_reqs",
        "Number of requests waiting to be processed.",
    ),
    ("vllm:kv_cache_usage_perc", "kv_cache_usage", "KV-cache usage. 1 means 100 percent usage."),
)
#: The same, read from an engine without scheduler stats: the attribute it has instead.
_SCHEDULER_SERIES = tuple(
    (name, attr, doc)
    for (name, _, doc), attr in zip(_SCHEDULER_STATS, ("running", "waiting", "kv_cache_usage"))
)
#: Gauges that describe the shared engines as every worker sees them: they merge by max.
_ENGINE_GAUGES = frozenset(
    {"tokenwire_engines_alive", "tokenwire_kv_cache_capacity_tokens", "vllm:lora_requests_info"}
)
#: Gauges from the engines' scheduler stats, which vLLM sends to one worker per step (so a
#: worker's may be long out of date): each engine's value comes from the worker that holds its
#: newest stats, by the engine's clock (vLLM's own merge, "mostrecent").
_SCHEDULER_GAUGES = frozenset(name for name, _, _ in _SCHEDULER_STATS)


class SharedMetrics:
    """One ``/metrics`` for several API-server processes.

    Each worker writes a snapshot of its registry (every sample, with its family's name, type and
    help) to ``worker-<index>.json`` in a shared directory, atomically, on every scrape it serves
    and periodically; a scrape merges every worker's latest snapshot: counters, histograms and
    per-worker gauges add up; the engines' scheduler gauges take, per engine, the value of the
    worker that holds that engine's newest stats (``stats_taken_at`` says when each worker's were
    taken, by the engine's clock); the other engine gauges (the same engines seen from every
    worker) take the largest.
    ``tokenwire_api_server_requests_total{worker}`` says how the load spreads.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        directory: str,
        index: int,
        stats_taken_at: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.registry = registry
        self.directory = directory
        self.index = index
        self.stats_taken_at = stats_taken_at
        self._path = os.path.join(directory, f"worker-{index}.json")

    def write(self) -> None:
        """Write this worker's snapshot."""
        families = []
        requests = 0.0
        for fam in self.registry.collect():
            samples = [
                (s.name, s.labels, s.value) for s in fam.samples if not s.name.endswith("_created")
            ]
            families.append((fam.name, fam.type, fam.documentation, samples))
            if fam.name == "tokenwire_requests":
                requests = sum(v for n, _, v in samples if n.endswith("_total"))
        families.append(
            (
                "tokenwire_api_server_requests",
                "counter",
                "HTTP requests served by each API-server process",
                [("tokenwire_api_server_requests_total", {"worker": str(self.index)}, requests)],
            )
        )
        snapshot = {
            "pid": os.getpid(),
            "written": time.time(),
            "families": families,
            "stats_taken_at": self.stats_taken_at() if self.stats_taken_at is not None else {},
        }
        tmp = f"{self._path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(snapshot, f)
        os.replace(tmp, self._path)

    def _snapshots(self) -> dict[str, dict]:
        out = {}
        for name in sorted(os.listdir(self.directory)):
            if name.startswith("worker-") and name.endswith(".json"):
                path = os.path.join(self.directory, name)
                try:
                    with open(path, encoding="utf-8") as f:
                        out[path] = json.load(f)
                except (OSError, ValueError):
                    continue  # being replaced right now
        return out

    async def refresh(self, timeout: float = 2.0) -> None:
        """Ask every other worker for a fresh snapshot (SIGUSR1) and wait for them (a worker
        gone or stuck for ``timeout`` seconds counts with its last snapshot)."""
        since = time.time()
        self.write()
        pending = []
        for path, snap in self._snapshots().items():
            pid = snap.get("pid")
            if path != self._path and isinstance(pid, int):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGUSR1)
                    pending.append(path)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            pending = [p for p in pending if _written(p) < since]

    def render(self) -> bytes:
        """The merged exposition of every worker's latest snapshot (call ``refresh`` first)."""
        merged: dict[str, tuple[str, str, dict[tuple, list]]] = {}
        for snap in self._snapshots().values():
            taken_at = snap.get("stats_taken_at") or {}
            for fam_name, kind, doc, samples in snap.get("families", []):
                entry = merged.setdefault(fam_name, (kind, doc, {}))
                for sample, labels, value in samples:
                    key = (sample, tuple(sorted(labels.items())))
                    if fam_name in _SCHEDULER_GAUGES:  # (when taken, value): the newest wins
                        value = (taken_at.get(labels.get("engine"), float("-inf")), value)
                    entry[2].setdefault(key, []).append(value)
        registry = CollectorRegistry()
        registry.register(_Merged(merged))
        return generate_latest(registry)


def _written(path: str) -> float:
    """When a snapshot was written, by its writer's clock (inf when it is gone or unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            written = json.load(f).get("written")
    except (OSError, ValueError):
        return float("inf")
    return written if isinstance(written, (int, float)) else float("inf")


class _Merged:
    def __init__(self, merged: dict[str, tuple[str, str, dict[tuple, list]]]) -> None:
        self.merged = merged

    def collect(self) -> Iterator[Metric]:
        for name, (kind, doc, samples) in self.merged.items():
            fam = Metric(name, doc, kind)
            for (sample, labels), values in samples.items():
                if name in _SCHEDULER_GAUGES:
                    value = max(values)[1]
                elif name in _ENGINE_GAUGES:
                    value = max(values)
                else:
                    value = sum(values)
                fam.add_sample(sample, dict(labels), value)
            yield fam

    def describe(self) -> list:
        return []
