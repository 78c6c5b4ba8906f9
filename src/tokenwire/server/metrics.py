"""Prometheus metrics of one server.

Latency histograms are observed for every streamed chunk, so they are kept as plain bucket counts
(updated from the event loop thread only, no lock) and exposed through a custom collector in the
standard histogram format; counters and gauges are prometheus-client's own.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

__all__ = ["EngineCollector", "Metrics", "LoopHistogram"]


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

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = getattr(self.engine, "scheduler_stats", None)
        alive = GaugeMetricFamily("tokenwire:engines_alive", "Engines able to serve")
        engines = getattr(self.engine, "engines", None)
        if engines is not None:
            alive.add_metric([], sum(1 for e in engines if e["alive"]))
        else:
            alive.add_metric([], 1 if getattr(self.engine, "alive", False) else 0)
        yield alive
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
