"""``tokenwire serve``: the tokenizer, an engine and the HTTP server, put together from the flags
and run until SIGTERM or SIGINT (or, with ``--api-server-count N``, the supervisor over N
such processes)."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import time
from typing import Any

from tokenwire.engine import Engine
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
from tokenwire.server import ServerConfig, create_app
from tokenwire.server.serving import TokenwireServer, uvicorn_config

__all__ = ["SERVER_GC_THRESHOLD", "main", "run_server"]

#: The server process's garbage-collector thresholds (``gc.set_threshold``): a young collection
#: after 50,000 net container allocations, where Python's default is 700. A request's objects
#: are freed by reference counting when it ends; with the default, collections every few
#: requests walked the state of every request in flight (8,000 token ids for each long prompt),
#: and their pauses held up first tokens. Cyclic garbage is still collected, in larger batches.
SERVER_GC_THRESHOLD = (50_000, 10, 10)


def main(args: argparse.Namespace, serve_args: list[str]) -> int:
    """Serve as ``args`` say (``serve_args``: the flags as given, for the supervisor's workers)."""
    if (args.api_server_count > 1 or args.force_supervisor) and not args.worker_fds:
        return _supervise(args, serve_args)
    return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    started_at = time.perf_counter()
    limits.check(args)
    fleet.check(args)
    listen = server.listen_settings(args)
    try:
        features = output.features(args)
    except ValueError as exc:
        raise SystemExit(f"tokenwire: {exc}") from None
    operations.apply(args)
    observe = operations.observe_config(args)
    if args.enable_lora and args.engine != "vllm":
        raise SystemExit("tokenwire: --enable-lora needs --engine vllm (adapters run in vLLM)")
    tok, name = server.load_tokenizer(args)
    try:
        defaults = output.generation_defaults(args, tok)
        features = output.with_response_template(features, tok)
    except ValueError as exc:
        raise SystemExit(f"tokenwire: {exc}") from None
    model_media, media_limits = media.media_features(args, tok)
    features = dataclasses.replace(
        features, generation_defaults=defaults, media=model_media, media_limits=media_limits
    )
    holder: dict[str, Any] = {}

    def should_stop() -> bool:
        # SIGTERM/SIGINT while the engines start (minutes) stop the startup at once.
        return bool(getattr(holder.get("server"), "should_exit", False))

    eng: Engine
    if args.engine == "vllm":
        eng = engine.vllm_engine(args, tok, should_stop)
    else:
        from tokenwire.engine.synthetic import SyntheticEngine

        eng = SyntheticEngine(tok, engine.synthetic_config(args))
    pooling_model, pooler_config = engine.pooling_settings(args)
    app = create_app(
        tok,
        eng,
        ServerConfig(
            pooling_model=pooling_model,
            pooler_config=pooler_config,
            model_name=name,
            max_concurrent_requests=args.max_concurrent_requests,
            stall_timeout=args.stall_timeout or None,
            max_request_bytes=args.max_request_bytes or None,
            body_timeout=args.body_timeout or None,
            limits=limits.request_limits(args),
            features=features,
            access_log=not args.disable_access_log,
            observe=observe,
            responses_store_size=args.responses_store_size,
            responses=server.responses_config(args),
            security=server.security_config(args),
            metrics_dir=args.worker_metrics_dir,
            worker_index=args.worker_index,
            health_port=args.health_port,
            health_host=args.host,
            served_model_names=tuple(server.served_names(args)[1:]),
            lora_modules=adapters.lora_modules(args),
            runtime_lora_updating=args.enable_lora and adapters.runtime_lora_updating(),
            dev_mode=adapters.dev_mode(),
            model_root=args.model or args.tokenizer,
            tokenizer_info=args.enable_tokenizer_info_endpoint,
            media_options=media.media_options(args),
            **fleet.server_settings(args),
        ),
    )
    banner = (
        f"tokenwire: serving {name!r} (vocab {tok.vocab_size}, model vocab {tok.model_vocab_size};"
        f" generation defaults: {defaults.describe()}) on {server.listen_url(args)}"
    )
    where: dict[str, Any] = {"host": args.host, "port": args.port}
    if args.uds:
        where = {"uds": args.uds}
    if args.worker_fds:  # a worker of --api-server-count: the supervisor's socket
        where = {"fd": int(args.worker_fds.split(",")[0])}
    config = uvicorn_config(
        app,
        limits.connection_limits(args),
        **where,
        **listen,
        log_level=args.log_level,
        access_log=False,  # tokenwire's own, with durations
    )
    run_server(
        config,
        app,
        args.shutdown_timeout,
        banner if args.worker_index == 0 else "",
        started_at,
        holder,
    )
    return 0


def _supervise(args: argparse.Namespace, serve_args: list[str]) -> int:
    """``--api-server-count N``: the supervisor over N workers and the shared engines."""
    from tokenwire.entrypoints.supervisor import SupervisorConfig, run_supervisor

    if getattr(args, "engine_transport", "auto") == "tcp":
        raise SystemExit(
            "tokenwire: with --api-server-count the API servers reach the engines over Unix "
            "sockets: --engine-transport tcp cannot apply (leave it auto, or say ipc)"
        )
    operations.configure_logging(args)
    if args.data_parallel_size < 1:
        raise SystemExit("tokenwire: --data-parallel-size must be at least 1")
    # The workers serve TLS, the path prefix, logs and traces: refuse flags that cannot work
    # before anything starts.
    server.listen_settings(args)
    operations.check_observe(args)
    fleet.check(args)
    mock_args: list[str] = []
    launcher = None
    handshake = None
    if args.engine == "synthetic":
        mock_args = engine.mock_engine_args(args)
    else:
        handshake, launcher = engine.vllm_engines(args)
    return run_supervisor(
        SupervisorConfig(
            serve_args=serve_args,
            host=args.host,
            port=args.port,
            uds=args.uds,
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


def run_server(
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

    class Server(TokenwireServer):
        async def startup(self, sockets: list | None = None) -> None:
            await super().startup(sockets)
            if self.started and banner:
                took = time.perf_counter() - started_at
                print(f"{banner} (ready in {took:.1f}s)", flush=True)

    gc.set_threshold(*SERVER_GC_THRESHOLD)
    server = Server(config, app, shutdown_timeout)
    if holder is not None:
        holder["server"] = server
    server.run()
