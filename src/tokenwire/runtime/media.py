"""Media preprocessing off the event loop: ``MediaPool`` runs the fetching, decoding and the
model's processor in worker processes (``--mm-processor-workers``), each with a cache of
processed items keyed on the content hash (``--mm-processor-cache-gb`` shared among them; a
request's item goes to the worker its source names, so the same image meets its cache), and
``prepare`` turns a plan's media into each prompt's expanded ids and ``mm_features``."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import multiprocessing
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from tokenwire.messages.errors import TokenwireError, ValidationError
from tokenwire.multimodal import MediaItem, MMFeature, ModelMedia, Processed, mm_hash
from tokenwire.multimodal.media import MAX_IMAGE_PIXELS, load_image, require_pillow
from tokenwire.multimodal.processing import expand_placeholders, process_image
from tokenwire.runtime.media_fetch import FetchRules, fetch_media
from tokenwire.runtime.plan import Plan

__all__ = ["MediaOptions", "MediaPool", "default_workers", "extra_installed"]


def extra_installed() -> bool:
    """Whether ``tokenwire[multimodal]`` is installed (Pillow, transformers, blake3)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("PIL", "transformers", "blake3"))


def default_workers() -> int:
    """A worker per spare core (the cores beyond the server's own), at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 2) - 1)


@dataclass(frozen=True)
class MediaOptions:
    """The server's media flags (vLLM's names)."""

    rules: FetchRules = field(default_factory=FetchRules.from_env)
    #: ``--media-io-kwargs``: per modality, how media is loaded (``image_mode``...).
    media_io_kwargs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: ``--mm-processor-kwargs``: passed to the model's processor (not hashed, as in vLLM).
    mm_processor_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: ``--mm-processor-cache-gb`` (vLLM's default 4; 0: no cache).
    cache_gb: float = 4.0
    workers: int = field(default_factory=default_workers)
    hash_algorithm: str = "blake3"
    max_pixels: int = int(os.environ.get("VLLM_MAX_IMAGE_PIXELS", MAX_IMAGE_PIXELS))


# ---- in the worker processes ---------------------------------------------------------------------

_STATE: dict[str, Any] = {}


#: How much lower the media workers' CPU priority is than the server's: on a machine with fewer
#: spare cores than workers, the event loop (streams, ``/health``) is served first.
WORKER_NICENESS = 10


def _watch_parent(parent: int) -> None:
    """End this worker when the server that started it (process ``parent``) is gone, however it
    ended, and at once when it was gone before this worker had started."""
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(1.0)


def _init_worker(media: ModelMedia, options: MediaOptions, cache_bytes: int, parent: int) -> None:
    """A worker's start (``parent``: the server's process id, taken when it made the pool: a
    server that ends while its workers start leaves them with another parent already)."""
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICENESS)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    _STATE.update(media=media, options=options, cache=collections.OrderedDict(), size=0)
    _STATE["cap"] = cache_bytes
    if media.family != "synthetic":
        from tokenwire.multimodal.processing import _image_processor  # (warm: load it now)

        with contextlib.suppress(Exception):  # (reported by the first request)
            _image_processor(media, {})


def _ready() -> bool:
    return True


def _cache_put(key: str, value: Processed) -> None:
    cache, cap = _STATE["cache"], _STATE["cap"]
    size = value.nbytes
    if size > cap:
        return
    cache[key] = value
    _STATE["size"] += size
    while _STATE["size"] > cap and cache:
        _, old = cache.popitem(last=False)
        _STATE["size"] -= old.nbytes


def _process(
    item: MediaItem, request_kwargs: Mapping[str, Any], io_request: Mapping[str, Any]
) -> tuple[str, Processed, bool] | TokenwireError:
    """Fetch, decode, hash and process one item: ``(mm_hash, processed, was_cached)``, or
    the error (a value: it travels back to the server as it is)."""
    media: ModelMedia = _STATE["media"]
    options: MediaOptions = _STATE["options"]
    param = "messages" if item.field.startswith("messages") else item.field.split("[")[0]
    try:
        if item.modality != "image":
            raise ValidationError(
                f"{item.field}: this model does not accept {item.modality} input", param=param
            )
        require_pillow(param)
        data = fetch_media(item.url, item.modality, options.rules, item.field, param)
        io_kwargs = {**options.media_io_kwargs.get("image", {}), **io_request.get("image", {})}
        image, hashed = load_image(
            data, item.field, param, max_pixels=options.max_pixels, io_kwargs=io_kwargs
        )
        factors: dict[str, Any] = {}
        if io_request.get("image"):
            factors["media_io_kwargs"] = {"image": dict(io_request["image"])}
        scoped = {
            k: v
            for k, v in request_kwargs.items()
            if k not in ("images_kwargs", "videos_kwargs", "audio_kwargs") or k == "images_kwargs"
        }
        if scoped:
            factors["mm_processor_kwargs"] = scoped
        alg, model_id = options.hash_algorithm, media.model_id
        if item.uuid is None:
            key = mm_hash(alg, model_id=model_id, image=hashed, **factors)
        elif factors:  # (vLLM: a client's uuid is hashed with the factors, in the item's place)
            key = mm_hash(alg, model_id=model_id, image=item.uuid, **factors)
        else:
            key = item.uuid
        cache = _STATE["cache"]
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
            return key, hit, True
        kwargs = {**options.mm_processor_kwargs, **request_kwargs}
        processed = process_image(media, image, kwargs)
        _cache_put(key, processed)
        return key, processed, False
    except TokenwireError as exc:
        return exc
    except MemoryError:
        return ValidationError(f"{item.field}: the media is too large to process", param=param)


# ---- in the server -------------------------------------------------------------------------------


class MediaPool:
    """The worker processes and the server's side of them."""

    def __init__(self, media: ModelMedia, options: MediaOptions) -> None:
        self.media = media
        self.options = options
        n = max(1, options.workers)
        per_worker = int(options.cache_gb * (1 << 30) / n)
        ctx = multiprocessing.get_context("spawn")
        args = (media, options, per_worker, os.getpid())
        self._start = lambda: ProcessPoolExecutor(
            1, mp_context=ctx, initializer=_init_worker, initargs=args
        )
        self._pools = [self._start() for _ in range(n)]
        self._pending = [0] * n
        self.hits = 0
        self.misses = 0
        for pool in self._pools:  # (the workers start now, not on the first image)
            pool.submit(_ready)

    def _pick(self, item: MediaItem) -> int:
        if len(self._pools) == 1:
            return 0
        url = item.url
        key = item.uuid or (url if len(url) < 4096 else f"{len(url)}{url[:2048]}{url[-2048:]}")
        k = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
        k %= len(self._pools)
        least = min(range(len(self._pools)), key=self._pending.__getitem__)
        return least if self._pending[k] > self._pending[least] + 4 else k

    async def process(
        self, item: MediaItem, kwargs: Mapping[str, Any], io_kwargs: Mapping[str, Any]
    ) -> tuple[str, Processed]:
        k = self._pick(item)
        self._pending[k] += 1
        try:
            loop = asyncio.get_running_loop()
            pool = self._pools[k]
            out = await loop.run_in_executor(pool, _process, item, kwargs, io_kwargs)
        except BrokenProcessPool:
            # The worker died on it (killed, out of memory): a new one takes its place.
            if self._pools[k] is pool:
                pool.shutdown(wait=False, cancel_futures=True)
                self._pools[k] = self._start()
                self._pools[k].submit(_ready)
            raise ValidationError(
                f"{item.field}: the worker processing this media item ended (the item may be "
                "too large to process)",
                param="messages" if item.field.startswith("messages") else None,
            ) from None
        finally:
            self._pending[k] -= 1
        if isinstance(out, TokenwireError):
            raise out
        key, processed, cached = out
        if cached:
            self.hits += 1
        else:
            self.misses += 1
        return key, processed

    async def prepare(self, plan: Plan) -> None:
        """Process every item of ``plan`` (in parallel), then expand each prompt's ids and set
        its features."""
        assert plan.media is not None
        kwargs = plan.media_options.get("mm_processor_kwargs") or {}
        io_kwargs = plan.media_options.get("media_io_kwargs") or {}
        jobs = [[self.process(item, kwargs, io_kwargs) for item in items] for items in plan.media]
        results = await asyncio.gather(*(asyncio.gather(*js) for js in jobs))
        features = []
        for p, (items, done) in enumerate(zip(plan.media, results)):
            if not items:
                features.append([])
                continue
            counts = [(item.modality, pr.num_tokens) for item, (_, pr) in zip(items, done)]
            field_name = "messages" if plan.route == "chat" else "prompt"
            ids, places = expand_placeholders(
                plan.prompts[p], counts, self.media.pad_ids, field_name
            )
            plan.prompts[p] = ids
            feats = [
                MMFeature(item.modality, key, off, length, pr.fields)
                for item, (key, pr), (off, length) in zip(items, done, places)
            ]
            feats.sort(key=lambda f: f.offset)
            features.append(feats)
        plan.mm_features = features

    def close(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)
