"""One ``/metrics`` over several API-server processes: how the workers' snapshots merge."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tokenwire.runtime.metrics import EngineCollector, SharedMetrics


@dataclass
class Reported:
    """What one worker's engine client last heard from the engines (``VllmEngine``'s fields)."""

    scheduler_stats: dict[int, dict[str, Any]] = field(default_factory=dict)
    scheduler_stats_at: dict[int, float] = field(default_factory=dict)
    engines: list[dict[str, Any]] = field(default_factory=list)


def worker(tmp_path, index: int, reported: Reported, requests: int) -> SharedMetrics:
    registry = CollectorRegistry()
    collector = EngineCollector(reported, registry, "m")
    Counter("tokenwire_requests", "HTTP requests", registry=registry).inc(requests)
    shared = SharedMetrics(registry, str(tmp_path), index, collector.stats_taken_at)
    shared.write()
    return shared


def samples(shared: SharedMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(shared.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_each_engines_scheduler_gauges_come_from_its_newest_stats_not_the_largest(tmp_path):
    # vLLM sends each step's scheduler stats to one API server only: worker 1 last heard from
    # engine 0 while two requests ran there, worker 0 heard later that none runs. Engine 1's
    # newest stats are worker 1's.
    alive = [
        {"rank": 0, "alive": True, "kv_capacity_tokens": 4096},
        {"rank": 1, "alive": True, "kv_capacity_tokens": 4096},
    ]
    idle = {"num_running_reqs": 0, "num_waiting_reqs": 0, "kv_cache_usage": 0.0}
    busy = {"num_running_reqs": 2, "num_waiting_reqs": 3, "kv_cache_usage": 0.25}
    worker(
        tmp_path,
        0,
        Reported({0: idle, 1: idle}, {0: 200.0, 1: 50.0}, alive),
        requests=4,
    )
    shared = worker(
        tmp_path,
        1,
        Reported({0: busy, 1: busy}, {0: 100.0, 1: 60.0}, alive),
        requests=3,
    )
    got = samples(shared)
    engine = (("engine", "0"), ("model_name", "m"))
    assert got[("vllm:num_requests_running", engine)] == 0
    assert got[("vllm:num_requests_waiting", engine)] == 0
    assert got[("vllm:kv_cache_usage_perc", engine)] == 0
    engine = (("engine", "1"), ("model_name", "m"))
    assert got[("vllm:num_requests_running", engine)] == 2
    assert got[("vllm:num_requests_waiting", engine)] == 3
    assert got[("vllm:kv_cache_usage_perc", engine)] == 0.25
    # The rest: the engines' other gauges are what every worker sees, counters add up.
    assert got[("tokenwire_engines_alive", ())] == 2
    assert got[("tokenwire_kv_cache_capacity_tokens", (("engine", "1"),))] == 4096
    assert got[("tokenwire_requests_total", ())] == 7


def test_a_worker_that_never_heard_an_engines_stats_does_not_count_for_it(tmp_path):
    worker(tmp_path, 0, Reported(), requests=1)
    shared = worker(tmp_path, 1, Reported({0: {"num_running_reqs": 1}}, {0: 5.0}), requests=1)
    got = samples(shared)
    assert got[("vllm:num_requests_running", (("engine", "0"), ("model_name", "m")))] == 1


def test_an_engine_without_stats_yet_shows_zero_as_vllm_does(tmp_path):
    # vLLM's gauges hold 0 per engine from the start: a scraper (vLLM's own test_metrics reads
    # vllm:num_requests_running before any request) finds a sample, not an empty family.
    alive = [{"rank": 0, "alive": True}, {"rank": 1, "alive": True}]
    busy = {"num_running_reqs": 2, "num_waiting_reqs": 1, "kv_cache_usage": 0.5}
    for stats, at in (({}, {}), ({1: busy}, {1: 7.0})):
        registry = CollectorRegistry()
        EngineCollector(Reported(stats, at, alive), registry, "m")
        got = {
            (s.name, s.labels["engine"]): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples
            if s.name.startswith("vllm:")
        }
        for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
            assert got[("vllm:" + name, "0")] == 0
        if stats:
            assert got[("vllm:num_requests_running", "1")] == 2
            assert got[("vllm:kv_cache_usage_perc", "1")] == 0.5
        else:
            assert got[("vllm:num_requests_running", "1")] == 0
