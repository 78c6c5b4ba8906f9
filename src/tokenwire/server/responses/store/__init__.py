"""Where the Responses API keeps responses, conversations and their items: one ``Store`` over a
backend named by a URL (``--responses-store``):

- ``sqlite:///PATH`` (the default: a file under the user's data directory; every
  ``--api-server-count`` worker on the machine opens it), or ``sqlite://`` in memory (one
  process; what ``ServerConfig`` defaults to);
- ``postgresql://...`` and ``redis://...`` for several machines (``pip install
  'tokenwire[stores]'``).

What one API key stores, only that key reads (``owner``: the key's id, ``""`` when the server
requires no key); anything else is a 404, as a missing record is. ``Store`` is the async face:
every backend call runs in one thread of its own, so a slow disk or database never holds the
event loop."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from tokenwire.messages.errors import TokenwireError
from tokenwire.server.responses.store.backend import (
    Backend,
    Limits,
    Record,
    Run,
    StoreUnavailable,
)

__all__ = [
    "Backend",
    "Limits",
    "NotFoundError",
    "Record",
    "Run",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "default_url",
    "needs",
    "open_backend",
]

log = logging.getLogger("tokenwire.server")

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()


class NotFoundError(TokenwireError):
    """No such record is kept for this key (404, OpenAI's shape)."""

    status = 404
    prefix = "not found"
    error_type = "invalid_request_error"


class StoreError(TokenwireError):
    """The store failed (503: the request may be retried)."""

    status = 503
    prefix = "store unavailable"
    error_type = "server_error"


def default_url() -> str:
    """``sqlite:///`` a file under the user's data directory (``$XDG_DATA_HOME/tokenwire``,
    else ``~/.local/share/tokenwire``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return "sqlite:///" + os.path.join(base, "tokenwire", "responses.sqlite3")


def needs(url: str) -> str | None:
    """Why store ``url`` cannot work here (a scheme this server does not know, a driver that is
    not installed), or None; nothing is opened."""
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("sqlite", "postgresql", "postgres", "redis", "rediss", "unix"):
        return f"{url[:100]!r} is no store URL (sqlite:///PATH, postgresql://..., redis://...)"
    module = {"postgresql": "psycopg", "postgres": "psycopg"}.get(scheme)
    if scheme in ("redis", "rediss", "unix"):
        module = "redis"
    if module is not None:
        import importlib.util

        if importlib.util.find_spec(module) is None:
            return f"{scheme}:// needs the {module} package: pip install 'tokenwire[stores]'"
    return None


def open_backend(url: str) -> Backend:
    """The backend ``url`` names (``StoreUnavailable`` with the reason when it cannot be
    opened, or needs a package that is not installed)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise StoreUnavailable(
            f"--responses-store must be a URL (sqlite:///PATH, postgresql://..., redis://...), "
            f"got {url!r}"
        )
    scheme = scheme.lower()
    if scheme == "sqlite":
        from tokenwire.server.responses.store.sql import sqlite_backend

        # sqlite:///relative, sqlite:////absolute (SQLAlchemy's spelling); sqlite:// in memory
        path = rest[1:] if rest.startswith("/") else rest
        return sqlite_backend(path or ":memory:")
    if scheme in ("postgresql", "postgres"):
        from tokenwire.server.responses.store.sql import postgres_backend

        return postgres_backend(url)
    if scheme in ("redis", "rediss", "unix"):
        from tokenwire.server.responses.store.redis_store import redis_backend

        return redis_backend(url)
    raise StoreUnavailable(
        f"--responses-store: unknown scheme {scheme!r} (sqlite, postgresql, redis)"
    )


def _logged(fut: Any) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("the responses store failed: %s", fut.exception())


def _item_key(root: str, item_id: str) -> str:
    """An item's record id: its root's and its own (one item may be in several roots)."""
    return f"{root}/{item_id}"


class Store:
    """Responses, conversations and conversation items, per owner, in one backend."""

    def __init__(self, backend: Backend, limits: Limits, worker: str = "") -> None:
        self.backend = backend
        self.limits = limits
        #: This process, as the runs it holds name it.
        self.worker = worker or f"{os.getpid()}-{os.urandom(4).hex()}"
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokenwire-store")

    @property
    def url(self) -> str:
        return self.backend.url

    async def _call(self, fn: Any, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, fn, *args)
        except TokenwireError:
            raise
        except Exception as exc:
            log.exception("the responses store (%s) failed", self.backend.url)
            loop.run_in_executor(self._pool, self.backend.reset)  # (the next call reconnects)
            raise StoreError(f"the responses store failed: {type(exc).__name__}") from None

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self.backend.close)
        self._pool.shutdown(wait=False)

    # ---- records -------------------------------------------------------------------------------

    async def _put(self, records: list[Record]) -> None:
        evicted = await self._call(self.backend.put, records, self.limits, time.time())
        if evicted:
            log.debug("responses store: evicted %d", len(evicted))

    async def _get(self, rid: str, owner: str, kind: str) -> Record | None:
        rec = await self._call(self.backend.get, rid, time.time())
        if rec is None or rec.owner != owner or rec.kind != kind:
            return None
        return rec

    def too_large(self, size: int) -> bool:
        """Whether a record of ``size`` bytes is past what one record may take."""
        return size > self.limits.max_record_bytes

    # ---- responses -----------------------------------------------------------------------------

    async def put_response(self, rid: str, owner: str, doc: dict[str, Any]) -> None:
        """Keep (or replace) response ``rid``'s document: its object, its input items and what it
        continues."""
        await self._put([Record(rid, "response", owner, rid, _json.encode(doc))])

    async def response(self, rid: str, owner: str, what: str = "Response") -> dict[str, Any]:
        """Response ``rid``'s document (a 404 naming ``what`` when none is kept for ``owner``)."""
        rec = await self._get(rid, owner, "response")
        if rec is None:
            raise NotFoundError(f"{what} with id '{rid[:80]}' not found.")
        return _decode.decode(rec.data)

    def put_response_soon(self, rid: str, owner: str, doc: dict[str, Any]) -> asyncio.Future[Any]:
        """``put_response`` submitted at once (so every later call of this process sees it),
        from code that cannot wait for it."""
        loop = asyncio.get_running_loop()
        record = Record(rid, "response", owner, rid, _json.encode(doc))
        fut = loop.run_in_executor(self._pool, self.backend.put, [record], self.limits, time.time())
        fut.add_done_callback(_logged)
        return fut

    async def chain(self, rid: str, owner: str) -> list[dict[str, Any]]:
        """The documents of response ``rid`` and of every response it continues, oldest first
        (a 404 when it, or one it continues, is not kept)."""

        def walk() -> list[dict[str, Any]]:
            docs: list[dict[str, Any]] = []
            at: str | None = rid
            now = time.time()
            while at is not None and len(docs) <= self.limits.max_roots:
                rec = self.backend.get(at, now)
                if rec is None or rec.owner != owner or rec.kind != "response":
                    detail = f"Previous response with id '{at[:80]}' not found."
                    if docs:
                        detail += f" (it is continued by '{docs[-1]['response']['id'][:80]}')"
                    raise NotFoundError(detail, param="previous_response_id")
                doc = _decode.decode(rec.data)
                docs.append(doc)
                at = doc["response"].get("previous_response_id")
            return docs[::-1]

        return await self._call(walk)

    async def delete(self, rid: str, owner: str, kind: str = "response") -> None:
        """Forget root ``rid`` (a 404 when none is kept for ``owner``)."""
        rec = await self._get(rid, owner, kind)
        if rec is None or not await self._call(self.backend.delete, rid):
            noun = "Conversation" if kind == "conversation" else "Response"
            raise NotFoundError(f"{noun} with id '{rid[:80]}' not found.")

    # ---- conversations -------------------------------------------------------------------------

    async def put_conversation(
        self, cid: str, owner: str, obj: dict[str, Any], items: list[dict[str, Any]] = ()
    ) -> None:
        """Keep conversation ``cid`` (its object), with ``items`` appended in order."""
        records = [Record(cid, "conversation", owner, cid, _json.encode(obj))]
        records += [
            Record(_item_key(cid, item["id"]), "item", owner, cid, _json.encode(item))
            for item in items
        ]
        await self._put(records)

    async def conversation(self, cid: str, owner: str) -> dict[str, Any]:
        rec = await self._get(cid, owner, "conversation")
        if rec is None:
            raise NotFoundError(f"Conversation with id '{cid[:80]}' not found.")
        return _decode.decode(rec.data)

    async def add_items(self, cid: str, owner: str, items: list[dict[str, Any]]) -> None:
        """Append ``items`` to conversation ``cid`` (a 404 when none is kept for ``owner``)."""
        await self.conversation(cid, owner)
        records = [
            Record(_item_key(cid, item["id"]), "item", owner, cid, _json.encode(item))
            for item in items
        ]
        await self._put(records)

    async def items(
        self,
        cid: str,
        owner: str,
        *,
        after: str | None = None,
        limit: int = 100,
        descending: bool = False,
    ) -> tuple[list[dict[str, Any]], bool]:
        """Conversation ``cid``'s items in order (or newest first), past item ``after``: up to
        ``limit`` of them, and whether there are more."""
        await self.conversation(cid, owner)
        seq = None
        if after is not None:
            rec = await self._get(_item_key(cid, after), owner, "item")
            if rec is None:
                raise NotFoundError(f"Item with id '{after[:80]}' not found.", param="after")
            seq = rec.seq
        recs = await self._call(
            lambda: self.backend.items(
                cid, time.time(), after=seq, limit=limit + 1, descending=descending
            )
        )
        return [_decode.decode(r.data) for r in recs[:limit]], len(recs) > limit

    async def all_items(self, cid: str, owner: str) -> list[dict[str, Any]]:
        """Every item of conversation ``cid``, oldest first."""
        out: list[dict[str, Any]] = []
        after = None
        while True:
            page, more = await self.items(cid, owner, after=after, limit=1000)
            out += page
            if not more:
                return out
            after = page[-1]["id"]

    async def item(self, cid: str, item_id: str, owner: str) -> dict[str, Any]:
        await self.conversation(cid, owner)
        rec = await self._get(_item_key(cid, item_id), owner, "item")
        if rec is None:
            raise NotFoundError(f"Item with id '{item_id[:80]}' not found.")
        return _decode.decode(rec.data)

    async def delete_item(self, cid: str, item_id: str, owner: str) -> None:
        await self.item(cid, item_id, owner)
        await self._call(self.backend.delete, _item_key(cid, item_id))

    # ---- background responses ------------------------------------------------------------------

    async def run_start(self, rid: str) -> None:
        await self._call(self.backend.run_start, rid, self.worker, time.time())

    async def run_end(self, rid: str) -> None:
        await self._call(self.backend.run_end, rid)

    async def run(self, rid: str) -> Run | None:
        return await self._call(self.backend.run_get, rid)

    async def run_cancel(self, rid: str) -> bool:
        return await self._call(self.backend.run_cancel, rid)

    async def beat(self) -> list[str]:
        """This worker still runs its background responses; those asked to cancel."""
        return await self._call(self.backend.run_beat, self.worker, time.time())

    async def sweep(self) -> int:
        return await self._call(self.backend.sweep, time.time())

    async def usage(self, owner: str | None = None) -> tuple[int, int]:
        return await self._call(self.backend.usage, owner)
