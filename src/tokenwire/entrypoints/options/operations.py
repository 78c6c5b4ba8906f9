"""Flags for running the server: logging (the level, the access log) and CPU pinning."""

from __future__ import annotations

import argparse
import logging
import os

__all__ = ["add_arguments", "add_log_level", "apply", "configure_logging"]


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """``--log-level``."""
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s)",
    )


def add_arguments(serve: argparse.ArgumentParser) -> None:
    """CPU pinning, the access log and the log level."""
    serve.add_argument(
        "--cpu",
        type=int,
        default=None,
        help="pin the server process to this CPU core (Linux)",
    )
    serve.add_argument(
        "--disable-access-log",
        action="store_true",
        help="no log line per request (on by default: method, path, status and duration)",
    )
    add_log_level(serve)


def configure_logging(args: argparse.Namespace) -> None:
    """The log format and ``--log-level``."""
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")


def apply(args: argparse.Namespace) -> None:
    """Logging and ``--cpu``, for the process about to serve."""
    configure_logging(args)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
