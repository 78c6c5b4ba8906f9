"""Prometheus metrics of one server.

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

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

__all__ = ["EngineCollector", "Metrics", "LoopHistogram", "SharedMetrics"]


class LoopHistogram:
    """A histogram observed from one thread (the event loop)."""

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = [*sorted(buckets), float("inf")]
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    @property
    def count(self) -> int:
        return sum(self._counts)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative = []
        total = 0
        for bound, n in zip(self._bounds, self._counts):
            total += n
            cumulative.append(("+Inf" if bound == float("inf") else repr(bound), total))
        yield HistogramMetricFamily(
            self.name, self.documentation, buckets=cumulative, sum_value=self._sum
        )

    def describe(self) -> list:
        return []


class Metrics:
    """Requests by route and status, tokens in and out, request outcomes by finish reason and by
    error kind, time to first token, inter-token and end-to-end latency (vLLM's metric names
    with a ``tokenwire:`` prefix), egress time per engine step, requests in flight."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tokenwire_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter("tokenwire:prompt_tokens", "Prompt tokens in", registry=r)
        self.generation_tokens = Counter(
            "tokenwire:generation_tokens", "Generated tokens out", registry=r
        )
        self.request_success = Counter(
            "tokenwire:request_success",
            "Finished requests (each choice) by finish reason",
            ["finished_reason"],
            registry=r,
        )
        self.request_errors = Counter(
            "tokenwire:request_errors",
            "Requests ended by an error, by kind (the error's type)",
            ["error_type"],
            registry=r,
        )
        self.ttft = LoopHistogram(
            "tokenwire:time_to_first_token_seconds",
            "Time to first token",
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.itl = LoopHistogram(
            "tokenwire:inter_token_latency_seconds",
            "Time between streamed chunks",
            registry=r,
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1),
        )
        self.e2e = LoopHistogram(
            "tokenwire:e2e_request_latency_seconds",
            "Time from submission to the end of the response",
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300),
        )
        self.egress_step = LoopHistogram(
            "tokenwire_egress_step_seconds",
            "Frontend time per engine step (frame to sinks)",
            registry=r,
            buckets=(1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2),
        )
        self.in_flight = Gauge(
            "tokenwire_requests_in_flight", "Engine requests in flight", registry=r
        )


class EngineCollector:
    """Engine-side gauges, read at scrape time from what the engines last reported (vLLM's names
    with a ``tokenwire:`` prefix): requests running and waiting, KV cache usage, live engines."""

    def __init__(self, engine: object, registry: CollectorRegistry) -> None:
        self.engine = engine
        registry.register(self)

    def stats_taken_at(self) -> dict[str, float]:
        """When each engine (by its ``engine`` label) took the scheduler stats these gauges
        show, by that engine's clock (empty for an engine without scheduler stats)."""
        taken = getattr(self.engine, "scheduler_stats_at", None) or {}
        return {str(rank): float(at) for rank, at in taken.items()}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = getattr(self.engine, "scheduler_stats", None)
        alive = GaugeMetricFamily("tokenwire:engines_alive", "Engines able to serve")
        engines = getattr(self.engine, "engines", None)
        if engines is not None:
            alive.add_metric([], sum(1 for e in engines if e["alive"]))
        else:
            alive.add_metric([], 1 if getattr(self.engine, "alive", False) else 0)
        yield alive
        capacity = GaugeMetricFamily(
            "tokenwire:kv_cache_capacity_tokens",
            "KV cache capacity in tokens, as each engine reported when it started",
            labels=["engine"],
        )
        for e in engines or ():
            if e.get("kv_capacity_tokens") is not None:
                capacity.add_metric([str(e["rank"])], float(e["kv_capacity_tokens"]))
        yield capacity
        if stats is None:
            # An engine without scheduler stats (the synthetic one) may still count its batch.
            for name, attr, doc in (
                ("tokenwire:num_requests_running", "running", "Requests in engine batches"),
                ("tokenwire:num_requests_waiting", "waiting", "Requests waiting in engines"),
            ):
                value = getattr(self.engine, attr, None)
                if isinstance(value, int):
                    family = GaugeMetricFamily(name, doc, labels=["engine"])
                    family.add_metric(["0"], float(value))
                    yield family
            return
        for name, key, doc in (
            ("tokenwire:num_requests_running", "num_running_reqs", "Requests in engine batches"),
            ("tokenwire:num_requests_waiting", "num_waiting_reqs", "Requests waiting in engines"),
            ("tokenwire:kv_cache_usage_perc", "kv_cache_usage", "KV cache usage (1 = full)"),
        ):
            family = GaugeMetricFamily(name, doc, labels=["engine"])
            for rank, values in sorted(stats.items()):
                value = values.get(key)
                if isinstance(value, (int, float)):
                    family.add_metric([str(rank)], float(value))
            yield family

    def describe(self) -> list:
        return []


#: Gauges that describe the shared engines as every worker sees them: they merge by max.
_ENGINE_GAUGES = frozenset({"tokenwire:engines_alive", "tokenwire:kv_cache_capacity_tokens"})
#: Gauges from the engines' scheduler stats, which vLLM sends to one worker per step (so a
#: worker's may be long out of date): each engine's value comes from the worker that holds its
#: newest stats, by the engine's clock (vLLM's own merge, "mostrecent").
_SCHEDULER_GAUGES = frozenset(
    {
        "tokenwire:num_requests_running",
        "tokenwire:num_requests_waiting",
        "tokenwire:kv_cache_usage_perc",
    }
)


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
