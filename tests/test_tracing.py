"""OpenTelemetry traces (``--otlp-traces-endpoint``) checked at a real OTLP receiver: an OTLP/HTTP
endpoint the test starts, built from the ``opentelemetry-proto`` messages (the OpenTelemetry
collector is not installable from the package registries here). One span per generation request,
vLLM's name and attributes, the trace its ``traceparent`` names; none for other requests."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.entrypoints.cli import build_parser
from tokenwire.entrypoints.options import operations
from tokenwire.server.observe import ObserveConfig
from tokenwire.server.tracing import Tracing

from conftest import REPO
from served import MODEL, serve
from test_listening import free_port
from test_listening import serve as serve_process

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Receiver:
    """An OTLP/HTTP traces endpoint: ``POST /v1/traces`` with an ``ExportTraceServiceRequest``;
    keeps every span with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Span]] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.paths.append(self.path)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for rs in request.resource_spans:
                    resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        receiver.spans.extend((resource, span) for span in ss.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def wait(self, count: int, timeout: float = 20) -> list[tuple[dict[str, Any], Span]]:
        deadline = time.monotonic() + timeout
        while len(self.spans) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return list(self.spans)


@contextlib.contextmanager
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    thread = threading.Thread(target=r.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attrs(span: Span) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in span.attributes}


def test_one_span_per_generation_request_at_an_otlp_receiver():
    with receiver() as otlp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {"OTEL_BSP_SCHEDULE_DELAY": "50"}
        # The collector's base URL: /v1/traces is added.
        flags = ["--port", str(port), "--otlp-traces-endpoint", otlp.url, "--step-time-ms", "2"]
        with serve_process(*flags, env=env):
            headers = {"traceparent": TRACEPARENT, "X-Request-Id": "trace-me"}
            body = {"model": "ops-model", "prompt": "Hello", "max_tokens": 6, "temperature": 0.5}
            body |= {"stream": True, "stream_options": {"include_usage": True}}
            with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
                chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
            usage = chunks[-1]["usage"]
            chat = {"model": "ops-model", "messages": [{"role": "user", "content": "Hi"}]}
            answer = httpx.post(url + "/v1/chat/completions", json={**chat, "max_tokens": 3})
            httpx.get(url + "/health")  # no span: not a generation request
            assert httpx.post(url + "/v1/completions", json={"prompt": 1}).status_code == 400
            spans = otlp.wait(2)
            time.sleep(0.3)  # (and no more come)
            spans = list(otlp.spans)
    assert set(otlp.paths) == {"/v1/traces"}
    assert len(spans) == 2, [s.name for _, s in spans]
    by_id = {attrs(s)["gen_ai.request.id"]: (resource, s) for resource, s in spans}
    resource, span = by_id["trace-me"]
    assert resource["service.name"] == "tokenwire"
    assert span.name == "llm_request" and span.kind == Span.SPAN_KIND_SERVER
    # In the client's trace, under its span.
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    a = attrs(span)
    assert a["gen_ai.response.model"] == "ops-model"
    assert a["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.completion_tokens"] == usage["completion_tokens"] == 6
    assert a["gen_ai.request.max_tokens"] == 6 and a["gen_ai.request.n"] == 1
    assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.top_p"] == 1.0
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["http.response.status_code"] == 200 and a["http.route"] == "/v1/completions"
    # Receipt to last byte; the engine's queue time and phases inside it.
    e2e = a["gen_ai.latency.e2e"]
    assert 0 < a["gen_ai.latency.time_to_first_token"] < e2e
    assert abs((span.end_time_unix_nano - span.start_time_unix_nano) / 1e9 - e2e) < 1e-3
    assert 0 <= a["gen_ai.latency.time_in_queue"] < e2e
    assert (
        0 < a["gen_ai.latency.time_in_model_decode"] <= a["gen_ai.latency.time_in_model_inference"]
    )
    assert a["gen_ai.latency.time_in_model_inference"] < e2e
    assert "tokenwire.latency.time_before_engine" not in a  # (detailed traces only)
    # A request without trace context starts a trace of its own.
    _, chat_span = by_id[answer.json()["id"].removeprefix("chatcmpl-")]
    assert not chat_span.parent_span_id and chat_span.trace_id.hex() != TRACE_ID
    assert attrs(chat_span)["http.route"] == "/v1/chat/completions"
    assert chat_span.status.code != Status.STATUS_CODE_ERROR


def test_detailed_traces_and_a_stream_that_fails_midway():
    with receiver() as otlp:
        tracing = Tracing(otlp.url + "/v1/traces", detailed=True)
        observe = ObserveConfig(tracing=tracing)
        with serve(SyntheticConfig(step_time=0.01), observe=observe) as s:
            body = {"model": MODEL, "prompt": "Hi", "max_tokens": 500, "stream": True}
            with httpx.stream("POST", s.url + "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                next(lines)
                s.engine.inject("error", next(iter(s.runtime.shard.live_rids())))
                rest = list(lines)
            assert any('"error"' in x for x in rest)
            tracing.flush()
            (_, span), *_ = otlp.wait(1)
    a = attrs(span)
    assert span.status.code == Status.STATUS_CODE_ERROR and a["error.type"] == "internal_error"
    assert "gen_ai.response.finish_reasons" not in a
    assert 0 <= a["tokenwire.latency.time_before_engine"] < a["gen_ai.latency.e2e"]
    assert [e.name for e in span.events] == ["submitted", "first_chunk"]
    assert span.start_time_unix_nano <= span.events[0].time_unix_nano <= span.end_time_unix_nano


def test_tracing_refused_with_the_packages_to_install_when_they_are_missing(monkeypatch):
    args = build_parser().parse_args(["serve", "--otlp-traces-endpoint", "http://c:4318"])
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # not installed
    with pytest.raises(SystemExit, match=r"pip install 'tokenwire\[otel\]'"):
        operations.observe_config(args)
    args = build_parser().parse_args(["serve", "--collect-detailed-traces", "model"])
    with pytest.raises(SystemExit, match="needs --otlp-traces-endpoint"):
        operations.observe_config(args)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--collect-detailed-traces", "everything"])


def test_the_server_never_imports_opentelemetry_unless_tracing_is_on():
    code = (
        "import sys\n"
        "from tokenwire.entrypoints import cli, serve, vllm_frontend\n"
        "from tokenwire.server import app, streaming\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "[]"
