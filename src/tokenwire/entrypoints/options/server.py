"""Flags of the server itself: the model it serves (tokenizer, names, context length), where it
listens, who may call it (API key, CORS), and the responses it keeps (Responses API)."""

from __future__ import annotations

import argparse
import os

from tokenwire.entrypoints.options import string_list
from tokenwire.server.config import DEFAULT_RESPONSES_STORE_SIZE
from tokenwire.server.security import SecurityConfig
from tokenwire.tokenizer import DEFAULT_TOKENIZER_NAME, Tokenizer

__all__ = ["add_arguments", "load_tokenizer", "security_config"]


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
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--port", type=int, default=8000, help="port to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--api-key",
        default=os.environ.get("TOKENWIRE_API_KEY"),
        help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every route but "
        "/health and /metrics (default: $TOKENWIRE_API_KEY, else none)",
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
    serve.add_argument(
        "--responses-store-size",
        type=_count,
        default=DEFAULT_RESPONSES_STORE_SIZE,
        metavar="N",
        help="most responses the Responses API keeps in memory for GET /v1/responses/{id} and "
        "previous_response_id, the oldest evicted first; 0 keeps none (default: %(default)s)",
    )


def _count(value: str) -> int:
    """A whole number, 0 or more."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {n}")
    return n


def load_tokenizer(args: argparse.Namespace) -> tuple[Tokenizer, str]:
    """The tokenizer served (``--model``'s with ``--engine vllm`` unless ``--tokenizer`` says
    otherwise) and the model name clients use."""
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
