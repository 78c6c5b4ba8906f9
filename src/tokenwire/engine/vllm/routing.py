"""Routing over vLLM engines: ``engine.routing``'s policies fed with vLLM's block hashes and
KV-cache events.

Each request's prompt is hashed as the engines hash it (``block_hash``: their block size, from
their ready responses; their hash algorithm; its LoRA adapter and ``cache_salt``), and the
router picks among the engines in rotation. tokenwire subscribes to each engine's KV-cache
events as the configuration the engines were given says (``kv_events``: a publisher that binds a
wildcard address is dialed at ``events_host``, one that connects is bound for), or else at the
publisher an engine's ready response names (dialed; vLLM resolves ``tcp://*:0`` to the engine's
own address there). An engine is indexed from its events once they come (until then, and for
an engine that sends none, from what was sent to it); the first block it reports is checked
against tokenwire's own hash of its tokens, and an engine whose hashes differ (another hash
algorithm or seed) is indexed from what was sent to it, with a warning. An engine that dies or
restarts starts again from an empty cache.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import zmq.asyncio

from tokenwire.engine import EngineRequest
from tokenwire.engine.routing import PrefixIndex, Router, RoutingConfig
from tokenwire.engine.vllm import kv_events as ev
from tokenwire.engine.vllm.block_hash import BlockHasher, external

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["VllmRouting"]

log = logging.getLogger("tokenwire.engine.vllm.routing")


def _key(h: int | bytes) -> int:
    """An event's block hash as the index keys it (the 64-bit form, whichever form it came in)."""
    return h if isinstance(h, int) else external(h)


class VllmRouting:
    """The router of one ``VllmEngine``, its block hasher and its KV-cache event subscriber."""

    def __init__(
        self,
        config: RoutingConfig,
        kv_events: ev.KvEventsConfig | None = None,
        *,
        events_host: str = "127.0.0.1",
    ) -> None:
        self.config = config
        self.kv_events = kv_events
        self.events_host = events_host
        self.index = PrefixIndex()
        self.router = Router(config, self.index)
        self.hasher: BlockHasher | None = None
        self.subscriber: ev.KvEventSubscriber | None = None
        #: Ranks whose events were checked against tokenwire's hashes, and ranks whose events
        #: disagreed (ignored from then on).
        self._verified: set[int] = set()
        self._untrusted: set[int] = set()

    # ---- the engines -------------------------------------------------------------------------

    def start(self, ctx: zmq.asyncio.Context, cores: Sequence[Any]) -> None:
        """The engines are ready: their block size and capacity, and their events."""
        sizes = {c.ready.get("block_size") for c in cores}
        sizes.discard(None)
        if self.router.uses_prefixes and len(cores) > 1:
            size = min(s for s in sizes if isinstance(s, int)) if sizes else 16
            if len(sizes) > 1:
                log.warning("the engines' block sizes differ (%s): hashing by %d", sizes, size)
            try:
                self.hasher = BlockHasher(size, self.config.hash_algo)
            except ValueError as exc:
                log.warning("prefix routing falls back to fewest requests in flight: %s", exc)
                self.hasher = None
        for core in cores:
            self.index.set_capacity(core.rank, core.ready.get("num_gpu_blocks"))
        if self.hasher is None:
            return
        self.subscriber = ev.KvEventSubscriber(
            ctx, self._on_batch, self._on_gap, host=self.events_host
        )
        for core in cores:
            self._subscribe(core.rank, core.ready)

    def _subscribe(self, rank: int, ready: dict[str, Any]) -> None:
        cfg = self.kv_events
        if cfg is not None:
            self._add_source(rank, cfg, offset=True, dial=False)
            return
        published = ready.get("kv_events_config")
        if isinstance(published, dict) and published.get("enable_kv_cache_events"):
            try:  # (the rank's own endpoints, already offset)
                cfg = ev.KvEventsConfig.parse(dict(published))
            except ValueError as exc:
                log.warning("engine rank %d names a bad KV events publisher: %s", rank, exc)
                return
            self._add_source(rank, cfg, offset=False, dial=True)

    def _add_source(self, rank: int, cfg: ev.KvEventsConfig, *, offset: bool, dial: bool) -> None:
        assert self.subscriber is not None
        try:
            self.subscriber.add(rank, cfg, offset=offset, dial=dial)
        except (ValueError, zmq.ZMQError) as exc:
            log.warning("cannot subscribe to engine rank %d's KV-cache events: %s", rank, exc)

    def gone(self, rank: int) -> None:
        """An engine died: whatever it cached is gone with it."""
        self.index.cleared(rank)

    def back(self, rank: int, ready: dict[str, Any]) -> None:
        """An engine came back (restarted): an empty cache, a new event sequence."""
        self.index.cleared(rank)
        self.index.set_capacity(rank, ready.get("num_gpu_blocks"))

    async def close(self) -> None:
        if self.subscriber is not None:
            await self.subscriber.close()
            self.subscriber = None

    # ---- requests ----------------------------------------------------------------------------

    def keys(self, request: EngineRequest) -> list[int] | None:
        """The request's prompt blocks as the engines key them (None: not needed)."""
        hasher = self.hasher
        if hasher is None or len(request.prompt_ids) < hasher.block_size:
            return None
        lora = request.lora
        return hasher.external_hashes(
            request.prompt_ids,
            lora=(lora.name, lora.path) if lora is not None else None,
            cache_salt=request.cache_salt,
        )

    def pick(self, request: EngineRequest, loads: Sequence[tuple[int, int]]) -> int:
        """The rank to send ``request`` to, among ``(rank, requests in flight)``."""
        keys = self.keys(request) if len(loads) > 1 else None
        return self.router.pick(loads, keys)

    # ---- events ------------------------------------------------------------------------------

    def _on_batch(self, rank: int, batch: ev.KVEventBatch) -> None:
        if rank in self._untrusted:
            return
        index = self.index
        if not index.exact(rank):
            index.use_events(rank)
        for event in batch.events:
            if isinstance(event, ev.BlockStored):
                if rank not in self._verified and not self._check(rank, event):
                    return
                index.stored(rank, [_key(h) for h in event.block_hashes])
            elif isinstance(event, ev.BlockRemoved):
                index.removed(rank, [_key(h) for h in event.block_hashes])
            elif isinstance(event, ev.AllBlocksCleared):
                index.cleared(rank)

    def _check(self, rank: int, event: ev.BlockStored) -> bool:
        """Whether the engine hashes as tokenwire does, from a first block it stored (True when
        this event cannot tell: another block, a LoRA adapter whose path it does not give)."""
        hasher = self.hasher
        if (
            hasher is None
            or event.parent_block_hash is not None
            or event.lora_name is not None
            or event.block_size != hasher.block_size
            or len(event.token_ids) < hasher.block_size
            or not event.block_hashes
        ):
            return True
        salt = None
        if event.extra_keys and event.extra_keys[0]:
            salt = event.extra_keys[0][-1]
            if not isinstance(salt, str):
                return True
        extra = hasher.extra_keys(0, None, salt)
        ours = external(hasher.block(None, event.token_ids[: hasher.block_size], extra))
        if ours == _key(event.block_hashes[0]):
            self._verified.add(rank)
            return True
        log.warning(
            "engine rank %d hashes its prefix-cache blocks differently from tokenwire (its "
            "--prefix-caching-hash-algo, or PYTHONHASHSEED, is not tokenwire's %s): routing to "
            "it goes by what was sent there instead of its events",
            rank,
            hasher.algo,
        )
        self._untrusted.add(rank)
        self.index.drop_events(rank)
        return False

    def _on_gap(self, rank: int) -> None:
        """Events were lost: the index keeps what it has (stale entries only cost a worse pick)
        and is corrected by the next events."""
        log.info("engine rank %d's KV-cache events had a gap", rank)
