"""Metrics tell outcomes apart: a stream that ends in an error event is not a 200, requests are
counted by finish reason and error kind, engine gauges and latency histograms are there."""

from __future__ import annotations

import threading

import httpx

from tokenwire.engine.synthetic import SyntheticConfig

from prom import scrape, value
from served import MODEL, serve, wait_until


def _stream(url: str, out: dict, max_tokens: int = 2000) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": max_tokens, "stream": True}
    body["ignore_eos"] = True
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as resp:
        out["body"] = resp.read()


def test_outcomes_statuses_and_gauges():
    with serve(SyntheticConfig(step_time=0.01)) as s:
        out: dict = {}
        t = threading.Thread(target=_stream, args=(s.url, out))
        t.start()
        assert wait_until(lambda: s.engine.running == 1)
        m = scrape(s.url)
        engine = {"engine": "0", "model_name": MODEL}
        assert value(m, "vllm:num_requests_running", **engine) == 1
        assert value(m, "vllm:num_requests_waiting", **engine) == 0
        s.engine.inject("bad_id")  # the stream ends in an error event
        t.join(30)
        assert b'"error"' in out["body"]
        _stream(s.url, {}, max_tokens=3)  # one that finishes
        httpx.post(s.url + "/v1/completions", json={"prompt": "x", "n": 0})  # a 400
        m = scrape(s.url)
        requests = "tokenwire_requests_total"
        assert value(m, requests, route="completion", status="500") == 1
        assert value(m, requests, route="completion", status="200") == 1
        assert value(m, requests, route="completion", status="400") == 1
        assert value(m, "vllm:request_success_total", finished_reason="length", **engine) == 1
        errors = "tokenwire_request_errors_total"
        assert value(m, errors, error_type="internal_error") == 1
        assert value(m, errors, error_type="invalid_request_error") == 1
        assert value(m, "vllm:e2e_request_latency_seconds_count", **engine) == 1
        assert value(m, "vllm:time_to_first_token_seconds_count", **engine) == 2
        assert value(m, "vllm:inter_token_latency_seconds_count", **engine) > 0
