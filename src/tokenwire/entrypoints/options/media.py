"""The ``tokenwire serve`` media flags (vLLM's names): what a prompt may carry
(``--limit-mm-per-prompt``), where media may come from (``--allowed-media-domains``,
``--allowed-local-media-path``), how it is loaded and processed (``--media-io-kwargs``,
``--mm-processor-kwargs``), and the workers that do it (``--mm-processor-workers``,
``--mm-processor-cache-gb``). The fetch timeouts are vLLM's environment variables."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from tokenwire.multimodal import MediaLimits, parse_limit_mm_per_prompt
from tokenwire.multimodal.hashing import HASH_ALGORITHMS
from tokenwire.multimodal.processing import ModelMedia, model_media, synthetic_media
from tokenwire.runtime.media import MediaOptions, default_workers
from tokenwire.runtime.media_fetch import FetchRules
from tokenwire.tokenizer import Tokenizer

__all__ = ["add_arguments", "media_features", "media_options", "vllm_media_args"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("multimodal inputs (pip install 'tokenwire[multimodal]')")
    group.add_argument(
        "--limit-mm-per-prompt",
        default=None,
        help='most media items per prompt, per modality, as JSON (vLLM\'s: {"image": 4, '
        '"video": 0}); unnamed modalities: 999',
    )
    group.add_argument(
        "--allowed-media-domains",
        nargs="+",
        default=None,
        help="the only hosts media URLs may name; a host named here may also be a private or "
        "loopback address (otherwise refused)",
    )
    group.add_argument(
        "--allowed-local-media-path",
        default=None,
        help="file:// media URLs may name files under this directory (default: none may)",
    )
    group.add_argument(
        "--media-io-kwargs",
        default=None,
        help='how media is loaded, per modality, as JSON (e.g. {"image": {"image_mode": "RGB"}})',
    )
    group.add_argument(
        "--mm-processor-kwargs",
        default=None,
        help="passed to the model's Hugging Face processor, as JSON",
    )
    group.add_argument(
        "--mm-processor-cache-gb",
        type=float,
        default=4.0,
        help="processed media kept for reuse, keyed on the content hash, in GiB (0: none)",
    )
    group.add_argument(
        "--mm-processor-workers",
        type=int,
        default=None,
        help="processes that fetch and preprocess media off the event loop (default: one per "
        "spare core)",
    )
    group.add_argument(
        "--mm-hasher-algorithm",
        choices=HASH_ALGORITHMS,
        default="blake3",
        help="the content hash of media items (vLLM's; blake3 by default)",
    )


def _json(value: str | None, flag: str) -> dict[str, Any]:
    if not value:
        return {}
    try:
        out = json.loads(value)
    except ValueError as exc:
        raise SystemExit(f"tokenwire: {flag}: not JSON ({exc})") from None
    if not isinstance(out, dict):
        raise SystemExit(f"tokenwire: {flag} must be a JSON object")
    return out


def _model_folder(model: str | None) -> str | None:
    """``--model``'s folder: itself, or the Hugging Face Hub snapshot of its configuration files
    (the processor's too) when it names a repository; None when neither is there."""
    if not model:
        return None
    if os.path.isdir(model):
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, allow_patterns=["*.json"])
    except Exception:  # (offline, or no such repository: the model is served as text-only)
        return None


def media_features(
    args: argparse.Namespace, tok: Tokenizer
) -> tuple[ModelMedia | None, MediaLimits]:
    """The served model's media side (from ``--model``'s folder with ``--engine vllm``; the
    synthetic engine counts Qwen-VL's vision tokens when the tokenizer has them) and the limits."""
    try:
        per_prompt = parse_limit_mm_per_prompt(args.limit_mm_per_prompt)
    except ValueError as exc:
        raise SystemExit(f"tokenwire: {exc}") from None
    media: ModelMedia | None
    if args.engine == "vllm":
        folder = _model_folder(args.model)
        media = model_media(folder, args.model or "", tok.token_to_id)
    else:
        media = synthetic_media(tok.token_to_id, args.model or args.tokenizer or "tokenwire")
    modalities = media.modalities if media is not None else frozenset()
    return media, MediaLimits(modalities, per_prompt)


def media_options(args: argparse.Namespace) -> MediaOptions:
    if args.mm_processor_workers is not None and args.mm_processor_workers < 1:
        raise SystemExit("tokenwire: --mm-processor-workers must be at least 1")
    if args.mm_processor_cache_gb < 0:
        raise SystemExit("tokenwire: --mm-processor-cache-gb must be >= 0")
    if args.allowed_local_media_path and not os.path.isdir(args.allowed_local_media_path):
        raise SystemExit(
            f"tokenwire: --allowed-local-media-path {args.allowed_local_media_path!r} is not a "
            "directory"
        )
    return MediaOptions(
        rules=FetchRules.from_env(
            allowed_media_domains=tuple(args.allowed_media_domains or ()),
            allowed_local_media_path=args.allowed_local_media_path,
        ),
        media_io_kwargs=_json(args.media_io_kwargs, "--media-io-kwargs"),
        mm_processor_kwargs=_json(args.mm_processor_kwargs, "--mm-processor-kwargs"),
        cache_gb=args.mm_processor_cache_gb,
        workers=args.mm_processor_workers or default_workers(),
        hash_algorithm=args.mm_hasher_algorithm,
    )


def vllm_media_args(args: argparse.Namespace, given: list[str]) -> list[str]:
    """The media flags the vLLM engine needs too (its limits and its side of the cache)."""
    out: list[str] = []
    if args.limit_mm_per_prompt and "--limit-mm-per-prompt" not in given:
        out += ["--limit-mm-per-prompt", args.limit_mm_per_prompt]
    if args.mm_processor_kwargs and "--mm-processor-kwargs" not in given:
        out += ["--mm-processor-kwargs", args.mm_processor_kwargs]
    if "--mm-processor-cache-gb" not in given:
        out += ["--mm-processor-cache-gb", str(args.mm_processor_cache_gb)]
    return out
