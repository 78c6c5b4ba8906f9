"""Metrics of serving many engines and many users, beside ``metrics``' (their own definitions).

- ``vllm:lora_requests_info{max_lora, waiting_lora_adapters, running_lora_adapters}``: vLLM's
  gauge, whose value is when its labels were last true (seconds since the epoch): the adapters
  running and waiting on the engines (comma-separated, over every engine) and how many each
  holds at once. Each set of labels is a series of its own; readers (the Gateway API inference
  extension's scheduler) take the newest. Exported when the engines serve LoRA adapters.
- ``tokenwire_requests_waiting``: requests in tokenwire's waiting queue (before any engine);
  ``tokenwire_queue_time_seconds``: how long admitted requests waited;
  ``tokenwire_requests_refused_total{reason}``: requests the queue refused (``queue_full``,
  ``queue_timeout``).
- ``tokenwire_routing_decisions_total{decision}``: prefix routing's choices (``cache``: the
  engine holding the longest cached prefix; ``balance``: the least loaded one, the former past
  the balance threshold; ``cold``: no engine held any of the prompt);
  ``tokenwire_kv_event_batches_total{engine}``: KV-cache event batches received;
  ``tokenwire_engine_retries_total``: requests sent again after their engine died.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tokenwire.runtime.metrics import E2E_BUCKETS, LoopHistogram

__all__ = ["FleetMetrics"]

#: Distinct ``vllm:lora_requests_info`` label sets kept (the oldest go first).
_MAX_LORA_SERIES = 64
#: Queue waits: from a millisecond to minutes.
_QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, *E2E_BUCKETS)


class FleetMetrics:
    """The series above, read from the engine and the admission queue at scrape time."""

    def __init__(
        self,
        registry: CollectorRegistry,
        engine: Any,
        admission: Any,
        model_name: str,
        generated: Any = None,
    ) -> None:
        self.engine = engine
        self.admission = admission
        self.model_name = model_name
        #: Per engine: prompt tokens of finished requests, and how many were found cached.
        self.cache_hits: dict[int, tuple[int, int]] = {}
        #: ``generated(rank)``: the engine's generation tokens so far (for throughput).
        self._generated = generated
        self._rate: dict[int, tuple[float, float, float]] = {}  # rank -> (time, count, rate)
        self.queue_time = LoopHistogram(
            "tokenwire_queue_time_seconds",
            "Seconds admitted requests waited for a place",
            _QUEUE_BUCKETS,
            registry,
        )
        admission.on_wait = self.queue_time.observe
        #: label tuple (max, waiting, running) -> when it was last true
        self._lora: dict[tuple[str, str, str], float] = {}
        registry.register(self)

    def finished(self, rank: int, prompt_tokens: int, cached_tokens: int) -> None:
        """A request (choice) finished on engine ``rank``."""
        prompt, hits = self.cache_hits.get(rank, (0, 0))
        self.cache_hits[rank] = (prompt + prompt_tokens, hits + cached_tokens)

    def throughput(self, rank: int) -> float:
        """Tokens per second engine ``rank`` generated lately (since about a second ago)."""
        if self._generated is None:
            return 0.0
        now = time.monotonic()
        count = float(self._generated(rank))
        then = self._rate.get(rank)
        if then is None:
            self._rate[rank] = (now, count, 0.0)
            return 0.0
        at, before, rate = then
        if now - at >= 1.0:
            rate = (count - before) / (now - at)
            self._rate[rank] = (now, count, rate)
        return rate

    def collect(self) -> Iterator[Metric]:
        adm = self.admission
        waiting = GaugeMetricFamily(
            "tokenwire_requests_waiting", "Requests waiting in the queue for a place"
        )
        waiting.add_metric([], float(adm.waiting))
        yield waiting
        refused = CounterMetricFamily(
            "tokenwire_requests_refused",
            "Requests the waiting queue refused, by reason",
            labels=["reason"],
        )
        for reason, n in sorted(adm.refused.items()):
            refused.add_metric([reason], float(n))
        yield refused
        decisions = getattr(self.engine, "routing_decisions", None)
        if decisions is not None:
            fam = CounterMetricFamily(
                "tokenwire_routing_decisions",
                "Prefix routing's choices: cache (longest cached prefix), balance (least "
                "loaded, past the threshold), cold (no engine held any of the prompt)",
                labels=["decision"],
            )
            for decision, n in sorted(decisions.items()):
                fam.add_metric([decision], float(n))
            yield fam
        batches = getattr(self.engine, "kv_event_batches", None)
        if batches is not None:
            fam = CounterMetricFamily(
                "tokenwire_kv_event_batches",
                "KV-cache event batches received from each engine",
                labels=["engine"],
            )
            for rank, n in sorted(batches.items()):
                fam.add_metric([str(rank)], float(n))
            yield fam
        retried = getattr(self.engine, "retried", None)
        if isinstance(retried, int):
            fam = CounterMetricFamily(
                "tokenwire_engine_retries",
                "Requests sent to another engine after theirs died before their first output",
            )
            fam.add_metric([], float(retried))
            yield fam
        lora = self._lora_info()
        if lora is not None:
            yield lora

    def _lora_info(self) -> GaugeMetricFamily | None:
        if getattr(self.engine, "supports_lora", False) is not True:
            return None
        stats = getattr(self.engine, "scheduler_stats", None) or {}
        running: dict[str, None] = {}
        waiting: dict[str, None] = {}
        for _rank, values in sorted(stats.items()):
            for name in values.get("running_lora_adapters") or {}:
                running[str(name)] = None
            for name in values.get("waiting_lora_adapters") or {}:
                waiting[str(name)] = None
        max_lora = getattr(self.engine, "max_loras", None)
        labels = (str(max_lora or 0), ",".join(waiting), ",".join(running))
        series = self._lora
        series.pop(labels, None)
        series[labels] = time.time()  # (vLLM's set_to_current_time, at every stats update)
        while len(series) > _MAX_LORA_SERIES:
            del series[next(iter(series))]
        fam = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        )
        for key, at in series.items():
            fam.add_metric(list(key), at)
        return fam

    def describe(self) -> list:
        return []
