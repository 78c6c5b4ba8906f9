"""``tokenwire`` command line: ``tokenwire serve`` runs the HTTP server."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

from tokenwire.messages.sampling import DEFAULT_MAX_STOP_STR_LEN
from tokenwire.server import features

__all__ = ["main", "build_parser"]


def _string_list(value: str) -> list[str]:
    """A JSON list of strings (as vLLM takes them) or a comma-separated list."""
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a JSON list: {value!r}") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise argparse.ArgumentTypeError(f"not a JSON list of strings: {value!r}")
        return items
    return [part.strip() for part in text.split(",") if part.strip()]


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
        choices=["synthetic", "vllm"],
        default="synthetic",
        help="the engine to serve: the bundled synthetic one, or vLLM engines over their "
        "EngineCore protocol (default: %(default)s)",
    )
    _add_vllm_args(serve)
    _add_scaleout_args(serve)
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
        "--api-key",
        default=os.environ.get("TOKENWIRE_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every route but /health and /metrics "
        "(default: $TOKENWIRE_API_KEY, else none)",
    )
    serve.add_argument(
        "--allowed-origins",
        type=_string_list,
        default=[],
        help="CORS: origins web pages may call from, as a JSON list or comma-separated "
        "('[\"*\"]' for any); default: CORS off",
    )
    serve.add_argument(
        "--allowed-methods",
        type=_string_list,
        default=["*"],
        help="CORS: allowed methods (default: all)",
    )
    serve.add_argument(
        "--allowed-headers",
        type=_string_list,
        default=["*"],
        help="CORS: allowed request headers (default: all)",
    )
    serve.add_argument(
        "--allow-credentials",
        action="store_true",
        help="CORS: allow credentials (cookies, Authorization) from the allowed origins",
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
    _add_synthetic_args(serve)
    features.add_arguments(serve)
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
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s)",
    )
    mock = sub.add_parser(
        "mock-engine",
        help="run the synthetic engine as a headless vLLM engine (for any vLLM frontend)",
        description=(
            "Speak the engine side of vLLM's EngineCore protocol over the synthetic engine: dial "
            "a vLLM frontend's handshake address (tokenwire serve --engine vllm "
            "--handshake-address, or stock vllm serve waiting for a remote engine) and serve it."
        ),
    )
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
    _add_synthetic_args(mock)
    mock.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s)",
    )
    return parser


def _add_synthetic_args(parser: argparse.ArgumentParser) -> None:
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


def _add_scaleout_args(serve: argparse.ArgumentParser) -> None:
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


def _supervise(args: argparse.Namespace, serve_args: list[str]) -> int:
    """``--api-server-count N``: the supervisor over N workers and the shared engines."""
    from tokenwire.server.supervisor import SupervisorConfig, run_supervisor

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.data_parallel_size < 1:
        raise SystemExit("tokenwire: --data-parallel-size must be at least 1")
    mock_args: list[str] = []
    launcher = None
    handshake = None
    if args.engine == "synthetic":
        mock_args = [
            "--synthetic-output", args.synthetic_output,
            "--step-time-ms", str(args.step_time_ms),
            "--max-batch-size", str(args.max_batch_size),
            "--tokens-per-step", str(args.tokens_per_step),
            "--eos-prob", str(args.eos_prob),
            "--seed", str(args.seed),
            "--log-level", args.log_level,
        ]  # fmt: skip
        if args.tokenizer:
            mock_args += ["--tokenizer", args.tokenizer]
        if args.max_model_len is not None:
            mock_args += ["--max-model-len", str(args.max_model_len)]
    else:
        handshake, launcher = _vllm_engines(args)
    return run_supervisor(
        SupervisorConfig(
            serve_args=serve_args,
            host=args.host,
            port=args.port,
            workers=args.api_server_count,
            engines=args.data_parallel_size,
            engine=args.engine,
            mock_args=mock_args,
            launcher=launcher,
            handshake_address=handshake,
            ready_timeout=args.engine_start_timeout,
            shutdown_timeout=args.shutdown_timeout,
        )
    )


def _add_vllm_args(serve: argparse.ArgumentParser) -> None:
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
        "--data-parallel-size",
        type=int,
        default=1,
        help="vLLM engines (data-parallel ranks) to spawn or wait for (default: %(default)s)",
    )
    vllm.add_argument(
        "--engine-start-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for the engines to be ready (default: %(default)s)",
    )


def _serve(args: argparse.Namespace) -> int:
    started_at = time.perf_counter()
    if args.max_stop_str_len < 1:
        raise SystemExit("tokenwire: --max-stop-str-len must be at least 1")
    try:
        output_features = features.from_args(args)
    except ValueError as exc:
        raise SystemExit(f"tokenwire: {exc}") from None

    from tokenwire.engine.synthetic import SyntheticEngine
    from tokenwire.server import ServerConfig, create_app
    from tokenwire.server.api import RequestLimits
    from tokenwire.server.security import SecurityConfig
    from tokenwire.server.serving import ConnectionLimits, uvicorn_config
    from tokenwire.tokenizer import DEFAULT_TOKENIZER_NAME, Tokenizer

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.engine == "vllm" and not args.tokenizer and args.model:
        args.tokenizer = args.model
    if args.tokenizer:
        tok = Tokenizer.from_pretrained(args.tokenizer, model_vocab_size=args.model_vocab_size)
        name = args.served_model_name or str(args.model or args.tokenizer)
    else:
        tok = Tokenizer.default(model_vocab_size=args.model_vocab_size)
        name = args.served_model_name or DEFAULT_TOKENIZER_NAME
    if args.max_model_len is not None:
        tok.max_model_len = args.max_model_len
    holder: dict[str, Any] = {}
    if args.engine == "vllm":
        engine = _vllm_engine(args, tok, holder)
    else:
        engine = SyntheticEngine(tok, _synthetic(args))
    app = create_app(
        tok,
        engine,
        ServerConfig(
            model_name=name,
            max_concurrent_requests=args.max_concurrent_requests,
            stall_timeout=args.stall_timeout or None,
            max_request_bytes=args.max_request_bytes or None,
            body_timeout=args.body_timeout or None,
            limits=RequestLimits(max_stop_str_len=args.max_stop_str_len),
            features=output_features,
            access_log=not args.disable_access_log,
            security=SecurityConfig(
                api_key=args.api_key or None,
                allowed_origins=tuple(args.allowed_origins),
                allowed_methods=tuple(args.allowed_methods),
                allowed_headers=tuple(args.allowed_headers),
                allow_credentials=args.allow_credentials,
            ),
            metrics_dir=args.worker_metrics_dir,
            worker_index=args.worker_index,
        ),
    )
    banner = (
        f"tokenwire: serving {name!r} (vocab {tok.vocab_size}, model vocab {tok.model_vocab_size})"
        f" on http://{args.host}:{args.port}"
    )
    limits = ConnectionLimits(
        max_connections=args.max_connections or None,
        header_timeout=args.header_timeout or None,
        idle_timeout=args.idle_timeout or None,
    )
    where: dict[str, Any] = {"host": args.host, "port": args.port}
    if args.worker_fds:  # a worker of --api-server-count: the supervisor's socket
        where = {"fd": int(args.worker_fds.split(",")[0])}
    config = uvicorn_config(
        app,
        limits,
        **where,
        log_level=args.log_level,
        access_log=False,  # tokenwire's own, with durations
    )
    _run_server(
        config,
        app,
        args.shutdown_timeout,
        banner if args.worker_index == 0 else "",
        started_at,
        holder,
    )
    return 0


def _synthetic(args: argparse.Namespace) -> Any:
    from tokenwire.engine.synthetic import SyntheticConfig

    return SyntheticConfig(
        step_time=args.step_time_ms / 1000.0,
        max_batch_size=args.max_batch_size,
        tokens_per_step=args.tokens_per_step,
        output=args.synthetic_output,
        eos_prob=args.eos_prob,
        seed=args.seed,
    )


def _vllm_engines(args: argparse.Namespace) -> tuple[str, Any]:
    """Where the vLLM engines dial in, and the headless child to spawn (``--model``) or None
    (``--handshake-address``: they are started elsewhere)."""
    from tokenwire.engine.vllm.launch import VllmLauncher, free_port

    if args.handshake_address:
        return args.handshake_address, None
    if not args.model:
        raise SystemExit("tokenwire: --engine vllm needs --model (spawn) or --handshake-address")
    port = free_port()
    extra = list(args.vllm_arg)
    if args.max_model_len is not None and "--max-model-len" not in extra:
        extra += ["--max-model-len", str(args.max_model_len)]
    launcher = VllmLauncher(
        args.model,
        port=port,
        command=shlex.split(args.vllm_command),
        data_parallel_size=args.data_parallel_size,
        extra_args=extra,
    )
    return f"tcp://127.0.0.1:{port}", launcher


def _vllm_engine(args: argparse.Namespace, tok: Any, holder: dict[str, Any]) -> Any:
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
                should_stop=lambda: bool(getattr(holder.get("server"), "should_exit", False)),
            ),
        )
    address, launcher = _vllm_engines(args)

    def progress(line: str) -> None:
        print(f"tokenwire: {line}", file=sys.stderr, flush=True)

    return VllmEngine(
        tok,
        VllmEngineConfig(
            handshake_address=address,
            data_parallel_size=args.data_parallel_size,
            ready_timeout=args.engine_start_timeout,
            launcher=launcher,
            progress=progress,
            # SIGTERM/SIGINT while the engines start (minutes) stop the startup at once.
            should_stop=lambda: bool(getattr(holder.get("server"), "should_exit", False)),
        ),
    )


def _mock_engine(args: argparse.Namespace) -> int:
    from tokenwire.engine.vllm.mock import run_mock_engine
    from tokenwire.tokenizer import Tokenizer

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.tokenizer:
        tok = Tokenizer.from_pretrained(args.tokenizer)
    else:
        tok = Tokenizer.default()
    run_mock_engine(
        tok,
        _synthetic(args),
        args.handshake_address,
        rank=args.data_parallel_rank,
        max_model_len=args.max_model_len,
    )
    return 0


def _run_server(
    config: Any,
    app: Any,
    shutdown_timeout: float,
    banner: str,
    started_at: float,
    holder: dict[str, Any] | None = None,
) -> None:
    """Run the server (graceful shutdown within ``shutdown_timeout``), printing ``banner`` only
    once the socket accepts connections (the server goes into ``holder["server"]``, for whoever
    must know that it is asked to stop)."""
    from tokenwire.server.serving import TokenwireServer

    class Server(TokenwireServer):
        async def startup(self, sockets: list | None = None) -> None:
            await super().startup(sockets)
            if self.started and banner:
                took = time.perf_counter() - started_at
                print(f"{banner} (ready in {took:.1f}s)", flush=True)

    server = Server(config, app, shutdown_timeout)
    if holder is not None:
        holder["server"] = server
    server.run()


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(raw)
    if args.command == "serve":
        if (args.api_server_count > 1 or args.force_supervisor) and not args.worker_fds:
            return _supervise(args, raw[raw.index("serve") + 1 :])
        return _serve(args)
    if args.command == "mock-engine":
        return _mock_engine(args)
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
