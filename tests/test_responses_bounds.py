"""What one client of the Responses API can take from the others (the reliability probe's findings
6, 7 and 12), each harm measured against a quiet baseline in the same run:

- background responses hold engine slots with no connection: they pass the request path's
  admission and a bound of their own per API key, so another key's requests do not wait;
- the store counts everything it keeps (a ``function_call_output``'s ``call_id`` among it: ids
  are bounded, and the stored JSON is what is counted), so its footprint stays within budget;
- one key's big responses evict that key's own, never another key's, nor a running background
  response."""

from __future__ import annotations

import time

import openai
import pytest

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.server.config import ResponsesConfig
from tokenwire.server.security import SecurityConfig

from api_echo import FEATURES
from served import MODEL, serve

KEYS = ("key-a", "key-b")


def _clients(s) -> tuple[openai.OpenAI, openai.OpenAI]:
    return tuple(
        openai.OpenAI(base_url=s.url + "/v1", api_key=k, max_retries=0, timeout=60) for k in KEYS
    )


def _timed(client: openai.OpenAI, n: int = 3) -> float:
    """The mean time of ``n`` short requests."""
    start = time.perf_counter()
    for _ in range(n):
        r = client.responses.create(model=MODEL, input="hello there", max_output_tokens=8)
        assert r.status in ("completed", "incomplete")
    return (time.perf_counter() - start) / n


def test_background_responses_cannot_take_every_engine_slot():
    """Finding 6: key A starts many long background responses; key B's requests still take
    what they took alone (on the earlier server every one was admitted, and B waited for A's
    to end: about 50 times its baseline here)."""
    engine = SyntheticConfig(output="replay", step_time=0.02, max_batch_size=4)
    cfg = ResponsesConfig(max_background=2)
    security = SecurityConfig(api_keys=KEYS)
    with serve(engine, features=FEATURES, security=security, responses=cfg) as s:
        a, b = _clients(s)
        quiet = _timed(b)
        started, refused = [], 0
        for _ in range(12):
            try:
                started.append(
                    a.responses.create(
                        model=MODEL,
                        input="go on",
                        background=True,
                        max_output_tokens=300,
                        extra_body={"ignore_eos": True},
                    )
                )
            except openai.RateLimitError as exc:
                refused += 1
                assert exc.body["param"] == "background"
                assert "--max-background-responses" in exc.body["message"]
        assert len(started) == 2 and refused == 10
        busy = _timed(b)
        assert all(a.responses.retrieve(r.id).status == "in_progress" for r in started)
        # B's background responses have their own places.
        mine = b.responses.create(
            model=MODEL,
            input="x",
            background=True,
            max_output_tokens=300,
            extra_body={"ignore_eos": True},
        )
        for r in [*started, mine]:
            assert (a if r in started else b).responses.cancel(r.id).status == "cancelled"
        # One place freed, one more admitted.
        again = a.responses.create(model=MODEL, input="x", background=True, max_output_tokens=4)
        assert again.status in ("queued", "in_progress")
    assert busy < 3 * quiet + 0.5, (quiet, busy)


def _db_bytes(s) -> int:
    """The SQLite store's database size (its pages)."""
    conn = s.app.state.responses.store.backend.conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    return pages * conn.execute("PRAGMA page_size").fetchone()[0]


def test_the_store_counts_everything_it_keeps():
    """Finding 7: a call id is kept for previous_response_id but no template renders it, so no
    context check bounded it, and the store did not count it (200 requests of 30 MB grew the
    earlier server past 6 GiB). Ids are now bounded, and what is counted is the stored JSON: the
    store's footprint stays within its budget however much is sent."""
    budget = 2 << 20
    cfg = ResponsesConfig(max_bytes=budget, max_key_bytes=budget)
    with serve(SyntheticConfig(output="echo"), features=FEATURES, responses=cfg) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60)
        long_id = {"type": "function_call_output", "call_id": "c" * (1 << 20), "output": "ok"}
        with pytest.raises(openai.BadRequestError) as exc:
            c.responses.create(model=MODEL, input=[long_id])
        assert "input[0].call_id" in exc.value.body["message"]
        c.responses.create(model=MODEL, input="small")
        baseline = _db_bytes(s)
        bulk = "y" * (200 << 10)  # (kept, not rendered: the echo's template shows the last turn)
        sent = 0
        for k in range(30):
            cid = f"call_{k}" * 20
            call = {
                "type": "function_call",
                "call_id": cid,
                "name": "f",
                "arguments": '{"city": "x"}',
            }
            result = {"type": "function_call_output", "call_id": cid, "output": "ok"}
            c.responses.create(model=MODEL, input=[call, result], instructions=bulk)
            sent += len(bulk)
        used = _db_bytes(s)
        counted, _ = s.app.state.responses.store.backend.usage()  # (the server is idle)
        assert sent > 2.5 * budget
        assert counted <= budget and used - baseline < 1.5 * budget, (baseline, used, sent)


def test_one_keys_big_responses_evict_only_its_own():
    """Finding 12: three requests with 25 M characters of metadata flushed another client's kept
    response, its previous_response_id chain and its running background response. Metadata is
    bounded as OpenAI bounds it, and eviction takes from the key keeping the most, never a
    running background response."""
    budget = 3 << 20
    engine = SyntheticConfig(output="echo", step_time=0.01)
    cfg = ResponsesConfig(max_bytes=budget, max_key_bytes=budget)
    security = SecurityConfig(api_keys=KEYS)
    with serve(engine, features=FEATURES, security=security, responses=cfg) as s:
        a, b = _clients(s)
        with pytest.raises(openai.BadRequestError) as exc:
            a.responses.create(model=MODEL, input="x", metadata={"k": "v" * 25_000_000})
        assert exc.value.status_code in (400, 413)
        kept = b.responses.create(model=MODEL, input="keep me")
        one = b.responses.create(model=MODEL, input="one")
        two = b.responses.create(model=MODEL, input="two", previous_response_id=one.id)
        words = " ".join(f"w{k}" for k in range(2000))
        running = b.responses.create(model=MODEL, input=words, background=True)
        before = [kept.id, one.id, two.id, running.id]
        flood = []
        for _ in range(16):  # 16 x 300 KB: past the budget 1.5 times
            flood.append(a.responses.create(model=MODEL, input="x", instructions="z" * 300_000))
        survived = sum(1 for rid in before if _kept(b, rid))
        assert survived / len(before) == 1.0
        assert b.responses.retrieve(running.id).status == "in_progress"
        follow = b.responses.create(model=MODEL, input="three", previous_response_id=two.id)
        assert follow.status == "completed"
        assert not _kept(a, flood[0].id) and _kept(a, flood[-1].id)  # A lost its own oldest
        assert b.responses.cancel(running.id).status == "cancelled"
    # Per key: a key over its own share loses its oldest, though the store has room.
    cfg = ResponsesConfig(max_bytes=64 << 20, max_key_bytes=1 << 20)
    with serve(
        SyntheticConfig(output="echo"), features=FEATURES, security=security, responses=cfg
    ) as s:
        a, b = _clients(s)
        mine = b.responses.create(model=MODEL, input="mine")
        flood = [
            a.responses.create(model=MODEL, input="x", instructions="z" * 100_000)
            for _ in range(14)
        ]
        assert _kept(b, mine.id) and not _kept(a, flood[0].id) and _kept(a, flood[-1].id)
        with pytest.raises(openai.BadRequestError) as exc:  # one response past an eighth of it
            a.responses.create(model=MODEL, input="x", instructions="z" * 200_000)
        assert exc.value.body["param"] == "store"
        assert a.responses.create(model=MODEL, input="x", instructions="z" * 200_000, store=False)


def _kept(client: openai.OpenAI, rid: str) -> bool:
    try:
        client.responses.retrieve(rid)
    except openai.NotFoundError:
        return False
    return True
