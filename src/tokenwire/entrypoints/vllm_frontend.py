"""``tokenwire-vllm-frontend``: tokenwire as the HTTP frontend that stock ``vllm serve`` starts.

With ``VLLM_USE_RUST_FRONTEND=1 VLLM_RUST_FRONTEND_PATH=$(which tokenwire-vllm-frontend)``,
``vllm serve MODEL`` binds the HTTP socket and its two engine listeners, starts the engines, does
the handshake itself, then runs this program as::

    PATH frontend --listen-fd N --input-listener-fd N --output-listener-fd N
        --engine-start-index I --engine-count C --data-parallel-size D
        [--grpc-listen-fd N] [--coordinator-address A] --args-json '{...}'

tokenwire adopts the listeners, waits for each engine's ready response, and serves on the HTTP
socket (TCP, or the Unix socket of ``--uds``) with the model name, context length and tokenizer
that the args say, and vLLM's operations flags from them: TLS (``--ssl-keyfile``,
``--ssl-certfile``, ``--ssl-ca-certs``, ``--ssl-cert-reqs``), ``--root-path``, request logs
(``--enable-log-requests``, ``--enable-log-outputs``, ``--max-log-len``),
``--enable-request-id-headers``, traces (``--otlp-traces-endpoint``,
``--collect-detailed-traces``) and ``--disable-uvicorn-access-log``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "build_parser", "settings_from_args"]

log = logging.getLogger("tokenwire.vllm_frontend")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenwire-vllm-frontend",
        description="tokenwire as the frontend program vLLM starts (VLLM_RUST_FRONTEND_PATH).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fe = sub.add_parser("frontend", help="serve HTTP over the engines vLLM started")
    fe.add_argument("--listen-fd", type=int, required=True)
    fe.add_argument("--input-listener-fd", type=int, required=True)
    fe.add_argument("--output-listener-fd", type=int, required=True)
    fe.add_argument("--engine-start-index", type=int, default=0)
    fe.add_argument("--engine-count", type=int, default=1)
    fe.add_argument("--data-parallel-size", type=int, default=1)
    fe.add_argument("--grpc-listen-fd", type=int, default=None)
    fe.add_argument("--coordinator-address", default=None)
    fe.add_argument("--args-json", default="{}")
    return parser


#: vLLM's operations flags tokenwire takes from ``--args-json`` (its argparse names and their
#: defaults when vLLM leaves them out: it sends only what differs from its own defaults).
_OPERATIONS: dict[str, Any] = {
    "ssl_keyfile": None,
    "ssl_certfile": None,
    "ssl_ca_certs": None,
    "ssl_cert_reqs": 0,
    "root_path": None,
    "uds": None,
    "enable_log_requests": False,
    "enable_log_outputs": False,
    "max_log_len": None,
    "enable_request_id_headers": False,
    "otlp_traces_endpoint": None,
    "collect_detailed_traces": None,
    "disable_uvicorn_access_log": False,
}


def operations_from_args(raw: dict[str, Any]) -> argparse.Namespace:
    """vLLM's TLS, root path, log, request id and trace flags from its arguments, under
    ``tokenwire serve``'s names."""
    ops = {key: raw.get(key, default) for key, default in _OPERATIONS.items()}
    if ops["ssl_cert_reqs"] is None:
        ops["ssl_cert_reqs"] = 0
    detailed = ops["collect_detailed_traces"]
    if isinstance(detailed, str):
        ops["collect_detailed_traces"] = [m for m in detailed.split(",") if m]
    ops["disable_access_log"] = bool(ops.pop("disable_uvicorn_access_log"))
    return argparse.Namespace(**ops)


def _lora_modules(value: Any) -> dict[str, str]:
    """vLLM's ``lora_modules`` as its args give them (``{"name", "path", ...}`` objects, or
    ``name=path`` strings)."""
    out: dict[str, str] = {}
    for item in value or []:
        if isinstance(item, dict) and item.get("name") and item.get("path"):
            out[str(item["name"])] = str(item["path"])
        elif isinstance(item, str) and "=" in item:
            name, _, path = item.partition("=")
            out[name] = path
    return out


def settings_from_args(args_json: str) -> dict[str, Any]:
    """What tokenwire takes from vLLM's arguments: model, tokenizer, served names, context
    length, the keep-alive timeout, the operations flags (``operations``, a namespace), the
    generation config and its overrides, the default chat template arguments, LoRA adapters,
    prompt-token details and the tokenizer-info route."""
    raw = json.loads(args_json or "{}")
    if not isinstance(raw, dict):
        raise SystemExit("tokenwire-vllm-frontend: --args-json must be a JSON object")
    model = raw.get("model_tag") or raw.get("model")
    if not model:
        raise SystemExit("tokenwire-vllm-frontend: --args-json names no model")
    served = raw.get("served_model_name")
    names = [str(n) for n in served] if isinstance(served, list) else [served] if served else []
    return {
        "model": str(model),
        "tokenizer": str(raw.get("tokenizer") or model),
        "served_model_name": str(names[0] if names else model),
        "served_model_names": names[1:],
        "generation_config": str(raw.get("generation_config") or "auto"),
        "override_generation_config": raw.get("override_generation_config") or {},
        "default_chat_template_kwargs": raw.get("default_chat_template_kwargs") or {},
        "enable_lora": bool(raw.get("enable_lora")),
        "lora_modules": _lora_modules(raw.get("lora_modules")),
        "enable_prompt_tokens_details": bool(raw.get("enable_prompt_tokens_details")),
        "enable_tokenizer_info_endpoint": bool(raw.get("enable_tokenizer_info_endpoint")),
        "max_model_len": raw.get("max_model_len"),
        "keep_alive": raw.get("http_timeout_keep_alive") or 5,
        "max_header_count": raw.get("h11_max_header_count") or 256,
        "max_header_bytes": raw.get("h11_max_incomplete_event_size") or (4 << 20),
        "ready_timeout": float(raw.get("engine_ready_timeout_secs") or 600),
        "log_level": "info",
        "operations": operations_from_args(raw),
        "pooler_config": _pooler_config(raw.get("pooler_config")),
    }


def _pooler_config(value: Any) -> dict[str, Any]:
    """vLLM's ``--pooler-config`` (a JSON object, or the string of one)."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    return dict(value) if isinstance(value, dict) else {}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args.args_json)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    import uvicorn

    from tokenwire.engine.vllm import VllmEngine, VllmEngineConfig
    from tokenwire.entrypoints.options import operations, server
    from tokenwire.entrypoints.options.adapters import dev_mode, runtime_lora_updating
    from tokenwire.generation_config import load_generation_defaults
    from tokenwire.pooling import PoolingModel
    from tokenwire.runtime import Features
    from tokenwire.server import ServerConfig, create_app
    from tokenwire.server.serving import ConnectionLimits, uvicorn_config
    from tokenwire.tokenizer import Tokenizer

    ops = settings["operations"]
    listen = server.listen_settings(ops)
    observe = operations.observe_config(ops, service_name="vllm-tokenwire")
    tok = Tokenizer.from_pretrained(settings["tokenizer"])
    if isinstance(settings["max_model_len"], int):
        tok.max_model_len = settings["max_model_len"]
    engine = VllmEngine(
        tok,
        VllmEngineConfig(
            data_parallel_size=args.engine_count,
            engine_start_index=args.engine_start_index,
            input_fd=args.input_listener_fd,
            output_fd=args.output_listener_fd,
            ready_timeout=settings["ready_timeout"],
        ),
    )
    defaults = load_generation_defaults(
        settings["generation_config"],
        settings["model"],
        settings["override_generation_config"],
        model_generation_config=tok.generation_config,
    )
    log.info("generation defaults: %s", defaults.describe())
    features = Features(
        generation_defaults=defaults,
        default_chat_template_kwargs=settings["default_chat_template_kwargs"],
        prompt_tokens_details=settings["enable_prompt_tokens_details"],
    )
    lora = settings["enable_lora"]
    app = create_app(
        tok,
        engine,
        ServerConfig(
            model_name=settings["served_model_name"],
            access_log=not ops.disable_access_log,
            observe=observe,
            served_model_names=tuple(settings["served_model_names"]),
            features=features,
            lora_modules=settings["lora_modules"] if lora else {},
            runtime_lora_updating=lora and runtime_lora_updating(),
            dev_mode=dev_mode(),
            model_root=settings["model"],
            tokenizer_info=settings["enable_tokenizer_info_endpoint"],
            pooling_model=(
                PoolingModel.from_dir(settings["model"])
                if os.path.isdir(settings["model"])
                else None
            ),
            pooler_config=settings["pooler_config"],
        ),
    )
    listener = socket.socket(fileno=args.listen_fd)
    log.info(
        "serving %r for vLLM's engines %d..%d on %s",
        settings["served_model_name"],
        args.engine_start_index,
        args.engine_start_index + args.engine_count - 1,
        listener.getsockname(),
    )
    # tokenwire's connection protocol, as `tokenwire serve` runs it (connection cap, header
    # timeout, JSON 400s for bad HTTP, no WebSocket), with vLLM's keep-alive as the idle timeout.
    limits = ConnectionLimits(
        idle_timeout=float(settings["keep_alive"]),
        max_header_count=int(settings["max_header_count"]),
        max_header_bytes=int(settings["max_header_bytes"]),
    )
    http_server = uvicorn.Server(
        uvicorn_config(
            app,
            limits,
            **listen,
            log_level=settings["log_level"],
            timeout_graceful_shutdown=5,
            access_log=False,
        )
    )
    http_server.run(sockets=[listener])
    return 0


if __name__ == "__main__":
    sys.exit(main())
