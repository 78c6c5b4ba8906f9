"""The Responses store across processes, on ``tokenwire serve`` itself: a conversation continued
across a restart keeps its items (its SQLite file outlives the process), and with
``--api-server-count 2`` a background response created through one worker is read and
cancelled through the other (the store says which worker runs it; a kept-alive connection
stays on the worker that took it)."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai

from vllm_helpers import free_port, wait_until

MODEL = "test-model"


@contextlib.contextmanager
def tokenwire(*extra: str) -> Iterator[str]:
    """``tokenwire serve`` (synthetic echo engine) until the block ends; yields its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "tokenwire", "serve", "--port", str(port)]
    argv += ["--served-model-name", MODEL, "--synthetic-output", "echo", "--log-level", "warning"]
    argv += ["--disable-access-log", "--shutdown-timeout", "2", *extra]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 120, "the server")
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_a_conversation_continued_across_a_restart_keeps_its_items(tmp_path):
    store = f"sqlite:///{tmp_path}/responses.sqlite3"
    with tokenwire("--responses-store", store, "--step-time-ms", "0") as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        conv = c.conversations.create(items=[{"role": "user", "content": "the earlier turn"}])
        first = c.responses.create(model=MODEL, input="before the restart", conversation=conv.id)
        plain = c.responses.create(model=MODEL, input="a response kept")
        before = [i.id for i in c.conversations.items.list(conv.id, order="asc").data]
    assert len(before) == 3
    with tokenwire("--responses-store", store, "--step-time-ms", "0") as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        assert [i.id for i in c.conversations.items.list(conv.id, order="asc").data] == before
        assert c.responses.retrieve(first.id).output_text == first.output_text
        after = c.responses.create(model=MODEL, input="after the restart", conversation=conv.id)
        alone = c.responses.create(model=MODEL, input="after the restart", store=False)
        # (the echo engine answers with the rendered prompt's first turn: the conversation's)
        assert "the earlier turn" in after.output_text
        assert after.usage.input_tokens > alone.usage.input_tokens + 10
        items = c.conversations.items.list(conv.id, order="asc").data
        assert [i.id for i in items[:3]] == before and len(items) == 5
        cont = c.responses.create(model=MODEL, input="and on", previous_response_id=plain.id)
        assert "a response kept" in cont.output_text  # (the chain's first turn)


def _worker_of(store: str, rid: str) -> str:
    """The worker the store says runs background response ``rid``."""
    with contextlib.closing(sqlite3.connect(store)) as db:
        row = db.execute("SELECT worker FROM tw_runs WHERE id = ?", (rid,)).fetchone()
    return row[0] if row else ""


def test_a_background_response_is_read_and_cancelled_through_the_other_worker(tmp_path):
    path = f"{tmp_path}/responses.sqlite3"
    extra = ("--api-server-count", "2", "--responses-store", f"sqlite:///{path}")
    with tokenwire(*extra, "--step-time-ms", "20") as url:
        words = " ".join(f"w{k}" for k in range(3000))
        body = {"model": MODEL, "input": words, "background": True}
        seen: dict[str, tuple[httpx.Client, str]] = {}
        clients = []
        made = []
        try:
            # Connections until two of them are on different workers (the kernel hands each
            # to whichever worker accepts first: on a loaded machine one may win many in a row).
            for _ in range(64):
                client = httpx.Client(
                    base_url=url, timeout=60, limits=httpx.Limits(max_connections=1)
                )
                clients.append(client)
                rid = client.post("/v1/responses", json=body).json()["id"]
                made.append((client, rid))
                wait_until(lambda rid=rid: _worker_of(path, rid), 10, "its run")
                seen.setdefault(_worker_of(path, rid), (client, rid))
                if len(seen) == 2:
                    break
                time.sleep(0.05)
            assert len(seen) == 2, "every connection went to one worker"
            (one, rid), (other, _) = seen.values()
            got = other.get(f"/v1/responses/{rid}").json()
            assert got["status"] == "in_progress" and got["background"]
            t0 = time.perf_counter()
            cancelled = other.post(f"/v1/responses/{rid}/cancel").json()
            assert cancelled["status"] == "cancelled", cancelled
            assert time.perf_counter() - t0 < 10
            assert one.get(f"/v1/responses/{rid}").json()["status"] == "cancelled"
            assert _worker_of(path, rid) == ""  # (its run is over)
            for client, r in made:
                client.post(f"/v1/responses/{r}/cancel")
        finally:
            for client in clients:
                client.close()
