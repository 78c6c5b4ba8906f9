"""Flags for running the server: logging (the level, the access log, request logs), request ids
in responses, OpenTelemetry traces, and CPU pinning."""

from __future__ import annotations

import argparse
import logging
import os

from tokenwire.server.observe import ObserveConfig

__all__ = [
    "add_arguments",
    "add_log_level",
    "apply",
    "check_observe",
    "configure_logging",
    "observe_config",
]


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """``--log-level``."""
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s)",
    )


def _detailed_modules(value: str) -> list[str]:
    from tokenwire.server.tracing import DETAILED_MODULES

    modules = [m.strip() for m in value.split(",") if m.strip()]
    for m in modules:
        if m not in DETAILED_MODULES:
            raise argparse.ArgumentTypeError(
                f"{m!r} is not one of {', '.join(DETAILED_MODULES)} (comma-separated)"
            )
    return modules


def add_arguments(serve: argparse.ArgumentParser) -> None:
    """CPU pinning, the access log, request logs and ids, traces and the log level."""
    serve.add_argument(
        "--cpu",
        type=int,
        default=None,
        help="pin the server process to this CPU core (Linux)",
    )
    serve.add_argument(
        "--disable-access-log",
        "--disable-uvicorn-access-log",
        action="store_true",
        help="no log line per request (on by default: method, path, status and duration)",
    )
    serve.add_argument(
        "--enable-log-requests",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="log each generation request (logger tokenwire.requests): its id, route, model, "
        "sizes and sampling parameters at INFO, its prompt at DEBUG",
    )
    serve.add_argument(
        "--enable-log-outputs",
        action="store_true",
        help="also log each choice's output and finish reason when it ends (needs "
        "--enable-log-requests)",
    )
    serve.add_argument(
        "--max-log-len",
        type=int,
        default=None,
        help="logged prompts and outputs cut to this many characters (or token ids); "
        "default: whole",
    )
    serve.add_argument(
        "--enable-request-id-headers",
        action="store_true",
        help="every response carries X-Request-Id: the request's header, else the request's own id",
    )
    serve.add_argument(
        "--otlp-traces-endpoint",
        default=None,
        metavar="URL",
        help="send an OpenTelemetry span per generation request to this OTLP endpoint "
        "(HTTP/protobuf, e.g. http://collector:4318/v1/traces; needs pip install "
        "'tokenwire[otel]')",
    )
    serve.add_argument(
        "--collect-detailed-traces",
        type=_detailed_modules,
        default=None,
        metavar="MODULES",
        help="with --otlp-traces-endpoint: more detail in each span (tokenwire's own timings) "
        "and, for vLLM engines tokenwire starts, vLLM's detailed traces of these modules "
        "(model, worker, all; comma-separated)",
    )
    add_log_level(serve)


def check_observe(args: argparse.Namespace) -> None:
    """Stop with the reason when the request log, request id or trace flags cannot work."""
    if args.enable_log_outputs and not args.enable_log_requests:
        raise SystemExit("tokenwire: --enable-log-outputs needs --enable-log-requests")
    if args.max_log_len is not None and args.max_log_len < 0:
        raise SystemExit("tokenwire: --max-log-len must be at least 0")
    if args.collect_detailed_traces and not args.otlp_traces_endpoint:
        raise SystemExit("tokenwire: --collect-detailed-traces needs --otlp-traces-endpoint")
    if args.otlp_traces_endpoint:
        from tokenwire.server.tracing import missing_packages

        missing = missing_packages(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or "")
        if missing is not None:
            raise SystemExit(f"tokenwire: --otlp-traces-endpoint: {missing}")


def observe_config(args: argparse.Namespace, *, service_name: str = "tokenwire") -> ObserveConfig:
    """Request logs, request id headers and traces, as the flags say (a flag that cannot work
    here stops the server with its reason)."""
    check_observe(args)
    tracing = None
    if args.otlp_traces_endpoint:
        from tokenwire.server.tracing import Tracing, TracingUnavailable

        try:
            tracing = Tracing(
                args.otlp_traces_endpoint,
                detailed=bool(args.collect_detailed_traces),
                service_name=service_name,
            )
        except (TracingUnavailable, ValueError) as exc:
            raise SystemExit(f"tokenwire: {exc}") from None
    return ObserveConfig(
        log_requests=args.enable_log_requests,
        log_outputs=args.enable_log_outputs,
        max_log_len=args.max_log_len,
        request_id_headers=args.enable_request_id_headers,
        tracing=tracing,
    )


def configure_logging(args: argparse.Namespace) -> None:
    """The log format and ``--log-level``."""
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")


def apply(args: argparse.Namespace) -> None:
    """Logging and ``--cpu``, for the process about to serve."""
    configure_logging(args)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
