"""Flags of the engine: the synthetic one (also ``tokenwire mock-engine``'s), vLLM engines
spawned or dialing in over their EngineCore protocol, and several API-server processes over them;
and the engines they describe."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable
from typing import Any

from tokenwire.engine import Engine
from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.engine.synthetic_pooling import DEFAULT_EMBEDDING_DIM, SyntheticPooler
from tokenwire.entrypoints.options import adapters, fleet
from tokenwire.pooling.tasks import PoolingModel
from tokenwire.tokenizer import Tokenizer

__all__ = [
    "add_arguments",
    "add_synthetic_arguments",
    "engine_transport",
    "mock_engine_args",
    "pooling_settings",
    "synthetic_config",
    "vllm_engine",
    "vllm_engines",
]


def add_arguments(serve: argparse.ArgumentParser) -> None:
    """``--engine`` and the flags of each engine, and ``--api-server-count``."""
    serve.add_argument(
        "--engine",
        choices=["synthetic", "vllm"],
        default="synthetic",
        help="the engine to serve: the bundled synthetic one, or vLLM engines over their "
        "EngineCore protocol (default: %(default)s)",
    )
    _add_vllm_arguments(serve)
    _add_scaleout_arguments(serve)
    add_synthetic_arguments(serve)


def add_synthetic_arguments(parser: argparse.ArgumentParser) -> None:
    """The synthetic engine's flags."""
    parser.add_argument(
        "--step-time-ms",
        type=float,
        default=20.0,
        help="synthetic engine: milliseconds per decode step, 0 for as fast as possible "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=256,
        help="synthetic engine: requests decoded together (default: %(default)s)",
    )
    parser.add_argument(
        "--tokens-per-step",
        type=int,
        default=1,
        help="synthetic engine: tokens per request per step, >1 mimics speculative decoding "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--synthetic-output",
        choices=["replay", "echo", "random"],
        default="replay",
        help="synthetic engine: replay a realistic text, echo the prompt, or random ids "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--eos-prob",
        type=float,
        default=0.0,
        help="synthetic engine: chance of EOS at each token (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="synthetic engine: base seed for output choices (default: %(default)s)",
    )
    parser.add_argument(
        "--embedding-dim",
        type=int,
        default=DEFAULT_EMBEDDING_DIM,
        help="synthetic engine: the size of its embeddings (deterministic unit vectors whose "
        "cosine similarity follows the tokens inputs share) (default: %(default)s)",
    )
    parser.add_argument(
        "--grammar-cpu-seconds",
        type=float,
        default=10.0,
        help="synthetic engine: CPU seconds a structured-output request's token choices may "
        "take; past it the output only closes what is open, past twice it the request ends "
        "with an error; 0 for no bound (default: %(default)s)",
    )
    parser.add_argument(
        "--grammar-compile-timeout",
        type=float,
        default=10.0,
        help="synthetic engine: seconds a grammar's compile and first rollout may take; 0 for "
        "no bound (default: %(default)s)",
    )


def _add_scaleout_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--api-server-count",
        type=int,
        default=1,
        help="API-server processes sharing the listening socket, each talking to every engine "
        "(vLLM's topology; the synthetic engine then runs as tokenwire mock-engine processes, "
        "one per --data-parallel-size) (default: %(default)s)",
    )
    # One API server in the supervisor's topology (engines in their own processes): the N = 1
    # baseline of bench/scale.py. Set by the supervisor on the workers it starts (not for users).
    serve.add_argument("--force-supervisor", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    serve.add_argument("--worker-fds", default=None, help=argparse.SUPPRESS)
    serve.add_argument("--worker-metrics-dir", default=None, help=argparse.SUPPRESS)


def _add_vllm_arguments(serve: argparse.ArgumentParser) -> None:
    vllm = serve.add_argument_group("vLLM engine (--engine vllm)")
    vllm.add_argument(
        "--model",
        default=None,
        help="spawn a headless vLLM engine for this model directory or hub id (its tokenizer "
        "is served unless --tokenizer says otherwise)",
    )
    vllm.add_argument(
        "--vllm-command",
        default="vllm",
        help="the vLLM command to spawn, split like a shell line (default: %(default)s)",
    )
    vllm.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for the spawned vLLM (repeatable; write --vllm-arg=--flag "
        "for arguments that start with a dash)",
    )
    vllm.add_argument(
        "--handshake-address",
        default=None,
        help="instead of spawning: bind tcp://HOST:PORT and wait for headless engines started "
        "elsewhere with vllm serve MODEL --headless --data-parallel-address HOST "
        "--data-parallel-rpc-port PORT",
    )
    vllm.add_argument(
        "--engine-transport",
        choices=("auto", "tcp", "ipc"),
        default="auto",
        help="how the engines reach this server's input and output sockets: tcp (on the "
        "--handshake-address host) or ipc (Unix sockets in a private directory: the engines "
        "must run on this host, under the same user; cheaper per message); auto: ipc for the "
        "engines it spawns (--model), as vLLM does for local engines, tcp for engines that dial "
        "--handshake-address (with --api-server-count above 1 the API servers always use Unix "
        "sockets) (default: %(default)s)",
    )
    vllm.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="vLLM engines (data-parallel ranks) to spawn or wait for (default: %(default)s)",
    )
    vllm.add_argument(
        "--engine-stall-timeout",
        type=float,
        default=60.0,
        help="seconds an engine with requests in flight may say nothing before it is pinged; "
        "if the ping goes unanswered as long, its requests end with an error, /health turns "
        "503 (with no other engine), and it is out of rotation until it answers; 0: never "
        "(default: %(default)s)",
    )
    vllm.add_argument(
        "--pooler-config",
        type=_pooler_config,
        default=None,
        metavar="JSON",
        help="vLLM's pooler config for a pooling model, passed to the spawned vLLM; tokenwire "
        "reads its task (which pooling task to serve) and the dimensions and use_activation a "
        'request leaves unset, e.g. \'{"task": "embed"}\'',
    )
    vllm.add_argument(
        "--engine-start-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for the engines to be ready; on timeout the error says what they "
        "were doing, with their last lines (on CPU, VLLM_CPU_OMP_THREADS_BIND=nobind keeps vLLM "
        "from pinning an engine to a busy core) (default: %(default)s)",
    )


def _pooler_config(value: str) -> dict[str, Any]:
    try:
        config = json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not JSON: {value!r}") from None
    if not isinstance(config, dict):
        raise argparse.ArgumentTypeError(f"not a JSON object: {value!r}")
    return config


def pooling_settings(args: argparse.Namespace) -> tuple[PoolingModel | None, dict[str, Any]]:
    """What the pooling routes read of the model (its folder's config: ``--model``, else a
    ``--tokenizer`` folder) and of ``--pooler-config``."""
    folder = getattr(args, "model", None) or getattr(args, "tokenizer", None)
    model = PoolingModel.from_dir(folder) if folder and os.path.isdir(folder) else None
    synthetic_worker = (
        getattr(args, "worker_fds", None)
        and not getattr(args, "model", None)
        and not getattr(args, "handshake_address", None)
    )
    if synthetic_worker:
        # A worker of --api-server-count over mock engines: the synthetic engine's embeddings.
        model = SyntheticPooler(args.embedding_dim).model
    return model, dict(getattr(args, "pooler_config", None) or {})


def synthetic_config(args: argparse.Namespace) -> SyntheticConfig:
    """The synthetic engine's settings."""
    return SyntheticConfig(
        step_time=args.step_time_ms / 1000.0,
        max_batch_size=args.max_batch_size,
        tokens_per_step=args.tokens_per_step,
        output=args.synthetic_output,
        eos_prob=args.eos_prob,
        seed=args.seed,
        embedding_dim=args.embedding_dim,
        grammar_cpu_seconds=args.grammar_cpu_seconds or None,
        grammar_compile_timeout=args.grammar_compile_timeout or None,
    )


def mock_engine_args(args: argparse.Namespace) -> list[str]:
    """The ``tokenwire mock-engine`` arguments that run the synthetic engine as ``args`` set it
    (one process per data-parallel rank, under several API-server processes)."""
    out = [
        "--synthetic-output", args.synthetic_output,
        "--step-time-ms", str(args.step_time_ms),
        "--max-batch-size", str(args.max_batch_size),
        "--tokens-per-step", str(args.tokens_per_step),
        "--eos-prob", str(args.eos_prob),
        "--seed", str(args.seed),
        "--embedding-dim", str(args.embedding_dim),
        "--runner", "both",
        "--grammar-cpu-seconds", str(args.grammar_cpu_seconds),
        "--grammar-compile-timeout", str(args.grammar_compile_timeout),
        "--log-level", args.log_level,
    ]  # fmt: skip
    if args.tokenizer:
        out += ["--tokenizer", args.tokenizer]
    if args.max_model_len is not None:
        out += ["--max-model-len", str(args.max_model_len)]
    out += fleet.engine_args(args, mock=True)
    return out


def vllm_engines(args: argparse.Namespace) -> tuple[str, Any]:
    """Where the vLLM engines dial in, and the headless child to spawn (``--model``) or None
    (``--handshake-address``: they are started elsewhere)."""
    from tokenwire.engine.vllm.launch import VllmLauncher

    if args.handshake_address:
        return args.handshake_address, None
    if not args.model:
        raise SystemExit("tokenwire: --engine vllm needs --model (spawn) or --handshake-address")
    extra = list(args.vllm_arg)
    if args.max_model_len is not None and "--max-model-len" not in extra:
        extra += ["--max-model-len", str(args.max_model_len)]
    max_logprobs = getattr(args, "max_logprobs", 20)
    if max_logprobs != 20 and "--max-logprobs" not in extra:  # (the engine computes them)
        extra += ["--max-logprobs", str(max_logprobs)]
    detailed = getattr(args, "collect_detailed_traces", None)
    if detailed and "--collect-detailed-traces" not in extra:
        # vLLM's detailed traces are the engine's own spans: the engines get the endpoint too.
        extra += ["--otlp-traces-endpoint", args.otlp_traces_endpoint]
        extra += ["--collect-detailed-traces", ",".join(detailed)]
    if "--enable-lora" not in extra:
        extra += adapters.vllm_lora_args(args)
    pooler = getattr(args, "pooler_config", None)
    if pooler and not any(a.startswith("--pooler-config") for a in extra):
        extra += ["--pooler-config", json.dumps(pooler)]
    if hasattr(args, "mm_processor_cache_gb"):
        from tokenwire.entrypoints.options.media import vllm_media_args

        extra += vllm_media_args(args, extra)
    extra += fleet.engine_args(args, given=extra)
    launcher = VllmLauncher(
        args.model,
        command=shlex.split(args.vllm_command),
        data_parallel_size=args.data_parallel_size,
        extra_args=extra,
    )
    # The kernel picks the handshake's port when tokenwire binds it; the child is told the port
    # bound (a port found free and bound again later may be taken meanwhile).
    return "tcp://127.0.0.1:*", launcher


def engine_transport(args: argparse.Namespace, spawned: bool) -> str:
    """``--engine-transport`` resolved: ``auto`` is ``ipc`` for spawned engines (on this host),
    ``tcp`` for engines that dial in."""
    chosen = getattr(args, "engine_transport", "auto")
    if chosen == "auto":
        return "ipc" if spawned else "tcp"
    return chosen


def vllm_engine(
    args: argparse.Namespace, tok: Tokenizer, should_stop: Callable[[], bool]
) -> Engine:
    """The vLLM engine of ``serve --engine vllm``: spawned (``--model``) or attached
    (``--handshake-address``)."""
    from tokenwire.engine.vllm import VllmEngine, VllmEngineConfig

    if args.data_parallel_size < 1:
        raise SystemExit("tokenwire: --data-parallel-size must be at least 1")
    if args.worker_fds:  # a worker of --api-server-count: the supervisor did the handshake
        _listen, input_fd, output_fd = (int(x) for x in args.worker_fds.split(","))
        return VllmEngine(
            tok,
            VllmEngineConfig(
                data_parallel_size=args.data_parallel_size,
                input_fd=input_fd,
                output_fd=output_fd,
                client_index=args.worker_index,
                ready_timeout=args.engine_start_timeout,
                stall_timeout=args.engine_stall_timeout or None,
                should_stop=should_stop,
                **fleet.engine_config(args),
            ),
        )
    address, launcher = vllm_engines(args)

    def progress(line: str) -> None:
        print(f"tokenwire: {line}", file=sys.stderr, flush=True)

    return VllmEngine(
        tok,
        VllmEngineConfig(
            handshake_address=address,
            transport=engine_transport(args, spawned=launcher is not None),
            data_parallel_size=args.data_parallel_size,
            ready_timeout=args.engine_start_timeout,
            stall_timeout=args.engine_stall_timeout or None,
            launcher=launcher,
            progress=progress,
            # SIGTERM/SIGINT while the engines start (minutes) stop the startup at once.
            should_stop=should_stop,
            **fleet.engine_config(args),
        ),
    )
