"""``tokenwire``'s command line: ``tokenwire serve`` runs the HTTP server, ``tokenwire
mock-engine`` the synthetic engine behind vLLM's EngineCore protocol."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tokenwire.entrypoints import mock_engine, serve
from tokenwire.entrypoints.options import (
    adapters,
    engine,
    fleet,
    limits,
    media,
    operations,
    output,
    server,
)

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="tokenwire",
        description="tokenwire: the streaming frontend of LLM inference.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible HTTP server",
        description=(
            "Run the OpenAI-compatible (/v1/completions, /v1/chat/completions) and SGLang-native "
            "(/generate) HTTP server. With no arguments it serves the bundled Qwen3 tokenizer "
            "over the synthetic engine, replaying realistic text at a demo pace."
        ),
    )
    server.add_arguments(cmd)
    engine.add_arguments(cmd)
    limits.add_arguments(cmd)
    output.add_arguments(cmd)
    media.add_arguments(cmd)
    adapters.add_arguments(cmd)
    fleet.add_arguments(cmd)
    operations.add_arguments(cmd)
    mock = sub.add_parser(
        "mock-engine",
        help="run the synthetic engine as a headless vLLM engine (for any vLLM frontend)",
        description=(
            "Speak the engine side of vLLM's EngineCore protocol over the synthetic engine: dial "
            "a vLLM frontend's handshake address (tokenwire serve --engine vllm "
            "--handshake-address, or stock vllm serve waiting for a remote engine) and serve it."
        ),
    )
    mock_engine.add_arguments(mock)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (``argv``: the arguments, default ``sys.argv[1:]``)."""
    raw = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(raw)
    if args.command == "serve":
        return serve.main(args, raw[raw.index("serve") + 1 :])
    if args.command == "mock-engine":
        return mock_engine.main(args)
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
