"""OpenTelemetry traces (``--otlp-traces-endpoint``): one span per generation request, from its
arrival to its last byte, named and attributed as vLLM's (``llm_request``, kind SERVER;
``gen_ai.request.id``, ``gen_ai.response.model``, ``gen_ai.usage.prompt_tokens`` and
``completion_tokens``, ``gen_ai.latency.time_to_first_token``, ``e2e``, ``time_in_queue`` and the
engine's prefill, decode and inference time where the engine reports them, the request's
``max_tokens``, ``temperature``, ``top_p`` and ``n``), in the trace its ``traceparent`` header
names. The span is built once the response is over, from the request's ``RequestRecord``: no work
per token.

The OpenTelemetry SDK and OTLP exporter are an optional extra (``pip install tokenwire[otel]``),
imported only here, only when tracing is on. OTLP over HTTP/protobuf by default (the endpoint a
URL: ``http://collector:4318/v1/traces``, or the collector's base URL, to which ``/v1/traces`` is
added); gRPC when ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc`` and the gRPC exporter is installed
(vLLM's default protocol). The SDK's own ``OTEL_*`` settings apply (batching, headers, TLS).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from tokenwire.server.observe import RequestRecord

__all__ = ["DETAILED_MODULES", "SPAN_NAME", "Tracing", "TracingUnavailable", "missing_packages"]

#: vLLM's span name for a request.
SPAN_NAME = "llm_request"
#: ``--collect-detailed-traces`` takes vLLM's values.
DETAILED_MODULES = ("model", "worker", "all")

# vLLM's span attributes (vllm/tracing/utils.py, SpanAttributes).
_REQUEST_ID = "gen_ai.request.id"
_RESPONSE_MODEL = "gen_ai.response.model"
_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
_MAX_TOKENS = "gen_ai.request.max_tokens"
_TOP_P = "gen_ai.request.top_p"
_TEMPERATURE = "gen_ai.request.temperature"
_N = "gen_ai.request.n"
_TTFT = "gen_ai.latency.time_to_first_token"
_E2E = "gen_ai.latency.e2e"
_QUEUE = "gen_ai.latency.time_in_queue"
_PREFILL = "gen_ai.latency.time_in_model_prefill"
_DECODE = "gen_ai.latency.time_in_model_decode"
_INFERENCE = "gen_ai.latency.time_in_model_inference"
# OpenTelemetry's semantic conventions, where vLLM has no name.
_FINISH_REASONS = "gen_ai.response.finish_reasons"
_STATUS = "http.response.status_code"
_ROUTE = "http.route"
_ERROR_TYPE = "error.type"
# tokenwire's own (--collect-detailed-traces).
_FRONTEND = "tokenwire.latency.time_before_engine"

_ROUTES = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}


class TracingUnavailable(RuntimeError):
    """Tracing was asked for, but its packages (or the chosen protocol's) are not installed."""


def missing_packages(protocol: str = "http/protobuf") -> str | None:
    """Why tracing cannot run here (the packages to install), or None when it can."""
    try:
        import opentelemetry.sdk.trace

        if protocol == "grpc":
            import opentelemetry.exporter.otlp.proto.grpc.trace_exporter
        else:
            import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
    except ImportError as exc:
        wanted = (
            "opentelemetry-sdk and opentelemetry-exporter-otlp-proto-grpc"
            if protocol == "grpc"
            else "opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http "
            "(pip install 'tokenwire[otel]')"
        )
        return f"{wanted} are needed ({exc})"
    return None


def _protocol() -> str:
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or "http/protobuf"


def _http_endpoint(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: the endpoint as given, or ``/v1/traces`` on a base URL."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https"):
        raise ValueError(
            f"--otlp-traces-endpoint must be an http(s) URL for OTLP over HTTP, got {endpoint!r} "
            "(for gRPC set OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc)"
        )
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


class Tracing:
    """Sends a span per generation request to an OTLP endpoint (``detailed``: with
    ``--collect-detailed-traces``, the span also carries tokenwire's own timings and events)."""

    def __init__(
        self,
        endpoint: str,
        *,
        detailed: bool = False,
        service_name: str = "tokenwire",
        exporter: Any = None,
    ) -> None:
        protocol = _protocol()
        if protocol not in ("http/protobuf", "grpc"):
            raise ValueError(f"unsupported OTEL_EXPORTER_OTLP_TRACES_PROTOCOL {protocol!r}")
        missing = missing_packages(protocol)
        if missing is not None:
            raise TracingUnavailable(f"--otlp-traces-endpoint: {missing}")
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if exporter is None:
            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                    OTLPSpanExporter as GrpcExporter,
                )

                exporter = GrpcExporter(endpoint=endpoint)
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter as HttpExporter,
                )

                exporter = HttpExporter(endpoint=_http_endpoint(endpoint))
        resource = Resource.create(
            {"service.name": service_name, "tokenwire.process_id": str(os.getpid())}
        )
        self.endpoint = endpoint
        self.detailed = detailed
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("tokenwire")
        self._propagator = TraceContextTextMapPropagator()
        self._kind = SpanKind.SERVER
        self._error = Status(StatusCode.ERROR)
        self._closed = False

    def emit(self, record: RequestRecord) -> None:
        """The span of one request whose response is over."""
        if self._closed:
            return
        ended = time.perf_counter()
        start_ns = record.received_ns
        end_ns = start_ns + int((ended - record.received) * 1e9)
        attrs: dict[str, Any] = {
            _REQUEST_ID: record.id or "",
            _RESPONSE_MODEL: record.model,
            _PROMPT_TOKENS: record.prompt_tokens,
            _COMPLETION_TOKENS: record.completion_tokens,
            _E2E: ended - record.received,
            _N: record.n,
            _ROUTE: _ROUTES.get(record.route, "/" + record.route),
        }
        if record.first_chunk:
            attrs[_TTFT] = record.first_chunk - record.received
        if record.max_tokens is not None:
            attrs[_MAX_TOKENS] = record.max_tokens
        if record.temperature is not None:
            attrs[_TEMPERATURE] = record.temperature
        if record.top_p is not None:
            attrs[_TOP_P] = record.top_p
        if record.finish_reasons:
            attrs[_FINISH_REASONS] = list(record.finish_reasons)
        if record.times:  # the engine's phases of the request's first choice to report them
            t = record.times[0]
            attrs[_QUEUE] = max(0.0, t.scheduled - t.queued)
            attrs[_PREFILL] = max(0.0, t.first_token - t.scheduled)
            attrs[_DECODE] = max(0.0, t.last_token - t.first_token)
            attrs[_INFERENCE] = max(0.0, t.last_token - t.scheduled)
        if record.status is not None:
            attrs[_STATUS] = record.status
        failed = record.error is not None or (record.status or 200) >= 500
        if record.error is not None:
            attrs[_ERROR_TYPE] = record.error
        if self.detailed and record.submitted_at:
            attrs[_FRONTEND] = record.submitted_at - record.received
        headers = _trace_headers(record.scope)
        context = self._propagator.extract(headers) if headers else None
        span = self._tracer.start_span(
            SPAN_NAME, context=context, kind=self._kind, attributes=attrs, start_time=start_ns
        )
        if self.detailed:
            if record.submitted_at:
                span.add_event("submitted", timestamp=_at(record, record.submitted_at))
            if record.first_chunk:
                span.add_event("first_chunk", timestamp=_at(record, record.first_chunk))
        if failed:
            span.set_status(self._error)
        span.end(end_time=end_ns)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Send every span queued so far."""
        return bool(self._provider.force_flush(int(timeout_s * 1000)))

    def shutdown(self) -> None:
        """Send what is queued and stop."""
        if not self._closed:
            self._closed = True
            self._provider.shutdown()


def _at(record: RequestRecord, perf: float) -> int:
    return record.received_ns + int((perf - record.received) * 1e9)


def _trace_headers(scope: dict[str, Any]) -> dict[str, str]:
    """The request's W3C trace context headers (``traceparent``, ``tracestate``)."""
    out = {}
    for key, value in scope.get("headers", ()):
        name = key.lower()
        if name in (b"traceparent", b"tracestate"):
            out[name.decode()] = value.decode("latin-1")
    return out
