"""The Redis backend (``redis://`` or ``rediss://``; the ``redis`` package, the
``tokenwire[stores]`` extra): several machines share one Redis. Keys under ``tokenwire:``: a
hash per record, a sorted set of each root's items by ``seq``, of each owner's roots by age and
of every root by expiry, the bytes and roots per owner, and the running background responses.
Writes hold a Redis lock (one writer at a time across the fleet), so the bounds hold; reads take
none."""

from __future__ import annotations

import json
from typing import Any

from tokenwire.server.responses.store.backend import (
    STALE_RUN,
    Backend,
    Limits,
    Record,
    Run,
    StoreUnavailable,
)

__all__ = ["RedisBackend", "redis_backend"]

_P = "tokenwire:"
_BYTES = _P + "bytes"  # owner -> bytes kept
_ROOTS = _P + "roots"  # owner -> roots kept
_EXPIRY = _P + "expiry"  # root -> when it expires (a sorted set)
_RUNS = _P + "runs"  # id -> {"worker", "beat", "cancel"}
_LOCK = _P + "lock"


def _rec(rid: str) -> str:
    return f"{_P}r:{rid}"


def _items(root: str) -> str:
    return f"{_P}items:{root}"


def _owned(owner: str) -> str:
    return f"{_P}owned:{owner}"


def _decode(rid: str, h: dict[bytes, bytes]) -> Record:
    expires = h.get(b"expires")
    return Record(
        rid,
        h[b"kind"].decode(),
        h[b"owner"].decode(),
        h[b"root"].decode(),
        h[b"data"],
        int(h[b"seq"]),
        float(h[b"created"]),
        float(expires) if expires else None,
    )


class RedisBackend(Backend):
    """A store in one Redis database."""

    def __init__(self, client: Any, url: str) -> None:
        self.r = client
        self.url = url

    def _lock(self) -> Any:
        return self.r.lock(_LOCK, timeout=30, blocking_timeout=60)

    def _is_running(self, rid: str) -> bool:
        return bool(self.r.hexists(_RUNS, rid))

    def _drop_root(self, root: str) -> None:
        h = self.r.hmget(_rec(root), ["owner", "size"])
        if h[0] is None:
            return
        owner = h[0].decode()
        items = [m.decode() for m in self.r.zrange(_items(root), 0, -1)]
        sizes = self.r.pipeline()
        for item in items:
            sizes.hget(_rec(item), "size")
        freed = int(h[1]) + sum(int(s) for s in sizes.execute() if s is not None)
        pipe = self.r.pipeline()
        pipe.delete(_rec(root), _items(root), *(_rec(i) for i in items))
        pipe.zrem(_owned(owner), root)
        pipe.zrem(_EXPIRY, root)
        pipe.hdel(_RUNS, root)
        pipe.hincrby(_BYTES, owner, -freed)
        pipe.hincrby(_ROOTS, owner, -1)
        pipe.execute()

    def put(self, records: list[Record], limits: Limits, now: float) -> list[str]:
        if not records:
            return []
        expires = now + limits.ttl if limits.ttl else None
        roots = {r.root for r in records}
        with self._lock():
            for rec in records:
                old = self.r.hmget(_rec(rec.id), ["size", "owner"])
                if old[0] is None and not rec.is_root and not self.r.exists(_rec(rec.root)):
                    continue  # (its root is gone)
                if not rec.is_root and rec.seq == 0:
                    top = self.r.zrange(_items(rec.root), -1, -1, withscores=True)
                    rec.seq = int(top[0][1]) + 1 if top else 1
                created = rec.created or now
                if old[0] is not None:
                    created = float(self.r.hget(_rec(rec.id), "created") or created)
                fields = {
                    "kind": rec.kind,
                    "owner": rec.owner,
                    "root": rec.root,
                    "seq": rec.seq,
                    "created": created,
                    "size": rec.size,
                    "data": rec.data,
                }
                pipe = self.r.pipeline()
                pipe.hset(_rec(rec.id), mapping=fields)
                if rec.is_root:
                    pipe.zadd(_owned(rec.owner), {rec.id: created})
                else:
                    pipe.zadd(_items(rec.root), {rec.id: rec.seq})
                if old[0] is None:
                    pipe.hincrby(_BYTES, rec.owner, rec.size)
                    if rec.is_root:
                        pipe.hincrby(_ROOTS, rec.owner, 1)
                else:
                    pipe.hincrby(_BYTES, old[1].decode(), rec.size - int(old[0]))
                pipe.execute()
            for root in roots:
                if not self.r.exists(_rec(root)):
                    continue
                if expires is None:
                    self.r.hdel(_rec(root), "expires")
                    self.r.zrem(_EXPIRY, root)
                else:
                    self.r.hset(_rec(root), "expires", expires)
                    self.r.zadd(_EXPIRY, {root: expires})
            return self._evict(limits, roots, {r.owner for r in records})

    def _oldest(self, owner: str, keep: set[str]) -> str | None:
        """``owner``'s oldest root that may be evicted."""
        start = 0
        while True:
            batch = self.r.zrange(_owned(owner), start, start + 63)
            if not batch:
                return None
            for m in batch:
                rid = m.decode()
                if rid not in keep and not self._is_running(rid):
                    return rid
            start += len(batch)

    def _evict(self, limits: Limits, keep: set[str], owners: set[str]) -> list[str]:
        evicted = []
        for owner in owners:
            while int(self.r.hget(_BYTES, owner) or 0) > limits.max_owner_bytes:
                victim = self._oldest(owner, keep)
                if victim is None:
                    break
                self._drop_root(victim)
                evicted.append(victim)
        while True:
            nbytes = {k.decode(): int(v) for k, v in self.r.hgetall(_BYTES).items()}
            nroots = {k.decode(): int(v) for k, v in self.r.hgetall(_ROOTS).items()}
            over_bytes = sum(nbytes.values()) > limits.max_bytes
            if not over_bytes and sum(nroots.values()) <= limits.max_roots:
                break
            weight = nbytes if over_bytes else nroots
            victim = None
            for owner in sorted(weight, key=weight.__getitem__, reverse=True):
                victim = self._oldest(owner, keep)
                if victim is not None:
                    break
            if victim is None:
                break
            self._drop_root(victim)
            evicted.append(victim)
        return evicted

    def get(self, rid: str, now: float) -> Record | None:
        h = self.r.hgetall(_rec(rid))
        if not h:
            return None
        rec = _decode(rid, h)
        expires = rec.expires
        if not rec.is_root:
            parent = self.r.hget(_rec(rec.root), "expires")
            if not self.r.exists(_rec(rec.root)):
                return None
            expires = float(parent) if parent else None
        if expires is not None and expires <= now:
            return None
        return rec

    def items(
        self, root: str, now: float, *, after: int | None, limit: int, descending: bool
    ) -> list[Record]:
        if descending:
            top = "(" + str(after) if after is not None else "+inf"
            ids = self.r.zrevrangebyscore(_items(root), top, "-inf", start=0, num=limit)
        else:
            low = "(" + str(after) if after is not None else "-inf"
            ids = self.r.zrangebyscore(_items(root), low, "+inf", start=0, num=limit)
        pipe = self.r.pipeline()
        for m in ids:
            pipe.hgetall(_rec(m.decode()))
        return [_decode(m.decode(), h) for m, h in zip(ids, pipe.execute()) if h]

    def delete(self, rid: str) -> bool:
        with self._lock():
            h = self.r.hmget(_rec(rid), ["root", "owner", "size"])
            if h[0] is None:
                return False
            root, owner = h[0].decode(), h[1].decode()
            if root == rid:
                self._drop_root(rid)
            else:
                pipe = self.r.pipeline()
                pipe.delete(_rec(rid))
                pipe.zrem(_items(root), rid)
                pipe.hincrby(_BYTES, owner, -int(h[2]))
                pipe.execute()
            return True

    def usage(self, owner: str | None = None) -> tuple[int, int]:
        if owner is not None:
            return int(self.r.hget(_BYTES, owner) or 0), int(self.r.hget(_ROOTS, owner) or 0)
        nbytes = sum(int(v) for v in self.r.hvals(_BYTES))
        return nbytes, sum(int(v) for v in self.r.hvals(_ROOTS))

    def sweep(self, now: float) -> int:
        gone = 0
        with self._lock():
            for k, raw in self.r.hgetall(_RUNS).items():  # (a dead worker's runs)
                if json.loads(raw)["beat"] < now - STALE_RUN:
                    self.r.hdel(_RUNS, k)
            for m in self.r.zrangebyscore(_EXPIRY, "-inf", now, start=0, num=1000):
                rid = m.decode()
                if not self._is_running(rid):
                    self._drop_root(rid)
                    gone += 1
        return gone

    def run_start(self, rid: str, worker: str, now: float) -> None:
        self.r.hset(_RUNS, rid, json.dumps({"worker": worker, "beat": now, "cancel": False}))

    def run_end(self, rid: str) -> None:
        self.r.hdel(_RUNS, rid)

    def run_get(self, rid: str) -> Run | None:
        raw = self.r.hget(_RUNS, rid)
        if raw is None:
            return None
        v = json.loads(raw)
        return Run(rid, v["worker"], v["beat"], v["cancel"])

    def run_cancel(self, rid: str) -> bool:
        with self._lock():
            run = self.run_get(rid)
            if run is None:
                return False
            value = {"worker": run.worker, "beat": run.beat, "cancel": True}
            self.r.hset(_RUNS, rid, json.dumps(value))
            return True

    def run_beat(self, worker: str, now: float) -> list[str]:
        cancels = []
        with self._lock():
            for k, raw in self.r.hgetall(_RUNS).items():
                v = json.loads(raw)
                if v["worker"] != worker:
                    continue
                v["beat"] = now
                self.r.hset(_RUNS, k, json.dumps(v))
                if v["cancel"]:
                    cancels.append(k.decode())
        return cancels

    def close(self) -> None:
        self.r.close()


def redis_backend(url: str) -> RedisBackend:
    """A Redis store at ``url`` (needs ``tokenwire[stores]``)."""
    try:
        import redis
    except ImportError:
        raise StoreUnavailable(
            "a redis:// responses store needs the redis package: pip install 'tokenwire[stores]'"
        ) from None
    try:
        client = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=10)
        client.ping()
    except redis.RedisError as exc:
        raise StoreUnavailable(f"cannot reach the Redis store: {exc}") from None
    shown = url.split("@")[-1] if "@" in url else url.partition("://")[2]
    return RedisBackend(client, "redis://" + shown)
