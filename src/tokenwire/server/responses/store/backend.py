"""What every store backend keeps, and the bounds it keeps it within.

A backend keeps ``Record``s: *roots* (a response, a conversation) and the *items* of a root (a
conversation's items, in order). Each record is owned by an API key (its id; ``""`` when the
server requires none) and costs its size in bytes: everything kept is counted, the whole stored
JSON. Writes evict past the bounds (``Limits``): an owner over its own share loses its oldest
roots first; past the total, the owner holding the most loses its oldest. A root that is *running*
(a background response, in ``runs``) is never evicted. Roots expire ``ttl`` seconds after their
last write.

Backends are synchronous objects (SQL through the standard library's ``sqlite3`` or
``psycopg``, Redis through ``redis``): ``Store`` runs every call in one thread of its own, off
the event loop."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["STALE_RUN", "Backend", "Limits", "Record", "Run", "StoreUnavailable"]

#: Seconds after which a run whose worker stopped renewing it is forgotten by a sweep (its
#: worker died; the response reads as failed).
STALE_RUN = 120.0


class StoreUnavailable(Exception):
    """The store cannot be reached or used (its reason in the message)."""


@dataclass(frozen=True)
class Limits:
    """How much a store keeps."""

    #: Most roots (responses and conversations), all owners together.
    max_roots: int = 1024
    #: Most bytes, all owners together.
    max_bytes: int = 256 << 20
    #: Most bytes one owner (API key) keeps.
    max_owner_bytes: int = 256 << 20
    #: Seconds a root is kept after its last write (None: until evicted).
    ttl: float | None = None

    @property
    def max_record_bytes(self) -> int:
        """The largest record kept: an eighth of an owner's share (one request cannot flush
        everything the owner keeps)."""
        return max(1, min(self.max_owner_bytes, self.max_bytes) // 8)


@dataclass
class Record:
    """One kept record."""

    id: str
    #: ``response``, ``conversation`` or ``item``.
    kind: str
    owner: str
    #: The root it belongs to (its own id for a root).
    root: str
    data: bytes
    #: Its order among its root's items (0 for a root).
    seq: int = 0
    created: float = 0.0
    #: When it expires (roots only; None: never).
    expires: float | None = None

    @property
    def size(self) -> int:
        return len(self.data) + len(self.id) + len(self.owner) + len(self.root) + len(self.kind)

    @property
    def is_root(self) -> bool:
        return self.id == self.root


@dataclass(frozen=True)
class Run:
    """A background response running in some worker."""

    id: str
    #: The worker (process) running it.
    worker: str
    #: When that worker last said it still runs it.
    beat: float
    #: Whether a cancel has been asked for.
    cancel: bool


class Backend:
    """The operations every backend provides (synchronous; one thread calls them)."""

    #: What ``--responses-store`` names it (in logs).
    url: str = ""

    def put(self, records: list[Record], limits: Limits, now: float) -> list[str]:
        """Keep ``records`` (each inserted or replacing the record of its id; an item gets the
        next ``seq`` of its root when its ``seq`` is 0), refresh their roots' expiry, then evict
        past ``limits`` (never these records' roots, never a running root). Returns the ids
        of the roots evicted."""
        raise NotImplementedError

    def get(self, rid: str, now: float) -> Record | None:
        """The record ``rid`` (None when none is kept, or its root has expired)."""
        raise NotImplementedError

    def items(
        self, root: str, now: float, *, after: int | None, limit: int, descending: bool
    ) -> list[Record]:
        """Up to ``limit`` items of ``root`` in ``seq`` order (or reversed), past ``seq``
        ``after`` in that order."""
        raise NotImplementedError

    def delete(self, rid: str) -> bool:
        """Forget record ``rid`` (a root with its items). Whether it was kept."""
        raise NotImplementedError

    def usage(self, owner: str | None = None) -> tuple[int, int]:
        """Bytes and roots kept (by ``owner``, or all)."""
        raise NotImplementedError

    def sweep(self, now: float) -> int:
        """Forget the roots expired by ``now`` (not running ones), and the runs of workers that
        died. How many roots."""
        raise NotImplementedError

    def reset(self) -> None:
        """After a failure: reconnect, when the backend holds a connection that can break."""

    # ---- background responses ----------------------------------------------------------------

    def run_start(self, rid: str, worker: str, now: float) -> None:
        raise NotImplementedError

    def run_end(self, rid: str) -> None:
        raise NotImplementedError

    def run_get(self, rid: str) -> Run | None:
        raise NotImplementedError

    def run_cancel(self, rid: str) -> bool:
        """Ask for ``rid``'s cancel. Whether it runs."""
        raise NotImplementedError

    def run_beat(self, worker: str, now: float) -> list[str]:
        """``worker`` still runs its runs (their beat refreshed); the ids of those asked to
        cancel."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
