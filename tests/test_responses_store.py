"""The Responses store's backends (SQLite in memory and in a file, PostgreSQL, Redis: real
servers of the run's own), each through the same ``Store``: records per API key, everything
kept counted, eviction (an owner over its share loses its own oldest; past the total, the owner
keeping the most), running background responses never evicted, expiry, the runs any worker reads
and cancels; and a whole server over PostgreSQL and over Redis."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
import threading
import time

import openai
import pytest

from services import postgres_server, redis_server
from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.server.config import ResponsesConfig
from tokenwire.server.responses.store import (
    Limits,
    NotFoundError,
    Store,
    StoreUnavailable,
    needs,
    open_backend,
)

from api_echo import FEATURES
from served import MODEL, serve


@pytest.fixture(scope="module")
def pg_url():
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


@pytest.fixture(params=["sqlite-memory", "sqlite-file", "postgresql", "redis"])
def store_url(request, tmp_path):
    if request.param == "sqlite-memory":
        return "sqlite://"
    if request.param == "sqlite-file":
        return f"sqlite:///{tmp_path}/store.sqlite3"
    url = request.getfixturevalue("pg_url" if request.param == "postgresql" else "redis_url")
    backend = open_backend(url)  # (a clean slate: the servers are shared by the module)
    if request.param == "postgresql":
        with backend.conn.cursor() as cur:
            cur.execute("TRUNCATE tw_records, tw_usage, tw_runs")
    else:
        backend.r.flushdb()
    backend.close()
    return url


def run(coro):
    return asyncio.run(coro)


def test_records_per_key_eviction_runs_and_expiry(store_url):
    async def go() -> None:
        limits = Limits(max_roots=6, max_bytes=6000, max_owner_bytes=3500, ttl=None)
        s = Store(open_backend(store_url), limits)
        try:
            await s.put_response("b1", "B", {"x": "b" * 400})
            await s.put_response("a0", "A", {"x": "a" * 400})
            await s.run_start("a0")  # A's running background response
            for k in range(1, 12):
                await s.put_response(f"a{k}", "A", {"x": "a" * 400})
            a_bytes, _ = await s.usage("A")
            assert a_bytes <= 3500 + 500  # (over its share, A lost its own oldest...)
            assert (await s.response("a0", "A"))["x"]  # ... never its running one
            assert (await s.response("a11", "A"))["x"]
            with pytest.raises(NotFoundError):
                await s.response("a1", "A")
            assert (await s.response("b1", "B"))["x"] == "b" * 400  # B keeps what it kept
            with pytest.raises(NotFoundError):
                await s.response("b1", "A")  # and only B reads it
            total, roots = await s.usage()
            assert total <= 6000 + 500 and roots <= 6
            # Past the total, the owner keeping the most goes first: a new owner's entries
            # evict A's, not B's.
            for k in range(6):
                await s.put_response(f"c{k}", "C", {"x": "c" * 300})
            assert (await s.response("b1", "B"))["x"]
            assert (await s.usage())[1] <= 6
            # Runs: any worker reads and cancels; the running worker's beat picks it up.
            run_ = await s.run("a0")
            assert run_ is not None and run_.worker == s.worker and not run_.cancel
            other = Store(open_backend(store_url), limits, worker="other")
            if store_url != "sqlite://":  # (in memory: this process only)
                assert await other.run_cancel("a0")
                assert await s.beat() == ["a0"]
            await other.close()
            await s.run_end("a0")
            assert await s.run("a0") is None
            # Conversations: items in order, pages, one item, delete.
            await s.put_conversation("conv", "B", {"id": "conv"}, [{"id": "i1"}, {"id": "i2"}])
            await s.add_items("conv", "B", [{"id": "i3"}])
            page, more = await s.items("conv", "B", limit=2)
            assert [i["id"] for i in page] == ["i1", "i2"] and more
            page, more = await s.items("conv", "B", after="i2")
            assert [i["id"] for i in page] == ["i3"] and not more
            page, _ = await s.items("conv", "B", descending=True, limit=1)
            assert page == [{"id": "i3"}]
            assert await s.item("conv", "i2", "B") == {"id": "i2"}
            await s.delete_item("conv", "i2", "B")
            assert [i["id"] for i in await s.all_items("conv", "B")] == ["i1", "i3"]
            with pytest.raises(NotFoundError):
                await s.items("conv", "A")
            await s.delete("conv", "B", "conversation")
            with pytest.raises(NotFoundError):
                await s.conversation("conv", "B")
            # The chain a previous_response_id continues.
            await s.put_response("p1", "B", {"response": {"id": "p1"}})
            await s.put_response(
                "p2", "B", {"response": {"id": "p2", "previous_response_id": "p1"}}
            )
            assert [d["response"]["id"] for d in await s.chain("p2", "B")] == ["p1", "p2"]
            with pytest.raises(NotFoundError):
                await s.chain("p2", "A")
        finally:
            await s.close()

    run(go())


def test_expired_records_are_gone_and_swept(store_url):
    async def go() -> None:
        s = Store(open_backend(store_url), Limits(ttl=0.3))
        try:
            await s.put_response("old", "", {"x": 1})
            await s.put_conversation("c", "", {"id": "c"}, [{"id": "i"}])
            assert await s.response("old", "")
            await asyncio.sleep(0.5)
            with pytest.raises(NotFoundError):
                await s.response("old", "")
            with pytest.raises(NotFoundError):
                await s.item("c", "i", "")
            assert await s.sweep() == 2
            assert await s.usage() == (0, 0)
        finally:
            await s.close()

    run(go())


def test_store_urls_name_what_they_need():
    assert needs("sqlite:///x") is None and needs("sqlite://") is None
    assert "store URL" in needs("mysql://x")
    assert "store URL" in needs("just-a-path")
    with pytest.raises(StoreUnavailable):
        open_backend("nope://x")
    folder = tempfile.mkdtemp()
    os.chmod(folder, 0o500)
    if os.geteuid() != 0:  # (root writes anywhere)
        with pytest.raises(StoreUnavailable):
            open_backend(f"sqlite:///{folder}/sub/x.sqlite3")


def test_a_new_sqlite_store_opens_while_another_connection_writes_it(tmp_path):
    # Two API servers open one new store at once: while one holds the write lock (creating its
    # tables), SQLite refuses the other's switch to WAL at once, without its busy wait; the
    # second must wait for the lock, not fail its server's startup.
    path = str(tmp_path / "store.sqlite3")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("CREATE TABLE held (a)")
    releaser = threading.Timer(0.3, other.execute, ("COMMIT",))
    releaser.start()
    started = time.monotonic()
    try:
        backend = open_backend(f"sqlite:///{path}")
    finally:
        releaser.join()
        other.close()
    assert time.monotonic() - started >= 0.25  # (it waited for the lock)
    assert backend.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    backend.close()


@pytest.mark.parametrize("which", ["postgresql", "redis"])
def test_a_server_over_a_shared_store(which, request):
    url = request.getfixturevalue("pg_url" if which == "postgresql" else "redis_url")
    cfg = ResponsesConfig(store=url)
    with (
        serve(
            SyntheticConfig(output="echo", step_time=0.02), features=FEATURES, responses=cfg
        ) as one,
        serve(SyntheticConfig(output="echo"), features=FEATURES, responses=cfg) as two,
    ):
        a = openai.OpenAI(base_url=one.url + "/v1", api_key="none", max_retries=0)
        b = openai.OpenAI(base_url=two.url + "/v1", api_key="none", max_retries=0)
        conv = a.conversations.create(items=[{"role": "user", "content": "first"}])
        r = b.responses.create(model=MODEL, input="second", conversation=conv.id)
        assert r.output_text == "second"
        items = a.conversations.items.list(conv.id, order="asc")
        assert [i.type for i in items.data] == ["message", "message", "message"]
        with pytest.raises(openai.BadRequestError):  # (a response in a conversation goes on there)
            a.responses.create(model=MODEL, input="third", previous_response_id=r.id)
        first = b.responses.create(model=MODEL, input="one")
        nxt = a.responses.create(model=MODEL, input="two", previous_response_id=first.id)
        assert b.responses.retrieve(nxt.id).output_text == "two"
        listed = b.responses.input_items.list(nxt.id, order="asc")
        assert [i.type for i in listed.data] == ["message", "message", "message"]
        # A background response running in one instance, read and cancelled through the other.
        words = " ".join(f"w{k}" for k in range(400))
        bg = a.responses.create(model=MODEL, input=words, background=True)
        deadline = time.monotonic() + 10
        while b.responses.retrieve(bg.id).status != "in_progress":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        cancelled = b.responses.cancel(bg.id)
        assert cancelled.status == "cancelled"
        assert a.responses.retrieve(bg.id).status == "cancelled"


def test_the_flags(monkeypatch, tmp_path):
    import importlib.util

    from tokenwire.entrypoints.cli import build_parser
    from tokenwire.entrypoints.options import server

    parse = build_parser().parse_args
    cfg = server.responses_config(parse(["serve"]))
    assert cfg.store.startswith("sqlite:///") and cfg.store.endswith("responses.sqlite3")
    assert cfg.max_key_bytes == cfg.max_bytes and cfg.ttl == 30 * 24 * 3600
    args = parse(
        [
            "serve",
            "--responses-store",
            f"sqlite:///{tmp_path}/x.sqlite3",
            "--responses-store-bytes",
            "1000",
            "--responses-store-key-bytes",
            "100",
            "--responses-ttl",
            "0",
            "--max-background-responses",
            "3",
            "--mcp-allowed-urls",
            "http://a,http://b",
            "--mcp-timeout",
            "2.5",
            "--mcp-max-rounds",
            "2",
        ]
    )
    cfg = server.responses_config(args)
    assert (cfg.max_bytes, cfg.max_key_bytes, cfg.ttl, cfg.max_background) == (1000, 100, None, 3)
    assert cfg.mcp_allowed_urls == ("http://a", "http://b") and cfg.mcp_timeout == 2.5
    with pytest.raises(SystemExit, match="no store URL"):
        server.responses_config(parse(["serve", "--responses-store", "mysql://x"]))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "psycopg" else real(name)
    )
    with pytest.raises(SystemExit, match=r"tokenwire\[stores\]"):
        server.responses_config(parse(["serve", "--responses-store", "postgresql://h/db"]))
