"""Flags of the server itself: the model it serves (tokenizer, names, context length), where and
how it listens (address or Unix socket, TLS, the path prefix of a proxy in front), who may call
it (API key, CORS), and the Responses API's store, background responses and MCP tools."""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from typing import Any

from tokenwire.entrypoints.options import string_list
from tokenwire.server.config import DEFAULT_RESPONSES_STORE_SIZE, ResponsesConfig
from tokenwire.server.security import SecurityConfig
from tokenwire.tokenizer import DEFAULT_TOKENIZER_NAME, Tokenizer

__all__ = [
    "add_arguments",
    "listen_settings",
    "listen_url",
    "load_tokenizer",
    "responses_config",
    "security_config",
    "served_names",
]


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
        "--health-port",
        type=int,
        default=None,
        help="also serve /health and /metrics on this port (same host), on a listener of its "
        "own that --max-connections and the request timeouts do not reach (for orchestrators' "
        "probes); default: none",
    )
    serve.add_argument(
        "--uds",
        default=None,
        metavar="PATH",
        help="listen on this Unix domain socket instead of --host and --port",
    )
    serve.add_argument(
        "--root-path",
        default=None,
        metavar="PREFIX",
        help="the path prefix a proxy in front strips (ASGI root_path: requests are served "
        "relative to it)",
    )
    serve.add_argument("--ssl-keyfile", default=None, help="TLS: the private key file (PEM)")
    serve.add_argument(
        "--ssl-certfile", default=None, help="TLS: the certificate (chain) file (PEM)"
    )
    serve.add_argument(
        "--ssl-ca-certs",
        default=None,
        help="TLS: CA certificates that client certificates are checked against",
    )
    serve.add_argument(
        "--ssl-cert-reqs",
        type=int,
        default=int(ssl.CERT_NONE),
        choices=[int(ssl.CERT_NONE), int(ssl.CERT_OPTIONAL), int(ssl.CERT_REQUIRED)],
        help="TLS: client certificates: 0 not asked for, 1 checked when given, 2 required "
        "(the ssl module's CERT_*; default: %(default)s)",
    )
    serve.add_argument(
        "--api-key",
        nargs="+",
        default=[os.environ["TOKENWIRE_API_KEY"]] if os.environ.get("TOKENWIRE_API_KEY") else [],
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') with one of these keys "
        "on every route but /health and /metrics (default: $TOKENWIRE_API_KEY, else none)",
    )
    serve.add_argument(
        "--allowed-origins",
        type=string_list,
        default=[],
        help="CORS: origins web pages may call from, as a JSON list or comma-separated "
        "('[\"*\"]' for any); default: CORS off",
    )
    serve.add_argument(
        "--allowed-hosts",
        type=string_list,
        default=[],
        help="the names and addresses a request's Host header may give, as a JSON list or "
        "comma-separated ('*' for any, '.example.com' for a domain and its subdomains); others "
        "are refused (400), as DNS-rebinding defences expect; default: the loopback names and "
        "addresses and the address a request reached the server on",
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
        help="most responses and conversations the Responses API keeps (GET /v1/responses/{id}, "
        "previous_response_id, /v1/conversations); past it the oldest of the API key keeping "
        "the most go first; 0 keeps none (default: %(default)s)",
    )
    add_responses_arguments(serve)


def add_responses_arguments(serve: argparse.ArgumentParser) -> None:
    """The Responses API's store, background responses and MCP tools."""
    defaults = ResponsesConfig()
    serve.add_argument(
        "--responses-store",
        default=None,
        metavar="URL",
        help="where responses and conversations are kept: sqlite:///PATH (every "
        "--api-server-count worker shares the file), postgresql://... or redis://... (several "
        "machines; pip install 'tokenwire[stores]'), sqlite:// in memory (this process only); "
        "default: a SQLite file under the user's data directory",
    )
    serve.add_argument(
        "--responses-store-bytes",
        type=_count,
        default=defaults.max_bytes,
        metavar="BYTES",
        help="most bytes the store keeps, all API keys together (everything kept counts: the "
        "stored JSON); past it the oldest of the key keeping the most go first "
        "(default: %(default)s, 256 MiB)",
    )
    serve.add_argument(
        "--responses-store-key-bytes",
        type=_count,
        default=None,
        metavar="BYTES",
        help="most bytes one API key keeps (past it, its own oldest go first); a single "
        "response or item over an eighth of it is refused (400): default: "
        "--responses-store-bytes",
    )
    serve.add_argument(
        "--responses-ttl",
        type=float,
        default=defaults.ttl,
        metavar="SECONDS",
        help="seconds a response or conversation is kept after its last write; 0: until "
        "evicted (default: %(default)s, 30 days)",
    )
    serve.add_argument(
        "--max-background-responses",
        type=_count,
        default=defaults.max_background,
        metavar="N",
        help="background responses one API key (without --api-key: all clients) runs at a "
        "time in each worker; more get 429. They also count against --max-concurrent-requests "
        "as any request does (default: %(default)s)",
    )
    serve.add_argument(
        "--tool-server",
        action="append",
        default=[],
        metavar="[LABEL=]ADDRESS",
        help="an MCP server Responses requests may use by its label ({'type': 'mcp', "
        "'server_label': LABEL}): host:port (reached at http://host:port/sse, as vLLM's flag "
        "does) or a URL (streamable HTTP; SSE when it ends in /sse); comma-separated or "
        "repeated; without LABEL=, the label is the name the server gives (needs pip install "
        "'tokenwire[mcp]')",
    )
    serve.add_argument(
        "--mcp-allowed-urls",
        type=string_list,
        default=[],
        metavar="PREFIXES",
        help="URL prefixes a request's MCP server_url may start with, comma-separated or a "
        "JSON list ('*': any URL); default: none, only --tool-server labels",
    )
    serve.add_argument(
        "--mcp-timeout",
        type=float,
        default=defaults.mcp_timeout,
        metavar="SECONDS",
        help="seconds one MCP operation (listing a server's tools, one call) may take before "
        "it is an error item (default: %(default)s)",
    )
    serve.add_argument(
        "--mcp-max-output-bytes",
        type=_count,
        default=defaults.mcp_max_output_bytes,
        metavar="BYTES",
        help="bytes an MCP server's answer to one operation may take before it is an error "
        "item (default: %(default)s, 1 MiB)",
    )
    serve.add_argument(
        "--mcp-max-rounds",
        type=int,
        default=defaults.mcp_max_rounds,
        metavar="N",
        help="model rounds one response with MCP tools may take (each after its calls); the "
        "last offers no tools, so the model answers (default: %(default)s)",
    )


def responses_config(args: argparse.Namespace) -> ResponsesConfig:
    """The Responses API's settings (a store URL that cannot work stops the server)."""
    from tokenwire.server.responses.store import default_url, needs

    url = args.responses_store or default_url()
    missing = needs(url)
    if missing is not None:
        raise SystemExit(f"tokenwire: --responses-store: {missing}")
    memory = url.rstrip("/") in ("sqlite:", "sqlite:/")
    if memory and getattr(args, "worker_fds", None) and getattr(args, "worker_index", 0) == 0:
        print(
            "tokenwire: --responses-store sqlite:// keeps responses in each worker's memory: "
            "the workers do not see each other's (give a file, sqlite:///PATH)",
            file=sys.stderr,
        )
    if args.tool_server:
        from tokenwire.server.mcp import missing_sdk

        reason = missing_sdk()
        if reason is not None:
            raise SystemExit(f"tokenwire: --tool-server: {reason}")
    if args.mcp_max_rounds < 1 or args.mcp_timeout <= 0:
        raise SystemExit("tokenwire: --mcp-max-rounds must be at least 1, --mcp-timeout over 0")
    return ResponsesConfig(
        store=url,
        max_bytes=args.responses_store_bytes,
        max_key_bytes=args.responses_store_key_bytes or args.responses_store_bytes,
        ttl=args.responses_ttl or None,
        max_background=args.max_background_responses,
        tool_servers=tuple(args.tool_server),
        mcp_allowed_urls=tuple(args.mcp_allowed_urls),
        mcp_timeout=args.mcp_timeout,
        mcp_max_output_bytes=args.mcp_max_output_bytes,
        mcp_max_rounds=args.mcp_max_rounds,
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


def listen_settings(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's settings for TLS and the path prefix (checked now: a missing or unreadable
    file, or a key that does not match its certificate, stops the server with its reason)."""
    out: dict[str, Any] = {}
    if args.root_path:
        out["root_path"] = "/" + args.root_path.strip("/")
    keyfile, certfile = args.ssl_keyfile, args.ssl_certfile
    if not keyfile and not certfile:
        if args.ssl_ca_certs or args.ssl_cert_reqs:
            raise SystemExit(
                "tokenwire: --ssl-ca-certs and --ssl-cert-reqs need TLS: give "
                "--ssl-keyfile and --ssl-certfile"
            )
        return out
    if not certfile:
        raise SystemExit("tokenwire: --ssl-keyfile needs --ssl-certfile")
    if args.ssl_cert_reqs and not args.ssl_ca_certs:
        raise SystemExit(
            "tokenwire: --ssl-cert-reqs 1 or 2 needs --ssl-ca-certs (the CA that signs the "
            "clients' certificates)"
        )
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certfile, keyfile)
        if args.ssl_ca_certs:
            context.load_verify_locations(args.ssl_ca_certs)
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(f"tokenwire: TLS: {exc}") from None
    out.update(
        ssl_keyfile=keyfile,
        ssl_certfile=certfile,
        ssl_ca_certs=args.ssl_ca_certs,
        ssl_cert_reqs=args.ssl_cert_reqs,
    )
    return out


def listen_url(args: argparse.Namespace) -> str:
    """Where the server listens, as a client would reach it."""
    scheme = "https" if args.ssl_certfile else "http"
    if args.uds:
        return f"{scheme}+unix:{args.uds}"
    return f"{scheme}://{args.host}:{args.port}"


def security_config(args: argparse.Namespace) -> SecurityConfig:
    """The API key and CORS settings."""
    return SecurityConfig(
        api_keys=tuple(k for k in args.api_key if k),
        allowed_origins=tuple(args.allowed_origins),
        allowed_methods=tuple(args.allowed_methods),
        allowed_headers=tuple(args.allowed_headers),
        allow_credentials=args.allow_credentials,
        allowed_hosts=tuple(args.allowed_hosts),
    )
