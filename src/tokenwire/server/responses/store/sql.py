"""The SQL backends: SQLite (the standard library's ``sqlite3``; a file every worker on the machine
opens, in WAL mode) and PostgreSQL (``psycopg``, the ``tokenwire[stores]`` extra; several
machines). One schema: ``tw_records`` (roots and items), ``tw_usage`` (bytes and roots per
owner, kept in the same transaction as the records) and ``tw_runs`` (background responses
running). Writes are serialized across processes (SQLite's ``BEGIN IMMEDIATE``, a PostgreSQL
transaction-level advisory lock), so the bounds hold whatever the number of workers."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

from tokenwire.server.responses.store.backend import (
    STALE_RUN,
    Backend,
    Limits,
    Record,
    Run,
    StoreUnavailable,
)

__all__ = ["SqlBackend", "postgres_backend", "sqlite_backend"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tw_records (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    owner TEXT NOT NULL,
    root TEXT NOT NULL,
    seq BIGINT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    expires DOUBLE PRECISION,
    size BIGINT NOT NULL,
    data {blob} NOT NULL
);
CREATE INDEX IF NOT EXISTS tw_records_root ON tw_records (root, seq);
CREATE INDEX IF NOT EXISTS tw_records_owner ON tw_records (owner, created);
CREATE INDEX IF NOT EXISTS tw_records_expires ON tw_records (expires);
CREATE TABLE IF NOT EXISTS tw_usage (
    owner TEXT PRIMARY KEY,
    bytes BIGINT NOT NULL,
    roots BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS tw_runs (
    id TEXT PRIMARY KEY,
    worker TEXT NOT NULL,
    beat DOUBLE PRECISION NOT NULL,
    cancel INTEGER NOT NULL DEFAULT 0
);
"""

_COLUMNS = "id, kind, owner, root, seq, created, expires, data"
#: A root that may be evicted: not running, not one being written.
_EVICTABLE = "r.id = r.root AND r.id NOT IN (SELECT id FROM tw_runs)"


def _record(row: Any) -> Record:
    rid, kind, owner, root, seq, created, expires, data = row
    return Record(rid, kind, owner, root, bytes(data), seq, created, expires)


class SqlBackend(Backend):
    """A store in one SQL database (``sqlite3`` or ``psycopg`` connection)."""

    def __init__(self, conn: Any, url: str, *, postgres: bool, connect: Any = None) -> None:
        self.conn = conn
        self.url = url
        self.postgres = postgres
        self._connect = connect
        self._mark = "%s" if postgres else "?"
        with self._write() as cur:
            for statement in _SCHEMA.format(blob="BYTEA" if postgres else "BLOB").split(";"):
                if statement.strip():
                    cur.execute(statement)

    # ---- plumbing ------------------------------------------------------------------------------

    def _q(self, sql: str) -> str:
        return sql.replace("?", self._mark) if self.postgres else sql

    @contextlib.contextmanager
    def _write(self) -> Iterator[Any]:
        """A write transaction, serialized across every process using the store."""
        cur = self.conn.cursor()
        try:
            if self.postgres:
                cur.execute("BEGIN")
                cur.execute("SELECT pg_advisory_xact_lock(7746723)")
            else:
                cur.execute("BEGIN IMMEDIATE")
            yield cur
            cur.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):
                cur.execute("ROLLBACK")
            raise
        finally:
            cur.close()

    def _read(self, sql: str, args: tuple = ()) -> list[Any]:
        cur = self.conn.cursor()
        try:
            cur.execute(self._q(sql), args)
            return cur.fetchall()
        finally:
            cur.close()

    def _ex(self, cur: Any, sql: str, args: tuple = ()) -> Any:
        cur.execute(self._q(sql), args)
        return cur

    def _account(self, cur: Any, owner: str, nbytes: int, roots: int) -> None:
        self._ex(
            cur,
            "INSERT INTO tw_usage (owner, bytes, roots) VALUES (?, ?, ?) ON CONFLICT (owner) DO "
            "UPDATE SET bytes = tw_usage.bytes + excluded.bytes, "
            "roots = tw_usage.roots + excluded.roots",
            (owner, nbytes, roots),
        )

    def _drop_root(self, cur: Any, root: str) -> None:
        rows = self._ex(
            cur, "SELECT owner, size, id = root FROM tw_records WHERE root = ?", (root,)
        ).fetchall()
        if not rows:
            return
        self._ex(cur, "DELETE FROM tw_records WHERE root = ?", (root,))
        self._ex(cur, "DELETE FROM tw_runs WHERE id = ?", (root,))
        owner = rows[0][0]
        self._account(cur, owner, -sum(r[1] for r in rows), -sum(1 for r in rows if r[2]))

    # ---- Backend -------------------------------------------------------------------------------

    def put(self, records: list[Record], limits: Limits, now: float) -> list[str]:
        if not records:
            return []
        expires = now + limits.ttl if limits.ttl else None
        roots = {r.root for r in records}
        with self._write() as cur:
            for rec in records:
                old = self._ex(
                    cur, "SELECT size, owner FROM tw_records WHERE id = ?", (rec.id,)
                ).fetchone()
                if old is None and not rec.is_root:
                    parent = self._ex(
                        cur, "SELECT 1 FROM tw_records WHERE id = ?", (rec.root,)
                    ).fetchone()
                    if parent is None:  # (its root is gone: evicted, expired or deleted)
                        continue
                if not rec.is_root and rec.seq == 0:
                    top = self._ex(
                        cur, "SELECT MAX(seq) FROM tw_records WHERE root = ?", (rec.root,)
                    ).fetchone()
                    rec.seq = (top[0] or 0) + 1
                self._ex(
                    cur,
                    f"INSERT INTO tw_records ({_COLUMNS}, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (id) DO UPDATE SET data = excluded.data, size = excluded.size, "
                    "expires = excluded.expires",
                    (
                        rec.id,
                        rec.kind,
                        rec.owner,
                        rec.root,
                        rec.seq,
                        rec.created or now,
                        expires if rec.is_root else None,
                        rec.data,
                        rec.size,
                    ),
                )
                if old is None:
                    self._account(cur, rec.owner, rec.size, 1 if rec.is_root else 0)
                else:
                    self._account(cur, old[1], rec.size - old[0], 0)
            for root in roots:
                self._ex(cur, "UPDATE tw_records SET expires = ? WHERE id = ?", (expires, root))
            return self._evict(cur, limits, roots, {r.owner for r in records})

    def _evict(self, cur: Any, limits: Limits, keep: set[str], owners: set[str]) -> list[str]:
        evicted: list[str] = []
        spare = tuple(keep)
        holes = ", ".join("?" * len(spare))
        for owner in owners:
            while True:
                row = self._ex(cur, "SELECT bytes FROM tw_usage WHERE owner = ?", (owner,))
                used = (row.fetchone() or (0,))[0]
                if used <= limits.max_owner_bytes:
                    break
                victim = self._ex(
                    cur,
                    f"SELECT r.id FROM tw_records r WHERE r.owner = ? AND {_EVICTABLE} AND "
                    f"r.id NOT IN ({holes}) ORDER BY r.created LIMIT 1",
                    (owner, *spare),
                ).fetchone()
                if victim is None:
                    break
                self._drop_root(cur, victim[0])
                evicted.append(victim[0])
        while True:
            nbytes, nroots = self._ex(
                cur, "SELECT COALESCE(SUM(bytes), 0), COALESCE(SUM(roots), 0) FROM tw_usage"
            ).fetchone()
            if nbytes <= limits.max_bytes and nroots <= limits.max_roots:
                break
            heaviest = "u.bytes" if nbytes > limits.max_bytes else "u.roots"
            victim = self._ex(
                cur,
                f"SELECT r.id FROM tw_records r JOIN tw_usage u ON u.owner = r.owner WHERE "
                f"{_EVICTABLE} AND r.id NOT IN ({holes}) ORDER BY {heaviest} DESC, r.created "
                "LIMIT 1",
                spare,
            ).fetchone()
            if victim is None:
                break
            self._drop_root(cur, victim[0])
            evicted.append(victim[0])
        self._ex(cur, "DELETE FROM tw_usage WHERE bytes <= 0 AND roots <= 0")
        return evicted

    def get(self, rid: str, now: float) -> Record | None:
        rows = self._read(
            f"SELECT {', '.join('r.' + c.strip() for c in _COLUMNS.split(','))}, p.expires "
            "FROM tw_records r JOIN tw_records p ON p.id = r.root WHERE r.id = ?",
            (rid,),
        )
        if not rows:
            return None
        *row, expires = rows[0]
        if expires is not None and expires <= now:
            return None
        return _record(row)

    def items(
        self, root: str, now: float, *, after: int | None, limit: int, descending: bool
    ) -> list[Record]:
        order = "DESC" if descending else "ASC"
        where = "root = ? AND id <> root"
        args: tuple = (root,)
        if after is not None:
            where += " AND seq < ?" if descending else " AND seq > ?"
            args += (after,)
        rows = self._read(
            f"SELECT {_COLUMNS} FROM tw_records WHERE {where} ORDER BY seq {order} LIMIT ?",
            (*args, limit),
        )
        return [_record(r) for r in rows]

    def delete(self, rid: str) -> bool:
        with self._write() as cur:
            row = self._ex(
                cur, "SELECT root, owner, size FROM tw_records WHERE id = ?", (rid,)
            ).fetchone()
            if row is None:
                return False
            root, owner, size = row
            if root == rid:
                self._drop_root(cur, rid)
            else:
                self._ex(cur, "DELETE FROM tw_records WHERE id = ?", (rid,))
                self._account(cur, owner, -size, 0)
            return True

    def usage(self, owner: str | None = None) -> tuple[int, int]:
        if owner is None:
            rows = self._read(
                "SELECT COALESCE(SUM(bytes), 0), COALESCE(SUM(roots), 0) FROM tw_usage"
            )
        else:
            rows = self._read("SELECT bytes, roots FROM tw_usage WHERE owner = ?", (owner,))
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    def reset(self) -> None:
        """After a failure: a new connection (PostgreSQL; a server restarted drops it)."""
        if self._connect is None:
            return
        with contextlib.suppress(Exception):
            self.conn.close()
        with contextlib.suppress(Exception):
            self.conn = self._connect()

    def sweep(self, now: float) -> int:
        with self._write() as cur:
            # (runs whose worker stopped beating long ago: it died; they read as failed)
            self._ex(cur, "DELETE FROM tw_runs WHERE beat < ?", (now - STALE_RUN,))
            gone = self._ex(
                cur,
                f"SELECT r.id FROM tw_records r WHERE {_EVICTABLE} AND r.expires IS NOT NULL "
                "AND r.expires <= ? LIMIT 1000",
                (now,),
            ).fetchall()
            for (rid,) in gone:
                self._drop_root(cur, rid)
            return len(gone)

    def run_start(self, rid: str, worker: str, now: float) -> None:
        with self._write() as cur:
            self._ex(
                cur,
                "INSERT INTO tw_runs (id, worker, beat, cancel) VALUES (?, ?, ?, 0) "
                "ON CONFLICT (id) DO UPDATE SET worker = excluded.worker, beat = excluded.beat",
                (rid, worker, now),
            )

    def run_end(self, rid: str) -> None:
        with self._write() as cur:
            self._ex(cur, "DELETE FROM tw_runs WHERE id = ?", (rid,))

    def run_get(self, rid: str) -> Run | None:
        rows = self._read("SELECT id, worker, beat, cancel FROM tw_runs WHERE id = ?", (rid,))
        if not rows:
            return None
        r = rows[0]
        return Run(r[0], r[1], r[2], bool(r[3]))

    def run_cancel(self, rid: str) -> bool:
        with self._write() as cur:
            return self._ex(cur, "UPDATE tw_runs SET cancel = 1 WHERE id = ?", (rid,)).rowcount > 0

    def run_beat(self, worker: str, now: float) -> list[str]:
        with self._write() as cur:
            self._ex(cur, "UPDATE tw_runs SET beat = ? WHERE worker = ?", (now, worker))
            rows = self._ex(
                cur, "SELECT id FROM tw_runs WHERE worker = ? AND cancel = 1", (worker,)
            ).fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


#: How long a SQLite statement waits for another process's lock before "database is locked".
_SQLITE_BUSY_S = 30.0


def _wal(conn: sqlite3.Connection) -> None:
    """Switch ``conn``'s database to write-ahead logging, waiting out other processes.

    SQLite answers the switch "database is locked" at once, without its busy wait, while another
    connection holds a write lock: two API servers opening one new store at once (the other
    creating its tables) would otherwise fail one server's startup."""
    deadline = time.monotonic() + _SQLITE_BUSY_S
    pause = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def sqlite_backend(path: str) -> SqlBackend:
    """A SQLite store in file ``path`` (its folder made), or in memory for ``:memory:``."""
    if path != ":memory:":
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot make the store's folder {folder}: {exc}") from None
    try:
        conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=_SQLITE_BUSY_S
        )
        if path != ":memory:":
            _wal(conn)
        conn.execute("PRAGMA synchronous=NORMAL")
        return SqlBackend(conn, "sqlite:///" + path, postgres=False)
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot open the SQLite store {path}: {exc}") from None


def postgres_backend(url: str) -> SqlBackend:
    """A PostgreSQL store at ``url`` (``postgresql://...``; needs ``tokenwire[stores]``)."""
    try:
        import psycopg
    except ImportError:
        raise StoreUnavailable(
            "a postgresql:// responses store needs psycopg: pip install 'tokenwire[stores]'"
        ) from None
    try:

        def connect() -> Any:
            return psycopg.connect(url, connect_timeout=10, autocommit=True)

        return SqlBackend(connect(), _redacted(url), postgres=True, connect=connect)
    except psycopg.Error as exc:
        raise StoreUnavailable(
            f"cannot open the PostgreSQL store {_redacted(url)}: {exc}"
        ) from None


def _redacted(url: str) -> str:
    """``url`` without its password (for logs and errors)."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at:
        return url
    user = creds.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}"
