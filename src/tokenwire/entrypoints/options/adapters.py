"""LoRA flags, as vLLM names them: ``--enable-lora``, ``--lora-modules`` (``name=path`` or vLLM's
JSON form), ``--max-lora-rank`` and ``--max-loras`` (passed to a spawned vLLM engine); and
vLLM's switches read from the environment: ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` (the load and
unload routes) and ``VLLM_SERVER_DEV_MODE`` (the engine-control routes)."""

from __future__ import annotations

import argparse
import json
import os

__all__ = [
    "add_arguments",
    "dev_mode",
    "lora_module",
    "lora_modules",
    "runtime_lora_updating",
    "vllm_lora_args",
]


def lora_module(text: str) -> tuple[str, str]:
    """One ``--lora-modules`` value: ``name=path`` or ``{"name": ..., "path": ...}``."""
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"--lora-modules: bad JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise argparse.ArgumentTypeError("--lora-modules JSON must be an object")
        name, path = obj.get("name"), obj.get("path")
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            raise argparse.ArgumentTypeError('--lora-modules JSON needs "name" and "path"')
        return name, path
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--lora-modules takes name=path, got {text!r}")
    return name, path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The LoRA flags."""
    group = parser.add_argument_group("LoRA adapters (vLLM engines)")
    group.add_argument(
        "--enable-lora",
        action="store_true",
        help="serve LoRA adapters: each is a model clients name in model (or SGLang's "
        "lora_path); the vLLM engine is started with --enable-lora",
    )
    group.add_argument(
        "--lora-modules",
        type=lora_module,
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME=PATH",
        help="adapters served from the start: name=path, or vLLM's JSON form "
        '\'{"name": "sql", "path": "/adapters/sql"}\' (repeatable)',
    )
    group.add_argument(
        "--max-lora-rank",
        type=int,
        default=None,
        help="the largest adapter rank the engine makes room for (vLLM's flag, passed on)",
    )
    group.add_argument(
        "--max-loras",
        type=int,
        default=None,
        help="adapters the engine holds at once (vLLM's flag, passed on)",
    )


def lora_modules(args: argparse.Namespace) -> dict[str, str]:
    """``--lora-modules`` as name -> path (``SystemExit`` without ``--enable-lora``)."""
    modules = dict(args.lora_modules)
    if modules and not args.enable_lora:
        raise SystemExit("tokenwire: --lora-modules needs --enable-lora")
    return modules


def vllm_lora_args(args: argparse.Namespace) -> list[str]:
    """The LoRA flags a spawned vLLM engine gets."""
    if not args.enable_lora:
        return []
    out = ["--enable-lora"]
    if args.max_lora_rank is not None:
        out += ["--max-lora-rank", str(args.max_lora_rank)]
    if args.max_loras is not None:
        out += ["--max-loras", str(args.max_loras)]
    return out


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def runtime_lora_updating() -> bool:
    """vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``."""
    return _env_flag("VLLM_ALLOW_RUNTIME_LORA_UPDATING")


def dev_mode() -> bool:
    """vLLM's ``VLLM_SERVER_DEV_MODE``."""
    return _env_flag("VLLM_SERVER_DEV_MODE")
