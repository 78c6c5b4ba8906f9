"""Flags of the server itself: the model it serves (tokenizer, names, context length), where it
listens, and who may call it (API key, CORS)."""

from __future__ import annotations

import argparse
import os

from tokenwire.entrypoints.options import string_list
from tokenwire.server.security import SecurityConfig
from tokenwire.tokenizer import DEFAULT_TOKENIZER_NAME, Tokenizer

__all__ = ["add_arguments", "load_tokenizer", "security_config", "served_names"]


def add_arguments(serve: argparse.ArgumentParser) -> None:
    """The model served, the address, and the security flags."""
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
        nargs="+",
        default=None,
        metavar="NAME",
        help="the model name clients use (several: each is accepted, responses default to the "
        "first, as vLLM's); default: the model's or tokenizer's name",
    )
    serve.add_argument(
        "--enable-tokenizer-info-endpoint",
        action="store_true",
        help="serve GET /tokenizer_info (the tokenizer's configuration and chat template), as "
        "vLLM's flag does",
    )
    serve.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context length (prompt plus output tokens); default: from the model config",
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--port", type=int, default=8000, help="port to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--api-key",
        default=os.environ.get("TOKENWIRE_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every route but /health and /metrics "
        "(default: $TOKENWIRE_API_KEY, else none)",
    )
    serve.add_argument(
        "--allowed-origins",
        type=string_list,
        default=[],
        help="CORS: origins web pages may call from, as a JSON list or comma-separated "
        "('[\"*\"]' for any); default: CORS off",
    )
    serve.add_argument(
        "--allowed-methods",
        type=string_list,
        default=["*"],
        help="CORS: allowed methods (default: all)",
    )
    serve.add_argument(
        "--allowed-headers",
        type=string_list,
        default=["*"],
        help="CORS: allowed request headers (default: all)",
    )
    serve.add_argument(
        "--allow-credentials",
        action="store_true",
        help="CORS: allow credentials (cookies, Authorization) from the allowed origins",
    )


def served_names(args: argparse.Namespace) -> list[str]:
    """``--served-model-name``'s names (none given: [])."""
    names = args.served_model_name or []
    return [names] if isinstance(names, str) else list(names)


def load_tokenizer(args: argparse.Namespace) -> tuple[Tokenizer, str]:
    """The tokenizer served (``--model``'s with ``--engine vllm`` unless ``--tokenizer`` says
    otherwise) and the (first) model name clients use."""
    if args.engine == "vllm" and not args.tokenizer and args.model:
        args.tokenizer = args.model
    names = served_names(args)
    if args.tokenizer:
        tok = Tokenizer.from_pretrained(args.tokenizer, model_vocab_size=args.model_vocab_size)
        name = names[0] if names else str(args.model or args.tokenizer)
    else:
        tok = Tokenizer.default(model_vocab_size=args.model_vocab_size)
        name = names[0] if names else DEFAULT_TOKENIZER_NAME
    if args.max_model_len is not None:
        tok.max_model_len = args.max_model_len
    return tok, name


def security_config(args: argparse.Namespace) -> SecurityConfig:
    """The API key and CORS settings."""
    return SecurityConfig(
        api_key=args.api_key or None,
        allowed_origins=tuple(args.allowed_origins),
        allowed_methods=tuple(args.allowed_methods),
        allowed_headers=tuple(args.allowed_headers),
        allow_credentials=args.allow_credentials,
    )
