"""Flags that bound what a request or a connection may take: requests in flight, stop strings,
connections, header, body, idle and stall timeouts, body size, and the shutdown's grace."""

from __future__ import annotations

import argparse

from tokenwire.messages.sampling import DEFAULT_MAX_STOP_STR_LEN
from tokenwire.server.config import RequestLimits
from tokenwire.server.serving import ConnectionLimits

__all__ = ["add_arguments", "check", "connection_limits", "request_limits"]


def add_arguments(serve: argparse.ArgumentParser) -> None:
    """The request and connection limits."""
    serve.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=1024,
        help="engine requests in flight (each choice counts); past it new ones wait for a "
        "place (--max-waiting-requests), then get 429 (default: %(default)s)",
    )
    serve.add_argument(
        "--max-stop-str-len",
        type=int,
        default=DEFAULT_MAX_STOP_STR_LEN,
        help="longest stop string a request may send, in UTF-8 bytes; longer ones get 400 "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        default=8192,
        help="connections admitted at a time, in the order they come; requests on the others "
        "get 503 (/health still answers); 0: no limit (default: %(default)s)",
    )
    serve.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds from a request's first byte to the end of its headers, 408 past it; 0: "
        "no limit (default: %(default)s)",
    )
    serve.add_argument(
        "--idle-timeout",
        type=float,
        default=5.0,
        help="seconds a connection may stay silent before its first request and between "
        "requests (default: %(default)s)",
    )
    serve.add_argument(
        "--h11-max-header-count",
        type=int,
        default=256,
        help="header fields a request may have, 431 past it; 0: no limit (default: %(default)s)",
    )
    serve.add_argument(
        "--h11-max-incomplete-event-size",
        type=int,
        default=4 << 20,
        help="bytes a request's line and headers may take, 431 past it; 0: no limit "
        "(default: %(default)s, 4 MiB)",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT, seconds requests in flight have to finish before they end "
        "with an error (default: %(default)s)",
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        default=32 << 20,
        help="largest request body in bytes, refused with 413 past it; 0: no limit "
        "(default: %(default)s, 32 MiB)",
    )
    serve.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        help="seconds a client has to send its request body once the headers are in, 408 past "
        "it; 0: no limit (default: %(default)s)",
    )
    serve.add_argument(
        "--stall-timeout",
        type=float,
        default=30.0,
        help="seconds a streaming client may read nothing while output waits for it before its "
        "request is ended (engine slot freed, connection closed); 0: never "
        "(default: %(default)s)",
    )


def check(args: argparse.Namespace) -> None:
    """Refuse limits that cannot work (``SystemExit`` with the reason)."""
    if args.max_stop_str_len < 1:
        raise SystemExit("tokenwire: --max-stop-str-len must be at least 1")


def request_limits(args: argparse.Namespace) -> RequestLimits:
    """Per-request bounds."""
    return RequestLimits(max_stop_str_len=args.max_stop_str_len)


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    """Connection admission and timeouts."""
    return ConnectionLimits(
        max_connections=args.max_connections or None,
        header_timeout=args.header_timeout or None,
        idle_timeout=args.idle_timeout or None,
        max_header_count=args.h11_max_header_count or None,
        max_header_bytes=args.h11_max_incomplete_event_size or None,
    )
