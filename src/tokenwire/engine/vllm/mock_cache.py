"""The mock engine's prefix cache: vLLM's block pool, modelled (no I/O).

A pool of ``num_blocks`` KV blocks of ``block_size`` tokens (one of them vLLM's null block, never
handed out). A request looks its prompt's full blocks up by hash (``BlockHasher``: vLLM's hashes),
stopping at the first miss and leaving the prompt's last token out (vLLM recomputes it for its
logits), takes the blocks it found and new ones for the rest; once its prompt is computed, its
full blocks are cached, and so are the blocks its output fills. New blocks come from the front
of the free queue; a cached block no request holds goes to its end (and is evicted when taken
from the front), a block that caches nothing to its front (reused first). A finished request's
blocks are freed last block first, so that its tail is evicted before its prefix. Each change is
a KV-cache event (``kv_events``), as vLLM's pool records them (they go out with the engine's next
step, as vLLM's do).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from tokenwire.engine.vllm import kv_events as ev
from tokenwire.engine.vllm.block_hash import BlockHasher, external

__all__ = ["BlockPool", "CachedRequest"]

#: The storage medium vLLM's GPU block pool names in its events (its CPU build too), and the
#: kind of KV cache of a model of full attention layers.
MEDIUM = "GPU"
SPEC_KIND = "full_attention"


class _Block:
    __slots__ = ("hash", "id", "ref")

    def __init__(self, block_id: int) -> None:
        self.id = block_id
        self.ref = 0
        self.hash: bytes | None = None


@dataclass
class CachedRequest:
    """What the pool keeps of one request."""

    rid: str
    #: Every token id so far (the prompt, then the output).
    tokens: list[int]
    #: The adapter's (name, id, path), or None.
    lora: tuple[str, int, str] | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    blocks: list[_Block] = field(default_factory=list)
    #: Hashes of its full blocks so far, in order.
    hashes: list[bytes] = field(default_factory=list)
    #: Full blocks already cached.
    cached_blocks: int = 0
    #: Prompt tokens found in the cache.
    cached_tokens: int = 0


class BlockPool:
    """The pool; see the module docstring. ``events`` (None: none kept) collects the KV-cache
    events each change makes, for the engine to publish and clear."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        hasher: BlockHasher | None,
        *,
        caching: bool = True,
        events: bool = False,
    ) -> None:
        if num_blocks < 2:
            raise ValueError("the pool needs at least 2 blocks (one is the null block)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hasher = hasher
        self.caching = caching and hasher is not None
        self.events: list[ev.Event] | None = [] if events else None
        #: The free queue: blocks that cache nothing, freed last first; then blocks never handed
        #: out (made when first taken); then cached blocks no request holds, least recently
        #: freed first.
        self._front: deque[_Block] = deque()
        self._fresh = num_blocks - 1
        self._next_id = 1
        self._free: OrderedDict[int, _Block] = OrderedDict()
        self._cached: dict[bytes, _Block] = {}
        #: Blocks held by requests.
        self.used = 0

    # ---- what the engine asks ----------------------------------------------------------------

    @property
    def usage(self) -> float:
        """vLLM's ``kv_cache_usage``: the share of blocks requests hold."""
        return self.used / (self.num_blocks - 1)

    @property
    def free_blocks(self) -> int:
        return len(self._front) + self._fresh + len(self._free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def prompt_hashes(self, req: CachedRequest) -> None:
        """Compute the hashes of the request's full prompt blocks (its ``hashes``)."""
        if self.hasher is None:
            return
        lora = None if req.lora is None else (req.lora[0], req.lora[2])
        req.hashes = self.hasher.hashes(req.tokens, lora=lora, cache_salt=req.cache_salt)

    def admit(self, req: CachedRequest, *, read_cache: bool = True) -> bool:
        """Give a request its prompt's blocks, the cached ones first (False, and nothing taken,
        when there are not enough free blocks)."""
        hits: list[_Block] = []
        if self.caching and read_cache:
            most = (len(req.tokens) - 1) // self.block_size
            for h in req.hashes[:most]:
                block = self._cached.get(h)
                if block is None:
                    break
                hits.append(block)
        needed = self.blocks_for(len(req.tokens)) - len(hits)
        reusable = sum(1 for b in hits if b.ref == 0)  # (free now; taking them frees nothing)
        if needed > self.free_blocks - reusable:
            return False
        for block in hits:
            self._hold(block)
        req.blocks = hits + [self._take() for _ in range(needed)]
        req.cached_blocks = len(hits)
        req.cached_tokens = len(hits) * self.block_size
        return True

    def computed(self, req: CachedRequest, tokens: int) -> None:
        """The request's first ``tokens`` tokens are computed: its full blocks among them are
        cached (and their events recorded)."""
        if not self.caching:
            return
        full = tokens // self.block_size
        if full <= req.cached_blocks:
            return
        assert self.hasher is not None
        while len(req.hashes) < full:  # blocks the output filled
            i = len(req.hashes)
            size = self.block_size
            lora = None if req.lora is None else (req.lora[0], req.lora[2])
            extra = self.hasher.extra_keys(i, lora, req.cache_salt)
            parent = req.hashes[-1] if req.hashes else None
            block_tokens = req.tokens[i * size : (i + 1) * size]
            req.hashes.append(self.hasher.block(parent, block_tokens, extra))
        start = req.cached_blocks
        new: list[int] = []
        for i in range(start, full):
            block = req.blocks[i]
            h = req.hashes[i]
            if block.hash is None and h not in self._cached:
                block.hash = h
                self._cached[h] = block
            new.append(external(h))
        req.cached_blocks = full
        if self.events is not None and new:
            size = self.block_size
            lora = None if req.lora is None else (req.lora[0], req.lora[2])
            assert self.hasher is not None
            extra_keys = [
                _untagged(self.hasher.extra_keys(i, lora, req.cache_salt))
                for i in range(start, full)
            ]
            self.events.append(
                ev.BlockStored(
                    block_hashes=new,  # type: ignore[arg-type]
                    parent_block_hash=external(req.hashes[start - 1]) if start else None,
                    token_ids=req.tokens[start * size : full * size],
                    block_size=size,
                    lora_id=req.lora[1] if req.lora is not None else None,
                    medium=MEDIUM,
                    lora_name=req.lora[0] if req.lora is not None else None,
                    extra_keys=extra_keys,
                    group_idx=0,
                    kv_cache_spec_kind=SPEC_KIND,
                    session_id=req.session_id,
                )
            )

    def grow(self, req: CachedRequest, tokens: int) -> None:
        """Blocks for ``tokens`` tokens in all (output growing); past the pool, the request holds
        what it has (the mock does not preempt)."""
        while len(req.blocks) < self.blocks_for(tokens) and self.free_blocks:
            req.blocks.append(self._take())

    def free(self, req: CachedRequest) -> None:
        """A finished request's blocks go back, its last block first: the cached ones to the
        end of the free queue, the others to its front (vLLM's ``free_blocks``)."""
        first: list[_Block] = []
        for block in reversed(req.blocks):
            block.ref -= 1
            if block.ref == 0:
                self.used -= 1
                if block.hash is None or not self.caching:
                    first.append(block)
                else:
                    self._free[block.id] = block
        self._front.extendleft(reversed(first))
        req.blocks = []

    def reset(self) -> bool:
        """vLLM's ``reset_prefix_cache``: forget every cached block (False when requests still
        hold blocks: vLLM refuses then)."""
        if self.used:
            return False
        for block in self._cached.values():
            block.hash = None
        self._cached.clear()
        if self.events is not None:
            self.events.append(ev.AllBlocksCleared())
        return True

    def take_events(self) -> list[ev.Event]:
        if not self.events:
            return []
        out, self.events = self.events, []
        return out

    # ---- internals ---------------------------------------------------------------------------

    def _hold(self, block: _Block) -> None:
        if block.ref == 0:
            self._free.pop(block.id, None)
            self.used += 1
        block.ref += 1

    def _take(self) -> _Block:
        """A block from the front of the free queue (a cached one taken so is evicted)."""
        if self._front:
            block = self._front.popleft()
        elif self._fresh:
            self._fresh -= 1
            block = _Block(self._next_id)
            self._next_id += 1
        else:
            _, block = self._free.popitem(last=False)
            if block.hash is not None:
                del self._cached[block.hash]
                if self.events is not None:
                    self.events.append(
                        ev.BlockRemoved(
                            block_hashes=[external(block.hash)],  # type: ignore[list-item]
                            medium=MEDIUM,
                            group_idx=0,
                        )
                    )
                block.hash = None
        block.ref = 1
        self.used += 1
        return block


def _untagged(keys: tuple[Any, ...] | None) -> list[Any] | None:
    """A block's extra keys as vLLM's events give them: each key's value, not its tag."""
    if keys is None:
        return None
    return [key[1] for key in keys]
