"""``tokenwire mock-engine``: the synthetic engine behind the engine side of vLLM's protocol.

It does what a headless vLLM 0.32 engine does on the wire, message for message and field for
field: dials the frontend's handshake address, says HELLO, takes the init metadata, connects a
DEALER to every input address and a PUSH to every output address, sends its ready response (every
field of ``EngineCoreReadyResponse``) on each, says READY; then serves ADD, ABORT and UTILITY and
sends ``EngineCoreOutputs`` with vLLM's whole layout: one message per step per frontend with
outputs in it, the step's full ``SchedulerStats`` on one of them only (the first, or alone to
frontend 0 when the step has no outputs), a request's queued/scheduled events and prefill stats
on its first output, its logprobs as ``LogprobsLists`` and prompt logprobs as ``LogprobsTensors``
(inline below 256 bytes, else in frames of their own), and after a step that finished the last
requests (or an abort that did), the stats-only message of the step vLLM's scheduler runs to
report them. Utility calls get a GPU engine's answers (no LoRA, no sleep mode). Any vLLM frontend
can drive it: tokenwire's own, stock ``vllm serve`` waiting for a remote engine, or SGLang's Rust
gateway (whose decoder refuses messages missing any of these fields), so all are measured over
the same engine with no GPU.

It models vLLM's prefix cache (``mock_cache.BlockPool``: blocks of ``--block-size`` tokens keyed by
vLLM's own hashes, LRU eviction, ``num_cached_tokens`` in a request's prefill stats and the
step's prefix-cache stats) and, with ``--kv-events-config``, publishes its KV-cache events as
vLLM's engine does (``kv_events``), replay endpoint included. A prompt's uncached tokens cost
``prefill_time`` seconds each before its first token, one prompt after the other (prefill is
compute-bound), so a cache hit shortens its time to first token and everyone's queue.
``--enable-lora`` answers the LoRA utility calls and counts adapters in the scheduler stats;
``--scheduling-policy priority`` serves requests lowest ``priority`` first.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import signal
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from tokenwire.engine import EngineRequest
from tokenwire.engine.pooling import Pooled, PoolingRequest
from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.engine.synthetic_pooling import SYNTHETIC_POOLING_TASKS
from tokenwire.engine.vllm import protocol as wire
from tokenwire.engine.vllm.block_hash import BlockHasher
from tokenwire.engine.vllm.kv_events import (
    END_SEQ,
    KVEventBatch,
    KvEventsConfig,
    encode_batch,
    offset_endpoint,
    publisher_binds,
)
from tokenwire.engine.vllm.mock_cache import BlockPool, CachedRequest
from tokenwire.engine.vllm.pooling import decode_pooling_params
from tokenwire.messages.errors import CodecError
from tokenwire.messages.frames import (
    EGRESS_TAG_BATCH,
    EGRESS_TAG_ERROR,
    decode_batch_frame,
    decode_error_frame,
)
from tokenwire.messages.sampling import SamplingParams
from tokenwire.tokenizer import Tokenizer

__all__ = ["MockCacheConfig", "MockEngine"]

log = logging.getLogger("tokenwire.mock_engine")

#: Utility methods vLLM's frontends and SGLang's gateway call, and what a vLLM 0.32 engine with
#: no LoRA and no sleep mode answers: a result, or (``_Failed``) a failure message.
_UTILITY_RESULTS: dict[str, Any] = {
    "get_supported_tasks": ["generate"],
    "is_sleeping": False,
    "is_scheduler_paused": False,
    "reset_prefix_cache": True,
    "reset_mm_cache": None,
    "reset_encoder_cache": None,
    "get_weight_version": wire.WEIGHT_VERSION,
    "execute_dummy_batch": None,
}


class _Failed(str):
    """A utility call's failure message."""


_UTILITY_RESULTS["list_loras"] = _Failed(
    "Call to list_loras method failed: Worker failed with error 'LoRA is not enabled. Use "
    "--enable-lora to enable LoRA.', please check the stack trace above for the root cause"
)

#: The KV cache block size the mock reports and accounts its usage in (a GPU engine's default).
BLOCK_SIZE = 16

#: The tasks the mock runs, by ``--runner`` (vLLM's flag): a generation model's, a pooling
#: model's (embeddings: the synthetic engine's vectors), or both (the synthetic engine's own).
RUNNER_TASKS = {
    "generate": ("generate",),
    "pooling": SYNTHETIC_POOLING_TASKS,
    "both": ("generate", *SYNTHETIC_POOLING_TASKS),
}


@dataclass
class MockCacheConfig:
    """How the mock engine models vLLM's KV cache, prefill and adapters (vLLM's flag names)."""

    #: ``--block-size``: tokens per KV cache block.
    block_size: int = BLOCK_SIZE
    #: ``--num-gpu-blocks-override``: KV cache blocks (None: room for a full batch at the
    #: longest context).
    num_gpu_blocks: int | None = None
    #: ``--enable-prefix-caching`` (vLLM's default).
    prefix_caching: bool = True
    #: ``--prefix-caching-hash-algo``.
    hash_algo: str = "sha256"
    #: ``--kv-events-config``: publish KV-cache events (None: not).
    kv_events: KvEventsConfig | None = None
    #: Seconds of prefill per uncached prompt token (0: none).
    prefill_time: float = 0.0
    #: ``--enable-lora`` and ``--max-loras``.
    enable_lora: bool = False
    max_loras: int = 1
    #: ``--scheduling-policy``: ``fcfs`` or ``priority``.
    scheduling_policy: str = "fcfs"


class _Req:
    """What the mock keeps of one request in flight."""

    __slots__ = (
        "add",
        "cache",
        "client",
        "eos",
        "first",
        "logprobs",
        "params",
        "priority",
        "prompt_len",
        "prompt_logprobs",
        "queued",
        "running",
        "timer",
    )

    def __init__(self, add: wire.AddRequest, params: SamplingParams | None = None) -> None:
        sp = add.sampling
        self.add = add
        self.params = params
        self.client = add.client_index
        self.priority = add.priority
        self.eos: int | None = sp.get("_eos_token_id")
        self.prompt_len = len(add.prompt_ids)
        self.logprobs: int | None = sp.get("logprobs")
        self.prompt_logprobs: int | None = sp.get("prompt_logprobs")
        self.queued = time.monotonic()
        self.first = True
        #: Scheduled (its blocks taken, prefilling or decoding), not waiting.
        self.running = False
        self.timer: asyncio.TimerHandle | None = None
        lora = add.lora
        self.cache = CachedRequest(
            add.rid,
            list(add.prompt_ids),
            (str(lora[0]), int(lora[1]), str(lora[2])) if lora else None,
            add.cache_salt,
            add.session_id,
        )

    @property
    def lora_name(self) -> str | None:
        return self.cache.lora[0] if self.cache.lora is not None else None


class MockEngine:
    """One mock engine (one data-parallel rank)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: SyntheticConfig,
        handshake_address: str,
        *,
        rank: int = 0,
        max_model_len: int | None = None,
        runner: str = "generate",
        cache: MockCacheConfig | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.synthetic = SyntheticEngine(tokenizer, config)
        #: What ``get_supported_tasks`` answers (``RUNNER_TASKS``).
        self.supported_tasks = RUNNER_TASKS[runner]
        self.handshake_address = handshake_address
        self.rank = rank
        self.identity = wire.engine_identity(rank)
        self.max_model_len = max_model_len or tokenizer.max_model_len or 4096
        self.max_batch_size = config.max_batch_size
        self.cache_config = cc = cache or MockCacheConfig()
        if cc.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling policy must be fcfs or priority, got {cc.scheduling_policy!r}"
            )
        self.block_size = cc.block_size
        #: KV cache blocks: room for a full batch at the longest context, unless overridden.
        self.num_blocks = cc.num_gpu_blocks or max(
            2, -(-self.max_model_len // cc.block_size) * self.max_batch_size
        )
        self.kv_events = cc.kv_events if cc.kv_events is not None and cc.kv_events.enabled else None
        hasher = BlockHasher(cc.block_size, cc.hash_algo) if cc.prefix_caching else None
        self.pool = BlockPool(
            self.num_blocks,
            cc.block_size,
            hasher,
            caching=cc.prefix_caching,
            events=self.kv_events is not None,
        )
        self._ctx: zmq.asyncio.Context | None = None
        self._inputs: list[zmq.asyncio.Socket] = []
        self._outputs: list[zmq.Socket] = []
        self._reqs: dict[str, _Req] = {}
        #: Requests waiting for blocks (in arrival, or with the priority policy priority, order).
        self._pending: list[_Req] = []
        #: When the prompt being prefilled last is done (monotonic seconds).
        self._prefill_free_at = 0.0
        self._prefix_reset = False
        #: Prefix-cache stats of the requests first scheduled since the last stats message.
        self._prefix = [0, 0, 0]
        self._loras: dict[int, str] = {}
        self._pub: zmq.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._seq = 0
        self._published: collections.deque[tuple[int, bytes]] = collections.deque(
            maxlen=dict(self.kv_events.extra).get("buffer_steps", 10_000) if self.kv_events else 1
        )
        #: Requests added and aborted; prefix-cache lookups: requests, prompt tokens, tokens
        #: found cached (totals, as vLLM's counters sum its steps' stats).
        self.stats = {"added": 0, "aborted": 0, "requests": 0, "queries": 0, "hits": 0}

    async def run(self, *, ready: asyncio.Event | None = None) -> None:
        """Handshake, then serve until cancelled."""
        self._ctx = zmq.asyncio.Context()
        try:
            self._start_publisher()
            await self._handshake()
            await self.synthetic.start(self._on_frame)
            if ready is not None:
                ready.set()
            serving = [self._serve_input(s, i) for i, s in enumerate(self._inputs)]
            if self._replay is not None:
                serving.append(self._serve_replay())
            await asyncio.gather(*serving)
        finally:
            await self.synthetic.close()
            for req in self._reqs.values():
                if req.timer is not None:
                    req.timer.cancel()
            # The output sockets come from a shadow of the context: ``destroy`` does not know
            # them, and ``term`` would wait for them forever.
            for sock in self._outputs:
                sock.close(linger=0)
            if self._pub is not None:
                self._pub.close(linger=0)
            self._ctx.destroy(linger=0)

    def ready_response(self) -> bytes:
        """This engine's ``EngineCoreReadyResponse``."""
        tokens = self.num_blocks * self.block_size
        return wire.encode_ready_response(
            max_model_len=self.max_model_len,
            data_parallel_rank=self.rank,
            max_num_seqs=self.max_batch_size,
            num_gpu_blocks=self.num_blocks,
            block_size=self.block_size,
            kv_cache_size_tokens=tokens,
            kv_cache_max_concurrency=tokens / self.max_model_len,
            effective_attention_block_size=self.block_size,
            instance_id=str(id(self)),
            kv_events_config=self._publisher_config(),
            supports_lora=self.cache_config.enable_lora,
            max_loras=self.cache_config.max_loras if self.cache_config.enable_lora else 0,
        )

    # ---- KV-cache events ---------------------------------------------------------------------

    def _publisher_config(self) -> dict[str, Any] | None:
        """The publisher's resolved configuration, as vLLM's ready response gives it."""
        cfg = self.kv_events
        if cfg is None:
            return None
        extra = dict(cfg.extra)
        return {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": offset_endpoint(cfg.endpoint, self.rank),
            "replay_endpoint": offset_endpoint(cfg.replay_endpoint, self.rank),
            "buffer_steps": extra.get("buffer_steps", 10_000),
            "hwm": extra.get("hwm", 100_000),
            "max_queue_size": extra.get("max_queue_size", 100_000),
            "topic": cfg.topic,
        }

    def _start_publisher(self) -> None:
        cfg = self.kv_events
        if cfg is None:
            return
        assert self._ctx is not None
        endpoint = offset_endpoint(cfg.endpoint, self.rank)
        assert endpoint is not None
        sync_ctx = zmq.Context.shadow(self._ctx.underlying)
        self._pub = sync_ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, dict(cfg.extra).get("hwm", 100_000))
        if publisher_binds(endpoint):
            self._pub.bind(endpoint)
        else:
            self._pub.connect(endpoint)
        replay = offset_endpoint(cfg.replay_endpoint, self.rank)
        if replay is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay)

    def _publish(self) -> None:
        """This step's KV-cache events, as one batch."""
        if self._pub is None:
            return
        events = self.pool.take_events()
        if not events:
            return
        assert self.kv_events is not None
        payload = encode_batch(KVEventBatch(time.time(), events, self.rank))
        seq = self._seq
        self._seq += 1
        self._pub.send_multipart((self.kv_events.topic.encode(), seq.to_bytes(8, "big"), payload))
        self._published.append((seq, payload))

    async def _serve_replay(self) -> None:
        """Answer replay requests with the batches still held from the asked sequence on."""
        assert self._replay is not None and self.kv_events is not None
        topic = self.kv_events.topic.encode()
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._published):
                if seq >= first:
                    await self._replay.send_multipart(
                        (client, b"", topic, seq.to_bytes(8, "big"), payload)
                    )
            await self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    # ---- the protocol ------------------------------------------------------------------------

    async def _handshake(self) -> None:
        assert self._ctx is not None
        hs = self._ctx.socket(zmq.DEALER)
        hs.setsockopt(zmq.IDENTITY, self.identity)
        hs.setsockopt(zmq.LINGER, 5000)
        hs.connect(self.handshake_address)
        await hs.send(wire.encode_handshake("HELLO"))
        log.info("rank %d: said hello to %s", self.rank, self.handshake_address)
        inputs, outputs = wire.decode_init(await hs.recv())
        ready = self.ready_response()
        for address in inputs:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, self.identity)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.connect(address)
            await sock.send(ready)
            self._inputs.append(sock)
        sync_ctx = zmq.Context.shadow(self._ctx.underlying)
        for address in outputs:
            sock = sync_ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(address)
            self._outputs.append(sock)
        await hs.send(wire.encode_handshake("READY"))
        hs.close(linger=1000)
        log.info("rank %d: ready (%d frontend(s))", self.rank, len(self._inputs))

    async def _serve_input(self, sock: zmq.asyncio.Socket, client: int) -> None:
        while True:
            frames = await sock.recv_multipart()
            if not frames:
                continue
            kind, payload = frames[0], frames[1] if len(frames) > 1 else b""
            try:
                if kind == wire.ADD:
                    self._add(wire.decode_add(payload))
                elif kind == wire.ABORT:
                    rids = wire._decode_any(payload)
                    if sum(self._abort(rid) for rid in rids) and self._idle():
                        # vLLM's scheduler runs one more step to report the finished requests.
                        self._send(0, self._message([], stats=True))
                elif kind == wire.UTILITY:
                    self._utility(payload)
                else:
                    log.warning("rank %d: request type %r not handled", self.rank, kind)
            except (CodecError, ValueError, TypeError) as exc:
                log.error("rank %d: bad request message: %s", self.rank, exc)

    def _add(self, add: wire.AddRequest) -> None:
        if add.pooling is not None:
            self._add_pooling(add)
            return
        params = wire.sampling_params_from_map(add.sampling)
        req = _Req(add, params)
        if req.eos is not None and not params.ignore_eos:
            # vLLM's engine stops on the EOS id its frontend names (stop reason nil).
            params.stop_token_ids = [*(params.stop_token_ids or []), req.eos]
        self._reqs[add.rid] = req
        self.stats["added"] += 1
        self.pool.prompt_hashes(req.cache)
        if self.cache_config.scheduling_policy == "priority":
            # (lowest priority first, then arrival: after every waiting request as urgent)
            at = len(self._pending)
            while at and self._pending[at - 1].priority > req.priority:
                at -= 1
            self._pending.insert(at, req)
        else:
            self._pending.append(req)
        self._schedule()

    def _schedule(self) -> None:
        """Give waiting requests their blocks, in order, while there are enough; each then
        prefills (its uncached tokens' time, after the prompts before it) and decodes."""
        pending = self._pending
        while pending:
            req = pending[0]
            # (vLLM's scheduler does not look a request up in its prefix cache when it asks
            # for prompt logprobs.)
            if not self.pool.admit(req.cache, read_cache=req.prompt_logprobs is None):
                break
            pending.pop(0)
            req.running = True
            uncached = req.prompt_len - req.cache.cached_tokens
            delay = uncached * self.cache_config.prefill_time
            if delay <= 0:
                self._start(req)
                continue
            loop = asyncio.get_running_loop()
            start = max(loop.time(), self._prefill_free_at)
            self._prefill_free_at = start + delay
            req.timer = loop.call_at(self._prefill_free_at, self._start, req)

    def _start(self, req: _Req) -> None:
        """A request's prompt is computed: its blocks are cached, and it decodes."""
        req.timer = None
        if self._reqs.get(req.add.rid) is not req:
            return
        self.pool.computed(req.cache, req.prompt_len)
        self._publish()
        priority = req.priority if self.cache_config.scheduling_policy == "priority" else 0
        self.synthetic.submit(
            EngineRequest(req.add.rid, req.add.prompt_ids, req.params, priority=priority)
        )

    def _release(self, req: _Req) -> None:
        """A request is over: its blocks go back (waiting requests may now have theirs)."""
        if req.timer is not None:
            req.timer.cancel()
            req.timer = None
        if req.running:
            self.pool.free(req.cache)
            req.running = False
        elif req in self._pending:
            self._pending.remove(req)

    def _add_pooling(self, add: wire.AddRequest) -> None:
        """A pooling request: answered by the synthetic engine's next step (or, for a task the
        mock does not run, failed at once, as vLLM's engine fails it)."""
        params = decode_pooling_params(add.pooling)
        req = _Req(add)
        self.stats["added"] += 1
        if params.task not in self.supported_tasks:
            log.error("rank %d: unsupported pooling task %r", self.rank, params.task)
            out = wire.StepOutput(add.rid, [], finish_reason=wire.FINISH_ERROR)
            self._send(req.client, self._message([out], stats=True))
            return
        self._reqs[add.rid] = req
        self.synthetic.submit_pooling(
            PoolingRequest(add.rid, add.prompt_ids, params, priority=add.priority)
        )

    def _on_pooled(self, pooled: Pooled) -> None:
        """A synthetic step's pooling outputs, as vLLM's engine sends them: each a finished
        output with its tensor (float32, in a frame of its own past 256 bytes)."""
        now = time.monotonic()
        rows: dict[int, list[wire.StepOutput]] = {}
        aux: dict[int, list[bytes]] = {}
        for rid, data in zip(pooled.rids, pooled.data):
            req = self._reqs.pop(rid, None)
            if req is None:
                continue
            frames = aux.setdefault(req.client, [])
            out = wire.StepOutput(
                rid,
                [],
                pooling_output=wire.encode_array(data, frames, "float32"),
                finish_reason=wire.FINISH_STOP,
            )
            out.events = [
                {"type": wire.EVENT_QUEUED, "timestamp": req.queued},
                {"type": wire.EVENT_SCHEDULED, "timestamp": now},
            ]
            out.prefill_stats = wire.prefill_stats_map(req.prompt_len)
            rows.setdefault(req.client, []).append(out)
        stats = True
        for client, outs in rows.items():
            self._send(client, self._message(outs, stats=stats, now=now), aux.get(client))
            stats = False
        if rows and self._idle():
            self._send(0, self._message([], stats=True))

    def _abort(self, rid: str) -> bool:
        req = self._reqs.pop(rid, None)
        if req is None:
            return False
        self._release(req)
        self.stats["aborted"] += 1
        self.synthetic.abort(rid)
        self._schedule()
        self._publish()
        return True

    def _idle(self) -> bool:
        return not self.synthetic.running and not self.synthetic.waiting and not self._reqs

    def _utility(self, payload: bytes) -> None:
        client_index, call_id, method, args = wire._decode_any(payload)
        result = self._lora_call(method, args) if self.cache_config.enable_lora else None
        if result is None:
            result = _UTILITY_RESULTS.get(method, _Failed(_no_method(method)))
        if method == "get_supported_tasks":
            result = list(self.supported_tasks)
        if method == "reset_prefix_cache":
            # (its AllBlocksCleared event goes out with the next step's, as vLLM's does)
            result = self.pool.reset()
            self._prefix_reset = self._prefix_reset or result
        if isinstance(result, _Failed):
            out = wire.UtilityOutput(call_id, str(result), None)
        else:
            out = wire.UtilityOutput(call_id, None, [None, result])
        msg = wire.StepOutputs(self.rank, [], None, time.monotonic(), out)
        self._send(client_index, msg)

    def _lora_call(self, method: str, args: list[Any]) -> Any:
        """The LoRA utility calls of an engine started with ``--enable-lora`` (None: not one)."""
        if method == "add_lora" and args and isinstance(args[0], list):
            name, lora_id = args[0][0], args[0][1]
            if lora_id not in self._loras and len(self._loras) >= max(self.max_cpu_loras, 1):
                self._loras.pop(next(iter(self._loras)))
            self._loras[int(lora_id)] = str(name)
            return True
        if method == "remove_lora" and args:
            return self._loras.pop(int(args[0]), None) is not None
        if method == "pin_lora" and args:
            return int(args[0]) in self._loras
        if method == "list_loras":
            return sorted(self._loras)
        return None

    @property
    def max_cpu_loras(self) -> int:
        """Adapters kept loaded (vLLM's ``--max-cpu-loras`` defaults to ``--max-loras``)."""
        return self.cache_config.max_loras

    def _send(self, client: int, msg: wire.StepOutputs, aux: list[bytes] | None = None) -> None:
        if aux:
            self._outputs[client].send_multipart([wire.encode_outputs(msg), *aux], copy=False)
        else:
            self._outputs[client].send(wire.encode_outputs(msg), copy=False)

    def _lora_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Requests per adapter: running, waiting (vLLM's scheduler stats)."""
        running: dict[str, int] = {}
        waiting: dict[str, int] = {}
        for req in self._reqs.values():
            name = req.lora_name
            if name is not None:
                into = running if req.running else waiting
                into[name] = into.get(name, 0) + 1
        return running, waiting

    def _message(
        self,
        outputs: list[wire.StepOutput],
        *,
        stats: bool,
        now: float | None = None,
    ) -> wire.StepOutputs:
        scheduler_stats = None
        if stats:
            requests, queries, hits = self._prefix
            running, waiting = self._lora_counts() if self.cache_config.enable_lora else ({}, {})
            prefilling = sum(1 for r in self._reqs.values() if r.timer is not None)
            scheduler_stats = wire.scheduler_stats_map(
                self.synthetic.running + prefilling,
                self.synthetic.waiting + len(self._pending),
                self.pool.usage,
                prefix_requests=requests,
                prefix_queries=queries,
                prefix_hits=hits,
                prefix_reset=self._prefix_reset,
                running_lora_adapters=running,
                waiting_lora_adapters=waiting,
            )
            self._prefix = [0, 0, 0]
            self._prefix_reset = False
        return wire.StepOutputs(
            self.rank,
            outputs,
            scheduler_stats,
            time.monotonic() if now is None else now,
            weight_version=wire.WEIGHT_VERSION,
        )

    def _on_frame(self, frame: Any) -> None:
        """A synthetic-engine frame, re-sent as vLLM ``EngineCoreOutputs`` to each frontend."""
        if isinstance(frame, Pooled):
            self._on_pooled(frame)
            return
        now = time.monotonic()
        rows: dict[int, list[wire.StepOutput]] = {}
        aux: dict[int, list[bytes]] = {}
        reqs = self._reqs
        pool = self.pool
        finished = False
        if frame[0] == EGRESS_TAG_ERROR:
            rid, _message = decode_error_frame(frame)
            req = reqs.pop(rid, None)
            if req is not None:
                finished = True
                self._release(req)
                out = wire.StepOutput(rid, [], finish_reason=wire.FINISH_ERROR)
                rows.setdefault(req.client, []).append(out)
        elif frame[0] == EGRESS_TAG_BATCH:
            decoded = decode_batch_frame(frame)
            ids = decoded.token_ids.tolist()
            extras = decoded.has_extras
            pos = 0
            for i, (rid, n, fin) in enumerate(
                zip(decoded.rids, decoded.tok_lens, decoded.finish_reasons)
            ):
                new = ids[pos : pos + n]
                pos += n
                req = reqs.get(rid)
                if req is None:
                    continue
                out = wire.StepOutput(rid, new)
                cached = req.cache
                if req.first:
                    req.first = False
                    if req.prompt_logprobs is None:
                        prefix = self._prefix
                        prefix[0] += 1
                        prefix[1] += req.prompt_len
                        prefix[2] += cached.cached_tokens
                        stats = self.stats
                        stats["requests"] += 1
                        stats["queries"] += req.prompt_len
                        stats["hits"] += cached.cached_tokens
                    out.events = [
                        {"type": wire.EVENT_QUEUED, "timestamp": req.queued},
                        {"type": wire.EVENT_SCHEDULED, "timestamp": now},
                    ]
                    out.prefill_stats = wire.prefill_stats_map(req.prompt_len, cached.cached_tokens)
                if extras:
                    got = decoded.extras_at(i)
                    if got:
                        _logprobs(out, req, got, aux.setdefault(req.client, []))
                cached.tokens.extend(new)
                pool.grow(cached, len(cached.tokens))
                # (the newest token's KV is computed by the next step)
                pool.computed(cached, len(cached.tokens) - 1)
                if fin is not None:
                    del reqs[rid]
                    finished = True
                    self._release(req)
                    if fin.kind == "stop":
                        out.finish_reason = wire.FINISH_STOP
                        matched = fin.matched()
                        out.stop_reason = None if matched == req.eos else matched  # type: ignore[assignment]
                    elif fin.kind == "length":
                        out.finish_reason = wire.FINISH_LENGTH
                    else:
                        out.finish_reason = wire.FINISH_ABORT
                rows.setdefault(req.client, []).append(out)
        if finished:
            self._schedule()
        self._publish()
        # As vLLM's scheduler does: the step's stats ride with one frontend's outputs only (the
        # first's), or alone to frontend 0 when the step has none.
        stats = True
        for client, outs in rows.items() or [(0, [])]:
            msg = self._message(outs, stats=stats, now=now)
            self._send(client, msg, aux.get(client))
            stats = False
        if finished and self._idle():
            # The step vLLM's scheduler runs to report requests finished in the last one.
            self._send(0, self._message([], stats=True))


def _no_method(method: str) -> str:
    return f"Call to {method} method failed: 'EngineCoreProc' object has no attribute '{method}'"


def _top(
    chosen: dict[str, Any], top: dict[str, Any] | None, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, logprobs)`` of shape ``[positions, 1 + k]`` (column 0 the chosen token) and the
    chosen tokens' ranks (1 for the most likely; ``k + 1`` when not among the top ``k``)."""
    ids0 = np.asarray(chosen["ids"], dtype=np.int32)
    lps0 = np.asarray(chosen["values"], dtype=np.float32)
    n = len(ids0)
    ids = np.zeros((n, k + 1), dtype=np.int32)
    lps = np.full((n, k + 1), -np.inf, dtype=np.float32)
    ids[:, 0] = ids0
    lps[:, 0] = lps0
    ranks = np.full(n, k + 1, dtype=np.int64)
    if top is not None and k:
        lens = np.asarray(top["poslens"], dtype=np.int64)
        tid = np.asarray(top["ids"], dtype=np.int32)
        tlp = np.asarray(top["values"], dtype=np.float32)
        at = 0
        for row in range(n):
            m = min(int(lens[row]), k)
            ids[row, 1 : 1 + m] = tid[at : at + m]
            lps[row, 1 : 1 + m] = tlp[at : at + m]
            hit = np.flatnonzero(tid[at : at + m] == ids0[row])
            if hit.size:
                ranks[row] = hit[0] + 1
            at += int(lens[row])
    return ids, lps, ranks


def _logprobs(out: wire.StepOutput, req: _Req, got: dict[str, Any], aux: list[bytes]) -> None:
    """A request's logprobs of the step, in vLLM's types (arrays past the inline limit go to
    ``aux``, the message's extra frames)."""
    if req.logprobs is not None and "out_lp" in got:
        ids, lps, ranks = _top(got["out_lp"], got.get("out_topk"), req.logprobs)
        out.new_logprobs = wire.logprobs_lists(ids, lps, ranks, aux)
    if req.prompt_logprobs is not None and "in_lp" in got:
        ids, lps, ranks = _top(got["in_lp"], got.get("in_topk"), req.prompt_logprobs)
        out.new_prompt_logprobs_tensors = wire.logprobs_tensors(ids, lps, ranks, aux)


def run_mock_engine(
    tokenizer: Tokenizer,
    config: SyntheticConfig,
    handshake_address: str,
    *,
    rank: int = 0,
    max_model_len: int | None = None,
    runner: str = "generate",
    cache: MockCacheConfig | None = None,
    stats_file: str | None = None,
) -> None:
    """Run one mock engine until SIGTERM or SIGINT (the ``tokenwire mock-engine`` command);
    then write its counters (``MockEngine.stats``) to ``stats_file`` as JSON, if given."""
    engine = MockEngine(
        tokenizer,
        config,
        handshake_address,
        rank=rank,
        max_model_len=max_model_len,
        runner=runner,
        cache=cache,
    )

    async def main() -> None:
        task = asyncio.ensure_future(engine.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    if stats_file:
        with open(stats_file, "w", encoding="utf-8") as f:
            json.dump(engine.stats, f)
