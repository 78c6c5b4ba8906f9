"""``tokenwire`` command line: ``tokenwire serve`` runs the HTTP server."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from tokenwire.messages.sampling import DEFAULT_MAX_STOP_STR_LEN
from tokenwire.server import features

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenwire",
        description="tokenwire: the streaming frontend of LLM inference.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible HTTP server",
        description=(
            "Run the OpenAI-compatible (/v1/completions, /v1/chat/completions) and SGLang-native "
            "(/generate) HTTP server. With no arguments it serves the bundled Qwen3 tokenizer "
            "over the synthetic engine, replaying realistic text at a demo pace."
        ),
    )
    serve.add_argument(
        "--tokenizer",
        default=None,
        help="a model directory (tokenizer.json, tokenizer_config.json, config.json) or a "
        "Hugging Face hub id; default: the bundled Qwen3 tokenizer",
    )
    serve.add_argument(
        "--model-vocab-size",
        type=int,
        default=None,
        help="the model's vocabulary (embedding rows) when larger than the tokenizer's; prompt "
        "ids below it are accepted; default: config.json's vocab_size",
    )
    serve.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients use; default: the tokenizer's name",
    )
    serve.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context length (prompt plus output tokens); default: from the model config",
    )
    serve.add_argument(
        "--engine",
        choices=["synthetic"],
        default="synthetic",
        help="the engine to serve (default: %(default)s)",
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--port", type=int, default=8000, help="port to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=1024,
        help="engine requests in flight (each choice counts) before new ones get 429 "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--max-stop-str-len",
        type=int,
        default=DEFAULT_MAX_STOP_STR_LEN,
        help="longest stop string a request may send, in UTF-8 bytes; longer ones get 400 "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--step-time-ms",
        type=float,
        default=20.0,
        help="synthetic engine: milliseconds per decode step, 0 for as fast as possible "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--max-batch-size",
        type=int,
        default=256,
        help="synthetic engine: requests decoded together (default: %(default)s)",
    )
    serve.add_argument(
        "--tokens-per-step",
        type=int,
        default=1,
        help="synthetic engine: tokens per request per step, >1 mimics speculative decoding "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--synthetic-output",
        choices=["replay", "echo", "random"],
        default="replay",
        help="synthetic engine: replay a realistic text, echo the prompt, or random ids "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--eos-prob",
        type=float,
        default=0.0,
        help="synthetic engine: chance of EOS at each token (default: %(default)s)",
    )
    serve.add_argument(
        "--seed",
        type=int,
        default=0,
        help="synthetic engine: base seed for output choices (default: %(default)s)",
    )
    features.add_arguments(serve)
    serve.add_argument(
        "--cpu",
        type=int,
        default=None,
        help="pin the server process to this CPU core (Linux)",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s)",
    )
    return parser


def _serve(args: argparse.Namespace) -> int:
    if args.max_stop_str_len < 1:
        raise SystemExit("tokenwire: --max-stop-str-len must be at least 1")
    try:
        output_features = features.from_args(args)
    except ValueError as exc:
        raise SystemExit(f"tokenwire: {exc}") from None
    import uvicorn

    from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
    from tokenwire.server import ServerConfig, create_app
    from tokenwire.server.api import RequestLimits
    from tokenwire.tokenizer import DEFAULT_TOKENIZER_NAME, Tokenizer

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.tokenizer:
        tok = Tokenizer.from_pretrained(args.tokenizer, model_vocab_size=args.model_vocab_size)
        name = args.served_model_name or str(args.tokenizer)
    else:
        tok = Tokenizer.default(model_vocab_size=args.model_vocab_size)
        name = args.served_model_name or DEFAULT_TOKENIZER_NAME
    if args.max_model_len is not None:
        tok.max_model_len = args.max_model_len
    engine = SyntheticEngine(
        tok,
        SyntheticConfig(
            step_time=args.step_time_ms / 1000.0,
            max_batch_size=args.max_batch_size,
            tokens_per_step=args.tokens_per_step,
            output=args.synthetic_output,
            eos_prob=args.eos_prob,
            seed=args.seed,
        ),
    )
    app = create_app(
        tok,
        engine,
        ServerConfig(
            model_name=name,
            max_concurrent_requests=args.max_concurrent_requests,
            limits=RequestLimits(max_stop_str_len=args.max_stop_str_len),
            features=output_features,
        ),
    )
    print(
        f"tokenwire: serving {name!r} (vocab {tok.vocab_size}, model vocab {tok.model_vocab_size})"
        f" on http://{args.host}:{args.port}",
        flush=True,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
