"""vLLM's KV-cache events: what an engine publishes about the blocks of its prefix cache, and
tokenwire's subscriber to them.

An engine started with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": ..., "replay_endpoint": ..., "topic": ...}'`` publishes, after each scheduler step that
changed its cache, one ``KVEventBatch`` on a ZMQ PUB socket: the multipart message ``[topic,
sequence number (8 bytes, big-endian), msgpack(batch)]``. A batch is the array ``[ts, events,
data_parallel_rank]``; each event a map tagged by ``type``: ``BlockStored`` (``block_hashes``,
``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id``, ``medium``, ``lora_name``, and
``extra_keys``, ``group_idx``, ``session_id``... when set), ``BlockRemoved`` (``block_hashes``,
``medium``, ``group_idx``), ``AllBlocksCleared``. Rank ``r`` of a data-parallel deployment
publishes on the configured TCP port plus ``r`` (the replay port too). The publisher binds an
endpoint with a wildcard host (``tcp://*:5557``) or an ``ipc://`` one and connects to any other,
so a subscriber connects to the first kind and binds the second. The replay endpoint (a ROUTER the
engine binds) answers ``[b"", start sequence (8 bytes)]`` with every batch it still holds from
that number on, each as ``[b"", topic, sequence, payload]``, then ``[b"", b"", -1, b""]``.

(vLLM 0.32's ``vllm/distributed/kv_events.py`` and ``vllm/config/kv_events.py``; the mock engine
publishes the same, checked against a real engine field for field in the tests.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq
import zmq.asyncio

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVEventBatch",
    "KvEventSubscriber",
    "KvEventsConfig",
    "END_SEQ",
    "decode_batch",
    "encode_batch",
    "offset_endpoint",
]

log = logging.getLogger("tokenwire.engine.vllm.kv_events")

#: The sequence number that ends a replay.
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Blocks that entered the prefix cache (one request's, consecutive)."""

    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    #: Per block: its extra hash keys, untagged (the LoRA name, the cache salt), or None.
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Blocks evicted from the prefix cache."""

    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """The whole prefix cache was emptied (``reset_prefix_cache``)."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One step's events."""

    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()
_raw_batch = msgspec.msgpack.Decoder(_RawBatch)
_event = msgspec.msgpack.Decoder(Event)


def encode_batch(batch: KVEventBatch) -> bytes:
    """A batch's msgpack, as vLLM's publisher writes it."""
    return _encoder.encode(batch)


def decode_batch(payload: bytes | memoryview) -> KVEventBatch:
    """A published batch; events of kinds this version does not know are left out
    (``msgspec.DecodeError`` when the payload is not a batch)."""
    raw = _raw_batch.decode(payload)
    events: list[Event] = []
    for item in raw.events:
        try:
            events.append(_event.decode(item))
        except msgspec.DecodeError:
            continue
    return KVEventBatch(raw.ts, events, raw.data_parallel_rank)


def offset_endpoint(endpoint: str | None, rank: int) -> str | None:
    """Rank ``rank``'s endpoint (vLLM's ``offset_endpoint_port``: a TCP port plus the rank, 0
    left as it is; an ``inproc`` name suffixed)."""
    if not endpoint or rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://") and ":" in endpoint[6:]:
        base, port = endpoint.rsplit(":", 1)
        return endpoint if int(port) == 0 else f"{base}:{int(port) + rank}"
    raise ValueError(f"a data-parallel rank's KV events endpoint must be tcp://, got {endpoint!r}")


def publisher_binds(endpoint: str) -> bool:
    """Whether vLLM's publisher binds ``endpoint`` (else it connects to it)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


@dataclass(frozen=True)
class KvEventsConfig:
    """vLLM's ``KVEventsConfig`` (``--kv-events-config``), the fields a subscriber needs."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    topic: str = ""
    #: The rest, passed on to the engine as given.
    extra: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, value: str | dict[str, Any]) -> KvEventsConfig:
        """From vLLM's JSON (``ValueError`` naming what is wrong)."""
        data = json.loads(value) if isinstance(value, str) else dict(value)
        if not isinstance(data, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        enabled = data.pop("enable_kv_cache_events", False)
        publisher = data.pop("publisher", None) or ("zmq" if enabled else "null")
        if publisher not in ("zmq", "null"):
            raise ValueError(
                f"--kv-events-config: publisher must be zmq or null, got {publisher!r}"
            )
        endpoint = data.pop("endpoint", "tcp://*:5557")
        replay = data.pop("replay_endpoint", None)
        topic = data.pop("topic", "")
        for name, value_ in (("endpoint", endpoint), ("replay_endpoint", replay)):
            if value_ is not None and not (
                isinstance(value_, str) and value_.startswith(("tcp://", "ipc://", "inproc://"))
            ):
                raise ValueError(
                    f"--kv-events-config: {name} must be a ZMQ address, got {value_!r}"
                )
        if not isinstance(topic, str):
            raise ValueError("--kv-events-config: topic must be a string")
        return cls(bool(enabled), publisher, endpoint, replay, topic, tuple(sorted(data.items())))

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def to_json(self) -> str:
        """The JSON vLLM takes."""
        data = dict(self.extra)
        data |= {
            "enable_kv_cache_events": self.enable_kv_cache_events,
            "publisher": self.publisher,
            "endpoint": self.endpoint,
            "topic": self.topic,
        }
        if self.replay_endpoint is not None:
            data["replay_endpoint"] = self.replay_endpoint
        return json.dumps(data)


def _dialable(endpoint: str, host: str) -> str:
    """Where a subscriber reaches a publisher that binds ``endpoint`` (a wildcard host is the
    engine's: ``host``)."""
    if endpoint.startswith("tcp://"):
        addr, port = endpoint[6:].rsplit(":", 1)
        if addr in ("*", "0.0.0.0", "[::]", "::"):
            addr = host
        return f"tcp://{addr}:{port}"
    return endpoint


#: Called with (engine rank, batch) for each batch, in sequence order.
OnBatch = Callable[[int, KVEventBatch], None]
#: Called with an engine rank whose events may have been lost (its index may be stale).
OnGap = Callable[[int], None]


class _Source:
    """One engine's publisher."""

    def __init__(self, rank: int, sock: zmq.asyncio.Socket, replay: str | None) -> None:
        self.rank = rank
        self.sock = sock
        self.replay = replay
        self.last: int | None = None
        self.task: asyncio.Task[None] | None = None


class KvEventSubscriber:
    """Subscribes to each engine's KV-cache events and hands their batches to ``on_batch`` in
    order. A batch that follows a gap in the sequence numbers (the subscriber joined late, or
    messages were dropped) is first preceded by what the engine's replay endpoint still holds
    from the gap on; without one, ``on_gap`` hears of it. A sequence that starts again from 0 is
    an engine that restarted."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        on_batch: OnBatch,
        on_gap: OnGap | None = None,
        *,
        host: str = "127.0.0.1",
    ) -> None:
        self.ctx = ctx
        self.on_batch = on_batch
        self.on_gap = on_gap
        self.host = host
        self._sources: dict[int, _Source] = {}
        #: Batches taken, batches that did not decode, gaps seen (for tests and logs).
        self.stats = {"batches": 0, "bad": 0, "gaps": 0, "replayed": 0}
        #: Batches taken per engine rank.
        self.batches: dict[int, int] = {}

    @property
    def ranks(self) -> list[int]:
        return sorted(self._sources)

    def add(
        self, rank: int, config: KvEventsConfig, *, offset: bool = True, dial: bool = False
    ) -> str:
        """Subscribe to rank ``rank``'s publisher as ``config`` says (the deployment's, whose
        ports the rank offsets; ``offset`` False: the rank's own, as its ready response gives
        them). The configuration is the one the engines were given: an endpoint they connect to
        is bound here, one they bind is dialed (its wildcard host is ``host``); ``dial``: every
        endpoint is the publisher's, to dial. Returns the address subscribed to (or bound)."""
        if rank in self._sources:
            self.remove(rank)
        endpoint = offset_endpoint(config.endpoint, rank) if offset else config.endpoint
        replay = offset_endpoint(config.replay_endpoint, rank) if offset else config.replay_endpoint
        assert endpoint is not None
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.SUBSCRIBE, config.topic.encode())
        if dial or publisher_binds(endpoint):
            where = _dialable(endpoint, self.host)
            sock.connect(where)
        else:
            where = endpoint
            sock.bind(where)
        src = _Source(rank, sock, _dialable(replay, self.host) if replay else None)
        self._sources[rank] = src
        src.task = asyncio.get_running_loop().create_task(self._read(src), name=f"kv-events-{rank}")
        log.info("subscribed to engine rank %d's KV-cache events at %s", rank, where)
        return where

    def remove(self, rank: int) -> None:
        src = self._sources.pop(rank, None)
        if src is not None:
            if src.task is not None:
                src.task.cancel()
            src.sock.close(linger=0)

    async def close(self) -> None:
        tasks = [s.task for s in self._sources.values() if s.task is not None]
        for rank in list(self._sources):
            self.remove(rank)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _read(self, src: _Source) -> None:
        try:
            while True:
                frames = await src.sock.recv_multipart()
                if len(frames) != 3:
                    self.stats["bad"] += 1
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                if src.last is not None and seq <= src.last:
                    if seq == 0 or seq < src.last - 1:  # the engine restarted: a new sequence
                        src.last = None
                    else:
                        continue  # (already taken in a replay)
                expected = 0 if src.last is None else src.last + 1
                if seq != expected and (src.last is not None or seq > 0):
                    self.stats["gaps"] += 1
                    if src.replay is not None:
                        await self._replay(src, expected, seq)
                    elif self.on_gap is not None:
                        self.on_gap(src.rank)
                self._take(src, seq, frames[2])
        except asyncio.CancelledError:
            raise
        except Exception:  # pragma: no cover - a broken socket: no more events from it
            log.exception("reading engine rank %d's KV-cache events failed", src.rank)
            if self.on_gap is not None:
                self.on_gap(src.rank)

    def _take(self, src: _Source, seq: int, payload: bytes) -> None:
        src.last = seq
        try:
            batch = decode_batch(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.stats["bad"] += 1
            log.warning("engine rank %d sent a KV-cache event batch that does not decode", src.rank)
            return
        self.stats["batches"] += 1
        self.batches[src.rank] = self.batches.get(src.rank, 0) + 1
        self.on_batch(src.rank, batch)

    async def _replay(self, src: _Source, start: int, upto: int, timeout: float = 2.0) -> None:
        """Ask the engine for its batches from ``start`` up to (not including) ``upto``."""
        assert src.replay is not None
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(src.replay)
            await sock.send_multipart((b"", start.to_bytes(8, "big")))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while True:
                left = deadline - loop.time()
                if left <= 0 or not await sock.poll(left * 1000):
                    log.warning("engine rank %d did not replay its KV-cache events", src.rank)
                    if self.on_gap is not None:
                        self.on_gap(src.rank)
                    return
                frames = await sock.recv_multipart()
                if len(frames) != 4:
                    continue
                _, _topic, seq_bytes, payload = frames
                if seq_bytes == END_SEQ:
                    break
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq < start or seq >= upto or (src.last is not None and seq <= src.last):
                    continue
                self.stats["replayed"] += 1
                self._take(src, seq, payload)
            if (src.last is None or src.last < upto - 1) and self.on_gap is not None:
                self.on_gap(src.rank)  # (the engine no longer holds the oldest of them)
        finally:
            sock.close(linger=0)
