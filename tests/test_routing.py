"""Routing that knows the prefix cache: the policies and the index (no I/O), vLLM's block hashes,
the mock engine's block pool and its KV-cache events, the event subscriber (gaps, replay,
restarts), and tokenwire over four ``tokenwire mock-engine`` processes that model a prefix cache:
shared system prompts land where they are cached, by the engines' events or without them, and a
request whose engine dies before its first token is served by another."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator

import httpx
import msgspec
import pytest
import zmq
import zmq.asyncio

from tokenwire.engine.routing import PrefixIndex, Router, RoutingConfig
from tokenwire.engine.vllm import VllmEngine, VllmEngineConfig
from tokenwire.engine.vllm import kv_events as ev
from tokenwire.engine.vllm.block_hash import BlockHasher, external
from tokenwire.engine.vllm.mock_cache import BlockPool, CachedRequest
from tokenwire.server import ServerConfig, create_app
from vllm_helpers import MockThreads, free_port, wait_until

from conftest import real_tokenizer
from served import run_app

MODEL = "mock-model"

# ---- policies and the index ----------------------------------------------------------------------


def test_fewest_and_round_robin():
    fewest = Router(RoutingConfig(policy="fewest"))
    assert fewest.pick([(0, 3), (1, 1), (2, 2)], [1, 2]) == 1
    rr = Router(RoutingConfig(policy="round-robin"))
    assert [rr.pick([(0, 9), (1, 0), (2, 0)]) for _ in range(4)] == [0, 1, 2, 0]


def test_prefix_routing_follows_the_longest_cached_prefix_within_the_bound():
    router = Router(RoutingConfig(policy="prefix", balance_threshold=4))
    index = router.index
    # (approximate: what was sent where) a cold prompt goes to the least loaded engine ...
    assert router.pick([(0, 2), (1, 0), (2, 1)], [10, 11, 12]) == 1
    # ... and its followers after it, even when another is a little less loaded
    assert router.pick([(0, 0), (1, 3), (2, 0)], [10, 11, 12, 13]) == 1
    assert index.match(1, [10, 11, 12, 13, 14]) == 4
    # the longest prefix wins over a shorter one
    router.pick([(0, 0), (1, 9), (2, 9)], [10, 11, 20])  # engine 0 holds 10, 11 (past the bound)
    assert index.match(0, [10, 11, 12]) == 2
    assert router.pick([(0, 0), (1, 2), (2, 0)], [10, 11, 12, 13]) == 1
    # past the bound: the least loaded engine holding what it can
    assert router.pick([(0, 1), (1, 6), (2, 0)], [10, 11, 12, 13]) == 0
    assert router.decisions == {"cache": 2, "balance": 2, "cold": 1}


def test_the_index_from_events_and_what_was_just_sent():
    now = [0.0]
    index = PrefixIndex(clock=lambda: now[0])
    index.use_events(0)
    index.stored(0, [1, 2, 3])
    assert index.match(0, [1, 2, 3, 4]) == 3
    index.removed(0, [2])
    assert index.match(0, [1, 2, 3]) == 1
    # a prompt just sent counts until its events come (or for a while)
    index.sent(0, [1, 2, 3, 7])
    assert index.match(0, [1, 2, 3, 7]) == 4
    now[0] += 60
    assert index.match(0, [1, 2, 3, 7]) == 1
    index.cleared(0)
    assert index.match(0, [1]) == 0 and index.size(0) == 0
    # approximate entries are bounded by the engine's capacity, least recently used first
    index.set_capacity(1, 3)
    index.sent(1, [1, 2])
    index.sent(1, [5, 6])
    assert index.match(1, [1, 2]) == 0 and index.match(1, [5, 6]) == 2


# ---- vLLM's block hashes and the mock's block pool -----------------------------------------------


def test_block_hashes_are_vllms():
    """Reference values from vLLM 0.32's own ``hash_block_tokens`` (sha256, no PYTHONHASHSEED);
    the real engine's events are checked in test_kv_events_fidelity.py."""
    h = BlockHasher(16)
    first = h.block(None, range(16), None)
    assert first.hex() == "fe8fa5dda3210d0ca2031e37cbe3b001186773cd1c710beb2d45fcb51d434798"
    assert external(first) == 3262291359910021016
    second = h.block(first, range(16, 32), (("lora", "a", "/x"),))
    assert second.hex() == "9f99245b923196bbd6109b45cb39da91ae4000e6e8d7c794c90f8cf983c8799f"
    salted = h.block(None, range(16), (("cache_salt", "s"),))
    assert salted.hex() == "23bb70ca91a3697ed579080cc3a4d36b53c7348f3a8a63c7b5b67491d85e237d"
    chain = h.hashes(list(range(40)), lora=("a", "/x"))
    assert len(chain) == 2 and chain[0] != first
    assert h.hashes(list(range(40)), cache_salt="s")[0] == salted


def _request(rid: str, tokens: list[int], **kw) -> CachedRequest:
    return CachedRequest(rid, list(tokens), **kw)


def partial_block_reused_first(pool: BlockPool) -> bool:
    """(vLLM's free_blocks: a block that caches nothing goes to the free queue's front)"""
    return bool(pool._front) and pool._front[0].hash is None


def test_block_pool_hits_evicts_least_recent_and_reports_events():
    pool = BlockPool(9, 4, BlockHasher(4), events=True)  # 8 usable blocks of 4 tokens
    a = _request("a", list(range(13)))  # 3 full blocks + 1 token
    pool.prompt_hashes(a)
    assert pool.admit(a) and a.cached_tokens == 0 and pool.used == 4
    pool.computed(a, 13)
    (stored,) = pool.take_events()
    assert isinstance(stored, ev.BlockStored) and stored.parent_block_hash is None
    assert stored.block_hashes == [external(x) for x in a.hashes]
    assert stored.token_ids == list(range(12)) and stored.extra_keys == [None, None, None]
    pool.free(a)
    b = _request("b", list(range(13)))
    pool.prompt_hashes(b)
    assert pool.admit(b) and b.cached_tokens == 12  # (the last token is always computed)
    pool.free(b)
    # a 12-token prompt: only 2 blocks may hit (its last token is computed again)
    c = _request("c", list(range(12)))
    pool.prompt_hashes(c)
    assert pool.admit(c) and c.cached_tokens == 8
    pool.free(c)
    assert partial_block_reused_first(pool)
    # a new prompt takes the block that cached nothing first (freed to the queue's front), then
    # the never-used ones, then evicts the least recently freed cached ones
    d = _request("d", list(range(100, 128)))  # 7 blocks: 1 reused, 4 new, 2 evicted
    pool.prompt_hashes(d)
    pool.take_events()
    assert pool.admit(d)
    removed = [e for e in pool.take_events() if isinstance(e, ev.BlockRemoved)]
    assert [e.block_hashes for e in removed] == [[external(h)] for h in a.hashes[2:0:-1]]
    assert pool.reset() is False  # d holds blocks
    pool.free(d)
    assert pool.reset() is True
    assert isinstance(pool.take_events()[-1], ev.AllBlocksCleared)
    assert pool.admit(b) and b.cached_tokens == 0


def test_event_batches_round_trip_and_tolerate_unknown_events():
    batch = ev.KVEventBatch(
        1.5,
        [
            ev.BlockStored([1, 2], None, [5] * 32, 16, None, "GPU", None, [None, None], 0),
            ev.BlockRemoved([3], "GPU", 0),
            ev.AllBlocksCleared(),
        ],
        0,
    )
    raw = ev.encode_batch(batch)
    assert ev.decode_batch(raw) == batch
    plain = msgspec.msgpack.decode(raw)
    assert plain[0] == 1.5 and plain[2] == 0 and plain[1][0]["type"] == "BlockStored"
    plain[1].append({"type": "SomethingNew", "x": 1})
    assert ev.decode_batch(msgspec.msgpack.encode(plain)) == batch
    cfg = ev.KvEventsConfig.parse(
        '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "buffer_steps": 5}'
    )
    assert cfg.enabled and cfg.publisher == "zmq" and dict(cfg.extra) == {"buffer_steps": 5}
    assert json.loads(cfg.to_json())["buffer_steps"] == 5
    assert ev.offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert ev.offset_endpoint("tcp://*:0", 2) == "tcp://*:0"
    with pytest.raises(ValueError):
        ev.KvEventsConfig.parse('{"endpoint": 5}')


def test_the_subscriber_replays_a_gap_and_follows_a_restart():
    async def main() -> list:
        ctx = zmq.asyncio.Context()
        pub_port, replay_port = free_port(), free_port()
        pub = ctx.socket(zmq.PUB)
        pub.bind(f"tcp://127.0.0.1:{pub_port}")
        replay = ctx.socket(zmq.ROUTER)
        replay.bind(f"tcp://127.0.0.1:{replay_port}")
        held: dict[int, bytes] = {}
        got: list = []
        gaps: list[int] = []

        def payload(n: int) -> bytes:
            return ev.encode_batch(ev.KVEventBatch(float(n), [ev.BlockRemoved([n], "GPU")], 0))

        async def serve_replay() -> None:
            while True:
                client, _, start = await replay.recv_multipart()
                for seq in sorted(held):
                    if seq >= int.from_bytes(start, "big"):
                        await replay.send_multipart(
                            (client, b"", b"kv", seq.to_bytes(8, "big"), held[seq])
                        )
                await replay.send_multipart((client, b"", b"", ev.END_SEQ, b""))

        server = asyncio.ensure_future(serve_replay())
        sub = ev.KvEventSubscriber(
            ctx, lambda r, b: got.append(b.events[0].block_hashes[0]), gaps.append
        )
        cfg = ev.KvEventsConfig(
            True,
            "zmq",
            f"tcp://*:{pub_port}",  # the engine binds a wildcard: dialed on the loopback
            f"tcp://*:{replay_port}",
            "kv",
        )
        sub.add(0, cfg)

        async def publish(seq: int) -> None:
            held[seq] = payload(seq)
            await pub.send_multipart((b"kv", seq.to_bytes(8, "big"), held[seq]))

        # the subscriber joins late: what it missed comes from the replay endpoint
        for seq in range(3):
            held[seq] = payload(seq)
        while not got:
            await publish(3)
            await asyncio.sleep(0.05)
        for seq in (4, 6):  # 5 is lost: replayed before 6
            if seq == 6:
                held[5] = payload(5)
            await publish(seq)
        for _ in range(50):
            await asyncio.sleep(0.02)
            if 6 in got:
                break
        # the engine restarts: its sequence starts again from 0
        held.clear()
        await publish(0)
        for _ in range(50):
            await asyncio.sleep(0.02)
            if got[-1] == 0:
                break
        await sub.close()
        server.cancel()
        ctx.destroy(linger=0)
        return [got, gaps, sub.stats]

    got, gaps, stats = asyncio.run(main())
    assert got[:7] == [0, 1, 2, 3, 4, 5, 6] and got[-1] == 0
    assert stats["replayed"] >= 4 and not gaps


# ---- tokenwire over mock engines that model a prefix cache ---------------------------------------

#: A prompt's uncached tokens cost this many milliseconds each before its first token.
PREFILL_MS = "0.05"


@contextlib.contextmanager
def fleet(engines: int, routing: str, *mock_args: str, events: bool = True, **config):
    tok = real_tokenizer("default")
    address = f"tcp://127.0.0.1:{free_port()}"
    kv = None
    args = ["--synthetic-output", "echo", "--step-time-ms", "2", *mock_args]
    if events:
        # (the engines connect to ports tokenwire binds on the loopback)
        kv = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{free_port()}"}
        args += ["--kv-events-config", json.dumps(kv)]
    mocks = MockThreads(address, engines, args)
    engine = VllmEngine(
        tok,
        VllmEngineConfig(
            handshake_address=address,
            data_parallel_size=engines,
            ready_timeout=60,
            routing=RoutingConfig(policy=routing),
            kv_events=ev.KvEventsConfig.parse(kv) if kv else None,
            **config,
        ),
    )
    try:
        app = create_app(tok, engine, ServerConfig(model_name=MODEL))
        with run_app(app, start_timeout=120) as url:
            yield url, engine, mocks
    finally:
        mocks.close()


SYSTEMS = [f"System prompt {j}: " + " ".join(f"rule{j}x{i}" for i in range(120)) for j in range(8)]


def _cached(url: str, prompt: str, **extra) -> int:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, **extra}
    out = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    return (out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def _round(url: str, users: int, concurrency: int = 8) -> list[int]:
    """Requests of every system prompt for ``users`` users, ``concurrency`` at a time: the
    cached tokens of each (in the order they finished)."""
    prompts = [f"{s} User {u} asks a question." for u in range(users) for s in SYSTEMS]
    out: list[int] = []
    lock = threading.Lock()

    def worker(mine: list[str]) -> None:
        for p in mine:
            n = _cached(url, p)
            with lock:
                out.append(n)

    threads = [
        threading.Thread(target=worker, args=(prompts[i::concurrency],)) for i in range(concurrency)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.fixture(scope="module")
def prefix_fleet() -> Iterator:
    with fleet(4, "prefix", "--prefill-time-per-token-ms", PREFILL_MS) as f:
        yield f


def _until_every_rank_published(url: str, engine, ranks: int) -> None:
    """Send unrelated prompts until a KV-event batch has come from every rank: an engine's
    events published before its PUB socket's connection is up are lost (ZMQ's slow joiner), and
    a busy machine can hold that connection back past the first requests."""
    subscriber = engine._routing.subscriber
    deadline = time.monotonic() + 30
    n = 0
    while len(subscriber.batches) < ranks:
        assert time.monotonic() < deadline, subscriber.batches
        prompts = [f"Warm-up {n + k} " + "filler " * 40 for k in range(2 * ranks)]
        n += len(prompts)
        threads = [threading.Thread(target=_cached, args=(url, p)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.1)


def test_shared_prefixes_land_where_they_are_cached(prefix_fleet):
    url, engine, _ = prefix_fleet
    _until_every_rank_published(url, engine, 4)
    cached = _round(url, 4)
    # every system prompt is computed once (its first request), then found cached
    assert sum(1 for n in cached if n > 0) >= len(cached) - len(SYSTEMS) - 2
    decisions = engine.routing_decisions
    assert decisions["cache"] >= len(cached) - len(SYSTEMS) - 2
    assert engine._routing.subscriber.stats["batches"] > 0
    assert engine._routing._verified == {0, 1, 2, 3}  # the engines hash as tokenwire does
    # a salt or an adapter is another cache: not found
    assert _cached(url, SYSTEMS[0] + " again", cache_salt="tenant-b") == 0


def test_without_events_by_what_was_sent_where_and_fewest_spreads_prefixes():
    with fleet(3, "prefix", "--prefill-time-per-token-ms", PREFILL_MS, events=False) as (
        url,
        engine,
        _,
    ):
        # Four at a time: each worker sends two system prompts' requests, one after the other,
        # so none is sent while its system's first is still in prefill (at six at a time that
        # race, on a busy machine, left more first requests uncached than the margin).
        cached = _round(url, 3, concurrency=4)
        assert sum(1 for n in cached if n > 0) >= len(cached) - len(SYSTEMS) - 2
        assert not engine._routing.index.exact(0)  # (no events came)
        # the same engines, caches emptied, routed by requests in flight: each prompt is
        # computed once per engine it reaches
        assert httpx.post(url + "/flush_cache").status_code == 200
        engine._routing.router.config = RoutingConfig(policy="fewest")
        cached = _round(url, 3, concurrency=6)
        assert sum(1 for n in cached if n == 0) > len(SYSTEMS) + 2


def test_a_request_whose_engine_dies_before_its_first_token_is_served_by_another():
    slow = ("--prefill-time-per-token-ms", "20")  # seconds of prefill per prompt
    with fleet(2, "fewest", *slow, events=False, retry_on_failure=True) as (url, engine, mocks):
        results: dict[int, dict] = {}

        def run(i: int) -> None:
            body = {"model": MODEL, "prompt": f"request {i} " * 20, "max_tokens": 3}
            results[i] = httpx.post(url + "/v1/completions", json=body, timeout=120).json()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        wait_until(lambda: all(c["in_flight"] for c in engine.engines), 30, "both engines busy")
        mocks.stop(0)
        for t in threads:
            t.join(120)
        assert all(r["choices"][0]["finish_reason"] == "length" for r in results.values())
        assert engine.retried == 1


def test_the_engines_tokenwire_spawns_are_configured_for_its_routing():
    from tokenwire.entrypoints.cli import build_parser
    from tokenwire.entrypoints.options import fleet as fleet_options

    def parsed(*argv: str):
        return build_parser().parse_args(["serve", "--engine", "vllm", "--model", "m", *argv])

    args = parsed("--data-parallel-size", "2", "--scheduling-policy", "priority")
    extra = fleet_options.engine_args(args)
    assert extra[:2] == ["--scheduling-policy", "priority"]
    cfg = json.loads(extra[extra.index("--kv-events-config") + 1])
    # (the engines connect to loopback ports tokenwire binds)
    assert cfg["enable_kv_cache_events"] and cfg["endpoint"].startswith("tcp://127.0.0.1:")
    assert fleet_options.engine_config(args)["kv_events"] == args.kv_events_auto
    # one engine, another policy, or several API servers: no events configured
    for argv in (("--routing", "fewest", "--data-parallel-size", "2"), ()):
        assert "--kv-events-config" not in fleet_options.engine_args(parsed(*argv))
    given = ["--kv-events-config={}"]
    assert fleet_options.engine_args(parsed("--data-parallel-size", "2"), given) == []


def test_the_kv_events_ports_are_picked_below_the_ephemeral_range(monkeypatch):
    """The ports tokenwire gives its spawned engines for the KV-cache events are free, in a
    run, and below the range the kernel hands out to ``bind(0)``: no other process asking for
    any port can be given one between tokenwire's pick and the engines' start. Where that range
    leaves no room below it, a run from ``bind(0)`` is the fallback."""
    import socket

    from tokenwire.entrypoints.options import fleet as fleet_options

    low = fleet_options._ephemeral_low()
    for _ in range(20):
        base = fleet_options._free_port_run(4)
        assert base >= 10000 and base + 4 <= low
        socks = [socket.socket() for _ in range(4)]
        try:
            for i, s in enumerate(socks):
                s.bind(("127.0.0.1", base + i))
        finally:
            for s in socks:
                s.close()
    monkeypatch.setattr(fleet_options, "_ephemeral_low", lambda: 10500)
    assert fleet_options._free_port_run(2) >= low  # (from bind(0): in the ephemeral range)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_the_engines_scheduling_policy(policy):
    """``--scheduling-policy priority`` (passed to the engines): an engine with one batch slot
    serves the more urgent of two waiting requests first; ``fcfs`` the earlier."""
    args = ("--max-batch-size", "1", "--step-time-ms", "20", "--scheduling-policy", policy)
    with fleet(1, "fewest", *args, events=False) as (url, engine, _):
        finished: list[str] = []

        def run(name: str, priority: int, tokens: int) -> None:
            body = {"model": MODEL, "prompt": f"{name} " * 200, "max_tokens": tokens}
            httpx.post(url + "/v1/completions", json=body | {"priority": priority}, timeout=60)
            finished.append(name)

        first = threading.Thread(target=run, args=("first", 5, 150))  # (3 s)
        first.start()
        wait_until(lambda: engine.engines[0]["in_flight"] == 1, 30, "the first request")
        later = threading.Thread(target=run, args=("later", 5, 2))
        later.start()
        wait_until(lambda: engine.engines[0]["in_flight"] == 2, 30, "the second request")
        urgent = threading.Thread(target=run, args=("urgent", 0, 2))
        urgent.start()
        for t in (first, later, urgent):
            t.join(60)
        expected = ["urgent", "later"] if policy == "priority" else ["later", "urgent"]
        assert finished == ["first", *expected]
