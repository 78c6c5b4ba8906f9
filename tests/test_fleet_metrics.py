"""What load balancers scrape: the ``vllm:`` series the Kubernetes Gateway API inference
extension's endpoint picker (llm-d's scheduler) reads to choose a replica, read the way it reads
them (its ``PodMetricsClientImpl``: a metric family by name, the newest sample among those with
the spec's labels; ``vllm:lora_requests_info``: the sample with the largest value, its adapters
from its labels), over two ``tokenwire mock-engine`` ranks serving a LoRA adapter, with requests
running on the engines and waiting in tokenwire's own queue; and SGLang's load reports over the
same engines."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenwire.engine.routing import RoutingConfig
from tokenwire.engine.vllm import VllmEngine, VllmEngineConfig
from tokenwire.server import ServerConfig, create_app
from vllm_helpers import MockThreads, free_port, wait_until

from conftest import real_tokenizer
from served import run_app

MODEL = "mock-model"
ADAPTER = "sql-adapter"

# ---- the endpoint picker's reading of a scrape ---------------------------------------------------

#: Its default metric names for vLLM (``--total-queued-requests-metric`` ...).
QUEUED, RUNNING, KV_USAGE, LORA_INFO = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:lora_requests_info",
)


def families(text: str) -> dict[str, list]:
    """Metric families by name, each a list of samples (as its expfmt text parser gives)."""
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        out.setdefault(fam.name, []).extend(s for s in fam.samples if s.name == fam.name)
    return out


def latest_metric(fams: dict[str, list], name: str, labels: dict[str, str] | None = None):
    """``getLatestMetric``: among the family's samples with the spec's labels, the one with the
    newest timestamp (none carry one: the first)."""
    best, best_ts = None, -1
    for s in fams[name]:
        if labels and any(s.labels.get(k) != v for k, v in labels.items()):
            continue
        ts = int((s.timestamp or 0) * 1000)
        if ts > best_ts:
            best, best_ts = s, ts
    if best is None:
        raise LookupError(f"no matching metric found for {name} with labels {labels}")
    return best


def latest_lora(fams: dict[str, list]) -> dict:
    """``getLatestLoraMetric``: the series with the largest value (its creation time), those
    with no adapter at all left out; the pod's active and waiting adapters and its maximum."""
    best, best_value = None, 0.0
    for s in fams[LORA_INFO]:
        if not s.labels.get("running_lora_adapters") and not s.labels.get("waiting_lora_adapters"):
            continue
        if s.value > best_value:
            best, best_value = s, s.value
    if best is None:
        return {}
    split = lambda v: set(v.split(",")) if v else set()  # noqa: E731
    return {
        "active_models": split(best.labels["running_lora_adapters"]),
        "waiting_models": split(best.labels["waiting_lora_adapters"]),
        "max_active_models": int(best.labels["max_lora"]),
    }


def pod_metrics(text: str, engine: str | None = None) -> dict:
    """What the picker keeps of one scrape (``engine``: a spec restricted to one engine)."""
    fams = families(text)
    labels = {"engine": engine} if engine is not None else None
    return {
        "waiting": int(latest_metric(fams, QUEUED, labels).value),
        "running": int(latest_metric(fams, RUNNING, labels).value),
        "kv": latest_metric(fams, KV_USAGE, labels).value,
        **latest_lora(fams),
    }


# ---- two mock engines serving an adapter ---------------------------------------------------------


@contextlib.contextmanager
def lora_fleet() -> Iterator:
    tok = real_tokenizer("default")
    address = f"tcp://127.0.0.1:{free_port()}"
    args = ["--synthetic-output", "echo", "--step-time-ms", "40", "--enable-lora"]
    mocks = MockThreads(address, 2, [*args, "--max-loras", "2"])
    engine = VllmEngine(
        tok,
        VllmEngineConfig(
            handshake_address=address,
            data_parallel_size=2,
            ready_timeout=60,
            routing=RoutingConfig(policy="fewest"),
        ),
    )
    config = ServerConfig(
        model_name=MODEL,
        lora_modules={ADAPTER: "/adapters/sql"},
        max_concurrent_requests=3,
        max_waiting_requests=8,
    )
    try:
        app = create_app(tok, engine, config)
        with run_app(app, start_timeout=120) as url:
            yield url, app
    finally:
        mocks.close()


@pytest.fixture(scope="module")
def fleet() -> Iterator:
    with lora_fleet() as f:
        yield f


def test_the_endpoint_picker_reads_waiting_running_kv_and_adapters(fleet):
    url, app = fleet
    rt = app.runtime
    prompt = " ".join(f"w{i}" for i in range(60))
    threads = []

    def run(model: str) -> None:
        body = {"model": model, "prompt": prompt, "max_tokens": 75}
        httpx.post(url + "/v1/completions", json=body, timeout=60)

    def start(model: str) -> None:
        t = threading.Thread(target=run, args=(model,))
        t.start()
        threads.append(t)

    # the two adapter requests and one base one run on the engines (tokenwire's limit is three),
    # two base ones wait in its queue: sent in that order, each admitted before the next is sent
    # (threads started together reach the server in any order)
    for model, running in ((ADAPTER, 1), (ADAPTER, 2), (MODEL, 3)):
        start(model)
        wait_until(lambda n=running: len(rt.shard) == n, 30, f"{running} running")
    start(MODEL)
    start(MODEL)
    wait_until(lambda: len(rt.shard) == 3 and rt.admission.waiting == 2, 30, "a queue")

    def settled() -> bool:  # (the engines report each step's stats)
        text = httpx.get(url + "/metrics").text
        running = sum(pod_metrics(text, str(r))["running"] for r in (0, 1))
        return running == 3 and pod_metrics(text).get("active_models") == {ADAPTER}

    wait_until(settled, 30, "the engines' stats")
    text = httpx.get(url + "/metrics").text
    pod = pod_metrics(text)
    per_engine = [pod_metrics(text, str(r)) for r in (0, 1)]
    # the picker's label-less spec reads the first engine's series, a spec with the engine
    # label each engine's; every waiting request is counted once, shared out over the engines
    assert pod == per_engine[0]
    assert sum(e["running"] for e in per_engine) == 3
    assert sum(e["waiting"] for e in per_engine) == 2
    assert all(0 < e["kv"] <= 1 for e in per_engine if e["running"])
    assert pod["active_models"] == {ADAPTER} and pod["max_active_models"] == 2
    assert pod["waiting_models"] == set()
    # SGLang's load reports say the same
    loads = httpx.get(url + "/v1/loads").json()
    assert loads["dp_rank_count"] == 2
    assert loads["aggregate"]["total_running_reqs"] == 3
    assert loads["aggregate"]["total_waiting_reqs"] == 2
    assert sum(x["num_reqs"] for x in httpx.get(url + "/get_load").json()) == 5
    for t in threads:
        t.join(60)

    # once they are over, no adapter runs: the newest series has none (vLLM's way: the picker
    # skips it, as it skips vLLM's)
    def newest() -> dict:
        series = families(httpx.get(url + "/metrics").text)[LORA_INFO]
        return max(series, key=lambda s: s.value).labels

    wait_until(lambda: newest()["running_lora_adapters"] == "", 10, "no adapter running")
