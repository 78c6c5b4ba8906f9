"""Dashboards read tokenwire unchanged: every series that vLLM's published Grafana dashboard
queries (``tests/data/dashboards/vllm_grafana_queries.json``, its queries as vLLM ships them)
and every series tokenwire's own dashboard queries (``examples/grafana/tokenwire.json``) is on
``/metrics`` after a short load, with the labels and label values the queries select and group
by. Queries are parsed as PromQL (``promql-parser``)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import promql_parser
import pytest

from tokenwire.engine.synthetic import SyntheticConfig

from conftest import REPO
from prom import samples
from served import MODEL, raw_request, serve, wait_until

VLLM_DASHBOARD = REPO / "tests" / "data" / "dashboards" / "vllm_grafana_queries.json"
OWN_DASHBOARD = REPO / "examples" / "grafana" / "tokenwire.json"

Samples = list[tuple[str, dict[str, str], float]]


@dataclass
class Selector:
    """A series selector of a query, and the labels the aggregations above it group by."""

    name: str
    matchers: list[tuple[str, str, str]]
    by: set[str] = field(default_factory=set)

    def __str__(self) -> str:
        inner = ",".join(f"{k}{op}{v!r}" for k, op, v in self.matchers)
        return f"{self.name}{{{inner}}} by {sorted(self.by)}"


_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}


def selectors(expr: str) -> list[Selector]:
    """Every series selector in a PromQL expression."""
    out: list[Selector] = []

    def walk(node: object, by: frozenset[str]) -> None:
        kind = type(node).__name__
        if kind == "VectorSelector":
            matchers = [
                (m.name, _OPS[str(m.op)], m.value)
                for m in node.matchers.matchers  # type: ignore[attr-defined]
                if m.name != "__name__"
            ]
            out.append(Selector(node.name, matchers, set(by)))  # type: ignore[attr-defined]
            return
        if kind == "AggregateExpr":
            modifier = node.modifier  # type: ignore[attr-defined]
            if modifier is not None and str(modifier.type).endswith("By"):
                by = by | frozenset(modifier.labels)
        for attr in ("args", "expr", "lhs", "rhs", "vector_selector", "param"):
            child = getattr(node, attr, None)
            for c in child if isinstance(child, list) else [child]:
                if c is not None and type(c).__module__.startswith("promql_parser"):
                    walk(c, by)

    walk(promql_parser.parse(expr), frozenset())
    return out


def grafana(expr: str, model: str = MODEL) -> str:
    """A Grafana query with its variables as a dashboard user would have them (``model``
    chosen)."""
    return (
        expr.replace("$__rate_interval", "1m")
        .replace("$model_name", model)
        .replace("$engine", ".*")
    )


def queries(path: Path, model: str = MODEL) -> Iterator[tuple[str, list[Selector]]]:
    """Every query of a dashboard (panel targets and variable queries) and its selectors."""
    board = json.loads(path.read_text())
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = grafana(target["expr"], model)
            yield f"{panel['title']}: {expr}", selectors(expr)
    for var in board.get("templating", {}).get("list", []):
        query = var.get("query")
        text = query.get("query") if isinstance(query, dict) else None
        m = re.fullmatch(r"label_values\((?:(.+),\s*)?(\w+)\)", text or "")
        if m is None:
            continue
        series, label = m.groups()
        found = selectors(grafana(series, model)) if series else [Selector("", [])]
        for sel in found:
            sel.by.add(label)
        yield f"variable {var['name']}: {text}", found


def _matches(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for key, op, value in matchers:
        got = labels.get(key, "")
        ok = {
            "=": got == value,
            "!=": got != value,
            "=~": re.fullmatch(value, got) is not None,
            "!~": re.fullmatch(value, got) is None,
        }[op]
        if not ok:
            return False
    return True


def missing(sel: Selector, got: Samples) -> str | None:
    """Why ``sel`` finds nothing tokenwire exports (None when it finds series with every label
    it groups by)."""
    named = [labels for name, labels, _ in got if not sel.name or name == sel.name]
    if not named:
        return f"no series {sel.name}"
    chosen = [labels for labels in named if _matches(labels, sel.matchers)]
    if not chosen:
        return f"no series {sel}"
    lacking = sel.by - {k for labels in chosen for k in labels}
    if lacking:
        return f"{sel}: no label {sorted(lacking)}"
    return None


def problems(path: Path, got: Samples, model: str = MODEL) -> list[str]:
    """What a dashboard's queries find missing on ``/metrics`` (``got``), for ``model``."""
    out = []
    for where, found in queries(path, model):
        assert found, f"{where}: no series selector"
        out += [f"{where}: {why}" for sel in found if (why := missing(sel, got))]
    return out


_STALLING = json.dumps(
    {
        "text": "Hi",
        "stream": True,
        "sampling_params": {"max_new_tokens": 30000, "ignore_eos": True},
    }
).encode()


@pytest.fixture(scope="module")
def loaded() -> Iterator[Samples]:
    """``/metrics`` after a short load: streamed and whole completions and chats, a /generate,
    a request refused with a 400, and a stream whose client stops reading (ended after
    --stall-timeout)."""
    with serve(SyntheticConfig(step_time=0.0005), stall_timeout=0.3) as s:
        stalled = raw_request(s.port, "POST", "/generate", _STALLING, rcvbuf=4096)
        try:
            for stream in (True, False):
                for _ in range(3):
                    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 8, "stream": stream}
                    assert httpx.post(s.url + "/v1/completions", json=body).status_code == 200
                chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
                chat |= {"max_tokens": 4, "stream": stream}
                assert httpx.post(s.url + "/v1/chat/completions", json=chat).status_code == 200
            gen = {"text": "Hi", "sampling_params": {"max_new_tokens": 4}}
            assert httpx.post(s.url + "/generate", json=gen).status_code == 200
            assert httpx.post(s.url + "/v1/completions", json={"prompt": 1}).status_code == 400

            def ended() -> bool:
                text = httpx.get(s.url + "/metrics").text
                return 'error_type="client_stalled"' in text

            assert wait_until(ended, 60), "the stalled stream was never ended"
        finally:
            stalled.close()
        time.sleep(0.05)
        yield samples(httpx.get(s.url + "/metrics").text)


def test_every_series_vllms_grafana_dashboard_queries_is_exported(loaded):
    assert problems(VLLM_DASHBOARD, loaded) == []


def test_every_series_tokenwires_own_dashboard_queries_is_exported(loaded):
    assert problems(OWN_DASHBOARD, loaded) == []
    board = json.loads(OWN_DASHBOARD.read_text())
    titles = " ".join(p["title"].lower() for p in board["panels"])
    for wanted in (
        "first token",
        "inter-token",
        "end-to-end",
        "queue",
        "running and waiting",
        "tokens per second",
        "errors by type",
        "stalled",
        "per engine step",
    ):
        assert wanted in titles, wanted


def test_the_check_finds_what_is_not_exported(loaded):
    """The queries of vLLM's older dashboards (series vLLM V1 dropped), a label value nobody
    has, a grouping label a series lacks: each is reported."""
    for expr, why in (
        ('vllm:num_requests_swapped{model_name="m"}', "no series vllm:num_requests_swapped"),
        ("rate(vllm:gpu_cache_usage_perc[1m])", "no series vllm:gpu_cache_usage_perc"),
        ('vllm:num_requests_running{model_name="other"}', "no series vllm:num_requests_running{"),
        ("sum by(route) (tokenwire_request_errors_total)", "no label ['route']"),
    ):
        (sel,) = selectors(expr)
        assert why in (missing(sel, loaded) or ""), (expr, missing(sel, loaded))


def test_vllms_histograms_have_vllms_buckets(loaded):
    """Quantiles over the same buckets as vLLM's (vllm/v1/metrics/buckets.py)."""
    ttft = sorted(
        float(labels["le"])
        for name, labels, _ in loaded
        if name == "vllm:time_to_first_token_seconds_bucket" and labels["engine"] == "0"
    )
    assert ttft[:4] == [0.001, 0.005, 0.01, 0.02] and ttft[-2:] == [2560.0, float("inf")]
    e2e = {
        float(labels["le"])
        for name, labels, _ in loaded
        if name == "vllm:e2e_request_latency_seconds_bucket"
    }
    assert {0.3, 0.5, 7680.0} <= e2e
