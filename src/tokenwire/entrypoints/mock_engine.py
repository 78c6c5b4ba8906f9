"""``tokenwire mock-engine``: the synthetic engine behind the engine side of vLLM's EngineCore
protocol, dialing a frontend's handshake address, with vLLM's prefix cache, KV-cache events,
LoRA and scheduling flags modelled."""

from __future__ import annotations

import argparse

from tokenwire.entrypoints.options import engine, fleet, operations
from tokenwire.tokenizer import Tokenizer

__all__ = ["add_arguments", "main"]


def add_arguments(mock: argparse.ArgumentParser) -> None:
    """The mock engine's flags."""
    mock.add_argument(
        "--handshake-address", required=True, help="the frontend's tcp://HOST:PORT to dial"
    )
    mock.add_argument(
        "--data-parallel-rank", type=int, default=0, help="this engine's rank (default: 0)"
    )
    mock.add_argument(
        "--tokenizer", default=None, help="the tokenizer (default: the bundled Qwen3 one)"
    )
    mock.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="the context length it reports (default: the tokenizer's)",
    )
    mock.add_argument(
        "--runner",
        choices=["generate", "pooling", "both"],
        default="generate",
        help="the tasks it says it runs (vLLM's get_supported_tasks): a generation model's, a "
        "pooling model's (embed, token_embed: the synthetic engine's vectors) or both "
        "(default: %(default)s)",
    )
    mock.add_argument(
        "--stats-file",
        default=None,
        metavar="PATH",
        help="when it exits, write its counters there as JSON: requests added and aborted, "
        "prefix-cache lookups (requests, prompt tokens, tokens found cached)",
    )
    engine.add_synthetic_arguments(mock)
    fleet.add_mock_engine_arguments(mock)
    operations.add_log_level(mock)


def main(args: argparse.Namespace) -> int:
    """Run the mock engine until its frontend goes."""
    from tokenwire.engine.vllm.mock import run_mock_engine

    operations.configure_logging(args)
    tok = Tokenizer.from_pretrained(args.tokenizer) if args.tokenizer else Tokenizer.default()
    try:
        cache = fleet.mock_cache_config(args)
    except ValueError as exc:
        raise SystemExit(f"tokenwire mock-engine: {exc}") from None
    run_mock_engine(
        tok,
        engine.synthetic_config(args),
        args.handshake_address,
        rank=args.data_parallel_rank,
        max_model_len=args.max_model_len,
        runner=args.runner,
        cache=cache,
        stats_file=args.stats_file,
    )
    return 0
