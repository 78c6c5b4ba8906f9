"""Flags for serving many engines and many users: routing (and the KV-cache events it reads),
admission (the waiting queue, priority, retries), API keys and their quotas, and SSE keep-alive;
and the flags with which ``tokenwire mock-engine`` models vLLM's prefix cache."""

from __future__ import annotations

import argparse
import os
from typing import Any

from tokenwire.engine.routing import ROUTING_POLICIES, RoutingConfig
from tokenwire.engine.vllm.block_hash import HASH_ALGOS
from tokenwire.engine.vllm.kv_events import KvEventsConfig

__all__ = [
    "DEFAULT_BALANCE_THRESHOLD",
    "add_arguments",
    "add_mock_engine_arguments",
    "kv_events_config",
    "mock_cache_config",
    "routing_config",
]

#: Requests in flight by which the engine holding the longest cached prefix may exceed the least
#: loaded engine before a request goes to the least loaded one instead.
DEFAULT_BALANCE_THRESHOLD = 32


def _kv_events(value: str) -> KvEventsConfig:
    try:
        return KvEventsConfig.parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(value: str) -> float:
    try:
        n = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not n >= 0 or n == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {value}")
    return n


def _count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {n}")
    return n


def _add_engine_shared(group: Any) -> None:
    """Flags ``tokenwire serve`` and ``tokenwire mock-engine`` share (vLLM's)."""
    group.add_argument(
        "--kv-events-config",
        type=_kv_events,
        default=None,
        metavar="JSON",
        help="the engines' KV-cache events publisher, as vLLM's JSON "
        '(\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": '
        '"tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv"}\'; rank r '
        "publishes on the ports plus r): given to the engines tokenwire spawns, and tokenwire "
        "subscribes (an engine binding a wildcard address is dialed on this host; one that "
        "connects to an address, tokenwire binds it); default: prefix routing over engines "
        "tokenwire spawns configures them, else it subscribes where their ready responses say",
    )
    group.add_argument(
        "--prefix-caching-hash-algo",
        choices=HASH_ALGOS,
        default="sha256",
        help="how the engines hash prefix-cache blocks (vLLM's flag; default: %(default)s)",
    )
    group.add_argument(
        "--scheduling-policy",
        choices=["fcfs", "priority"],
        default="fcfs",
        help="how the engines schedule waiting requests: in arrival order, or lowest priority "
        "first (vLLM's flag; default: %(default)s)",
    )


def add_arguments(serve: argparse.ArgumentParser) -> None:
    """``tokenwire serve``'s routing, admission, key, quota and keep-alive flags."""
    routing = serve.add_argument_group("routing over several engines")
    routing.add_argument(
        "--routing",
        choices=ROUTING_POLICIES,
        default="prefix",
        help="which engine takes a request: the one holding the longest cached prefix of its "
        "prompt (prefix: from the engines' KV-cache events, else from what was sent where), "
        "the one with the fewest requests in flight, or each in turn (default: %(default)s; "
        "with one engine there is nothing to choose)",
    )
    routing.add_argument(
        "--routing-balance-threshold",
        type=_count,
        default=DEFAULT_BALANCE_THRESHOLD,
        metavar="N",
        help="prefix routing: requests in flight by which the engine with the longest cached "
        "prefix may exceed the least loaded engine; past it the least loaded one takes the "
        "request (smg's cache-aware policy; default: %(default)s)",
    )
    _add_engine_shared(routing)
    admission = serve.add_argument_group("admission")
    admission.add_argument(
        "--max-waiting-requests",
        type=_count,
        default=1024,
        metavar="N",
        help="requests that may wait for a place when --max-concurrent-requests are in flight, "
        "served lowest priority first, then in arrival order; past it 429 (a more urgent "
        "request takes the place of the least urgent one waiting); 0: 429 at once "
        "(default: %(default)s)",
    )
    admission.add_argument(
        "--queue-timeout",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="seconds a request may wait for a place before it gets 503 with Retry-After; 0: "
        "as long as it takes (default: %(default)s)",
    )
    admission.add_argument(
        "--retry-on-engine-failure",
        action="store_true",
        help="a request whose engine dies before its first token is sent once to another",
    )
    keys = serve.add_argument_group("API keys and quotas")
    keys.add_argument(
        "--api-keys-file",
        default=None,
        metavar="PATH",
        help="API keys with names, admin rights, priorities and quotas (JSON, or one key per "
        "line with an optional name); re-read on SIGHUP",
    )
    keys.add_argument(
        "--admin-api-key",
        nargs="+",
        default=(
            [os.environ["TOKENWIRE_ADMIN_API_KEY"]]
            if os.environ.get("TOKENWIRE_ADMIN_API_KEY")
            else []
        ),
        metavar="KEY",
        help="keys for the engine-control, LoRA, flush and abort routes (others get 403 there; "
        "default: $TOKENWIRE_ADMIN_API_KEY, else any key)",
    )
    streams = serve.add_argument_group("streams")
    streams.add_argument(
        "--sse-keep-alive-interval",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="a stream silent this long (waiting for a place, in a long prefill, between "
        "tokens) gets an SSE comment, Anthropic streams a ping event (vLLM's flag; 0: off; "
        "default: %(default)s)",
    )


def add_mock_engine_arguments(mock: argparse.ArgumentParser) -> None:
    """``tokenwire mock-engine``'s model of vLLM's KV cache, prefill, LoRA and scheduling."""
    group = mock.add_argument_group("vLLM's KV cache, prefill, LoRA and scheduling")
    group.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="tokens per KV cache block (vLLM's flag; default: %(default)s)",
    )
    group.add_argument(
        "--num-gpu-blocks-override",
        type=int,
        default=None,
        help="KV cache blocks (vLLM's flag; default: room for a full batch at the context length)",
    )
    group.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="cache prompt blocks for later requests (vLLM's flag; default: on)",
    )
    group.add_argument(
        "--prefill-time-per-token-ms",
        type=float,
        default=0.0,
        help="milliseconds of prefill per uncached prompt token, one prompt after the other "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--enable-lora", action="store_true", help="serve LoRA adapters (vLLM's flag)"
    )
    group.add_argument(
        "--max-loras",
        type=int,
        default=1,
        help="adapters held at once (vLLM's flag; default: %(default)s)",
    )
    _add_engine_shared(group)


def mock_cache_config(args: argparse.Namespace) -> Any:
    """The mock engine's ``MockCacheConfig`` (``ValueError`` for settings that cannot work)."""
    from tokenwire.engine.vllm.mock import MockCacheConfig

    if args.block_size < 1:
        raise ValueError("--block-size must be at least 1")
    if args.num_gpu_blocks_override is not None and args.num_gpu_blocks_override < 2:
        raise ValueError("--num-gpu-blocks-override must be at least 2")
    if args.prefill_time_per_token_ms < 0:
        raise ValueError("--prefill-time-per-token-ms must be 0 or more")
    return MockCacheConfig(
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks_override,
        prefix_caching=args.enable_prefix_caching,
        hash_algo=args.prefix_caching_hash_algo,
        kv_events=args.kv_events_config,
        prefill_time=args.prefill_time_per_token_ms / 1000.0,
        enable_lora=args.enable_lora,
        max_loras=args.max_loras,
        scheduling_policy=args.scheduling_policy,
    )


def kv_events_config(args: argparse.Namespace) -> KvEventsConfig | None:
    """``--kv-events-config``, when it publishes."""
    cfg = args.kv_events_config
    return cfg if cfg is not None and cfg.enabled else None


def routing_config(args: argparse.Namespace) -> RoutingConfig:
    """How requests are routed over the engines."""
    return RoutingConfig(
        policy=args.routing,
        balance_threshold=args.routing_balance_threshold,
        hash_algo=args.prefix_caching_hash_algo,
    )


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to ``bind(0)`` (Linux's ``ip_local_port_range``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """A TCP port such that it and the ``count - 1`` after it are free now, picked below the
    kernel's ephemeral range where it can: the engines bind (or connect to) these ports after
    tokenwire has closed its probes, and a port from ``bind(0)`` can be handed to another
    process in between; one below that range is never handed out that way."""
    import random
    import socket

    def free_from(base: int) -> bool:
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, port))
        except OSError:
            return False
        finally:
            for sock in socks:
                sock.close()
        return True

    low = _ephemeral_low()
    if low - count > 11000:
        for _ in range(100):
            base = random.randrange(10000, low - count)
            if free_from(base):
                return base
    for _ in range(100):
        with socket.socket() as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if base + count <= 65536 and free_from(base):
            return base
    raise SystemExit(f"tokenwire: no run of {count} free ports for the KV-cache events")


def _auto_kv_events(args: argparse.Namespace) -> KvEventsConfig | None:
    """The KV-cache events configuration tokenwire gives the several engines it spawns for
    prefix routing: each engine's publisher connects to a port tokenwire binds on the loopback
    interface (nothing listens on other interfaces), its replay endpoint on the loopback too.
    None when the user configured events, routing does not use them, there is one engine, or
    several API-server processes would each need the events (give ``--kv-events-config``)."""
    if args.kv_events_config is not None or args.routing != "prefix":
        return None
    if args.data_parallel_size < 2 or getattr(args, "api_server_count", 1) > 1:
        return None
    n = args.data_parallel_size
    return KvEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=f"tcp://127.0.0.1:{_free_port_run(n)}",
        replay_endpoint=f"tcp://127.0.0.1:{_free_port_run(n)}",
        topic="kv-events",
    )


def engine_args(
    args: argparse.Namespace, given: list[str] | tuple[str, ...] = (), *, mock: bool = False
) -> list[str]:
    """What the engines tokenwire spawns are started with for its routing and scheduling
    (``given``: the arguments they already have, which win; ``mock``: ``tokenwire
    mock-engine`` processes)."""

    def has(flag: str) -> bool:
        return any(a == flag or a.startswith(flag + "=") for a in given)

    out: list[str] = []
    if args.scheduling_policy != "fcfs" and not has("--scheduling-policy"):
        out += ["--scheduling-policy", args.scheduling_policy]
    if args.prefix_caching_hash_algo != "sha256" and not has("--prefix-caching-hash-algo"):
        out += ["--prefix-caching-hash-algo", args.prefix_caching_hash_algo]
    if not has("--kv-events-config"):
        cfg = args.kv_events_config
        if cfg is None and not mock:
            cfg = args.kv_events_auto = _auto_kv_events(args)
        if cfg is not None:
            out += ["--kv-events-config", cfg.to_json()]
    return out


def engine_config(args: argparse.Namespace) -> dict[str, Any]:
    """``VllmEngineConfig``'s routing, KV-cache events and retry settings."""
    return {
        "routing": routing_config(args),
        "kv_events": kv_events_config(args) or getattr(args, "kv_events_auto", None),
        "retry_on_failure": args.retry_on_engine_failure,
    }


def check(args: argparse.Namespace) -> None:
    """Refuse settings that cannot work before anything starts (``SystemExit``: a keys file
    that cannot be read or parsed, names the reason)."""
    if args.api_keys_file:
        from tokenwire.server.keys import KeyRing

        try:
            KeyRing(args.api_key, args.admin_api_key, args.api_keys_file)
        except ValueError as exc:
            raise SystemExit(f"tokenwire: {exc}") from None


def server_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``ServerConfig``'s admission, key and keep-alive settings."""
    return {
        "max_waiting_requests": args.max_waiting_requests,
        "queue_timeout": args.queue_timeout or None,
        "api_keys_file": args.api_keys_file,
        "admin_api_keys": tuple(args.admin_api_key),
        "sse_keep_alive_interval": args.sse_keep_alive_interval,
    }
