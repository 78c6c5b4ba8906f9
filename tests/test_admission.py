"""Admission instead of refusal: the waiting queue (priority then arrival, displacement, timeout
with Retry-After, a client leaving it), API keys with names, admin routes and quotas (OpenAI's
429 and x-ratelimit-* headers), keep-alive while a stream waits, the probes and load reports, and
the acceptance case: 200 requests from two keys with different priorities and quotas meeting a
full queue."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.runtime.admission import Admission
from tokenwire.server.quotas import duration
from vllm_helpers import free_port, stop_process

from prom import samples as all_samples
from served import raw_request, serve, wait_until

MODEL = "test-model"
ECHO = SyntheticConfig(output="echo", step_time=0.01)
#: (the echo engine's output is its prompt: a long one, for requests that take a while)
PROMPT = " ".join(f"word{i}" for i in range(80))


def completion(
    url: str, prompt: str = PROMPT, n: int = 4, headers: dict | None = None, **extra
) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": n, **extra}
    return httpx.post(url + "/v1/completions", json=body, timeout=60, headers=headers)


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """One metric's samples: sorted labels -> value."""
    return {
        tuple(sorted(labels.items())): value for n, labels, value in all_samples(text) if n == name
    }


def keyed(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def in_background(fn, *args) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


# ---- the queue itself (no server) ----------------------------------------------------------------


def test_the_queue_serves_priority_then_arrival_and_displaces_the_least_urgent():
    async def main() -> list:
        in_flight = [2]
        adm = Admission(2, lambda: in_flight[0], max_waiting=3)
        order: list[str] = []

        async def request(name: str, priority: int) -> str:
            try:
                await adm.enter(1, priority)
            except Exception as exc:
                return f"{name}: {type(exc).__name__}"
            order.append(name)
            in_flight[0] += 1
            adm.entered(1)
            return name

        tasks = [asyncio.ensure_future(request(n, p)) for n, p in [("a", 5), ("b", 1), ("c", 5)]]
        await asyncio.sleep(0)
        # full: a more urgent request takes the place of the latest least urgent one (c)
        tasks.append(asyncio.ensure_future(request("d", 0)))
        tasks.append(asyncio.ensure_future(request("e", 9)))  # not more urgent: refused
        await asyncio.sleep(0)
        for _ in range(3):
            in_flight[0] -= 1
            adm.poke()
            await asyncio.sleep(0)
        return [order, [await t for t in tasks], adm.refused, adm.waiting]

    order, results, refused, waiting = asyncio.run(main())
    assert order == ["d", "b", "a"]
    assert "c: OverloadedError" in results and "e: OverloadedError" in results
    assert refused == {"queue_full": 2, "queue_timeout": 0} and waiting == 0


def test_durations_as_openai_writes_them():
    assert [duration(s) for s in (0.02, 1.5, 6, 360, 3723)] == [
        "20ms",
        "1.5s",
        "6s",
        "6m0s",
        "1h2m3s",
    ]


# ---- the queue in a server -----------------------------------------------------------------------


def test_requests_wait_for_a_place_then_time_out_with_retry_after():
    slow = SyntheticConfig(output="echo", step_time=0.05)
    with serve(slow, max_concurrent_requests=1, max_waiting_requests=2, queue_timeout=3.0) as s:
        adm = s.runtime.admission
        got: dict[str, httpx.Response] = {}
        # the first request holds the one place for 6 s
        t = in_background(lambda: got.setdefault("first", completion(s.url, n=120)))
        assert wait_until(lambda: len(s.runtime.shard) == 1)
        t2 = in_background(lambda: got.setdefault("second", completion(s.url, n=2)))
        assert wait_until(lambda: adm.waiting == 1)
        # one more fills the queue; past it, 429
        t3 = in_background(lambda: got.setdefault("third", completion(s.url, n=2)))
        assert wait_until(lambda: adm.waiting == 2)
        over = completion(s.url)
        assert over.status_code == 429 and over.json()["error"]["code"] == 429
        # /ready says the server is full, /live that it answers
        ready = httpx.get(s.url + "/ready")
        assert ready.status_code == 503 and "full" in ready.json()["error"]["message"]
        assert httpx.get(s.url + "/live").status_code == 200
        for th in (t, t2, t3):
            th.join(30)
        # the queued ones timed out (3 s) with Retry-After
        for name in ("second", "third"):
            r = got[name]
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "3" and "queue-timeout" in r.text
        assert got["first"].status_code == 200
        text = httpx.get(s.url + "/metrics").text
        assert samples(text, "tokenwire_requests_refused_total") == {
            (("reason", "queue_full"),): 1.0,
            (("reason", "queue_timeout"),): 2.0,
        }
        assert adm.waiting == 0 and adm.reserved == 0
        # once the place is free, a request goes straight in; /ready says so
        assert completion(s.url, n=2).status_code == 200
        ready = httpx.get(s.url + "/ready")
        assert ready.status_code == 200 and ready.json()["requests_waiting"] == 0


def test_a_client_that_leaves_the_queue_frees_its_place_and_waiters_follow_engine_death():
    slow = SyntheticConfig(output="echo", step_time=0.05)
    with serve(slow, max_concurrent_requests=1, max_waiting_requests=4) as s:
        t = in_background(lambda: completion(s.url, n=40))
        wait_until(lambda: len(s.runtime.shard) == 1)
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2}).encode()
        sock = raw_request(s.port, "POST", "/v1/completions", body)
        assert wait_until(lambda: s.runtime.admission.waiting == 1)
        sock.close()
        assert wait_until(lambda: s.runtime.admission.waiting == 0)
        # a waiting request when the engine dies: 503, not a hang
        waiting = {}
        t2 = in_background(lambda: waiting.setdefault("r", completion(s.url, n=2)))
        assert wait_until(lambda: s.runtime.admission.waiting == 1)
        s.engine.inject("crash")
        t2.join(30)
        t.join(30)
        assert waiting["r"].status_code == 503


def test_a_stream_waiting_for_a_place_is_kept_alive_and_anthropic_pings():
    slow = SyntheticConfig(output="echo", step_time=0.05)
    with serve(
        slow, max_concurrent_requests=1, max_waiting_requests=4, sse_keep_alive_interval=0.1
    ) as s:
        t = in_background(lambda: completion(s.url, n=16))
        wait_until(lambda: len(s.runtime.shard) == 1)
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
            lines = [x for x in r.iter_lines() if x]
        assert r.status_code == 200
        first_data = next(i for i, x in enumerate(lines) if x.startswith("data: "))
        assert ": keep-alive" in lines[:first_data] and lines[-1] == "data: [DONE]"
        t.join(30)
        # Anthropic's stream: ping events while it waits, then its events
        t = in_background(lambda: completion(s.url, n=16))
        wait_until(lambda: len(s.runtime.shard) == 1)
        msg = {"model": MODEL, "max_tokens": 3, "stream": True}
        msg["messages"] = [{"role": "user", "content": "hi"}]
        with httpx.stream("POST", s.url + "/v1/messages", json=msg, timeout=30) as r:
            text = r.read().decode()
        assert text.index("event: ping") < text.index("event: message_start")
        assert "event: message_stop" in text
        t.join(30)


def test_a_silent_stream_gets_keep_alives_between_chunks():
    # a step every 0.4 s: the stream is silent longer than the interval between tokens
    with serve(SyntheticConfig(output="echo", step_time=0.4), sse_keep_alive_interval=0.15) as s:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
            lines = [x for x in r.iter_lines() if x]
        data = [x for x in lines if x.startswith("data: ")]
        assert lines.count(": keep-alive") >= 2 and data[-1] == "data: [DONE]"
        assert len(data) == 4  # two tokens, the third with the finish, [DONE]


# ---- keys, admin routes, quotas ------------------------------------------------------------------


@contextlib.contextmanager
def keys_file(entries) -> Iterator[str]:
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(entries, f)
    try:
        yield path
    finally:
        os.unlink(path)


def test_keys_have_names_admin_routes_need_an_admin_key():
    entries = [
        {"key": "sk-team-a", "name": "team-a"},
        {"key": "sk-ops", "name": "ops", "admin": True},
    ]
    with keys_file(entries) as path, serve(ECHO, api_keys_file=path) as s:
        assert completion(s.url).status_code == 401
        assert completion(s.url, headers=keyed("sk-team-a")).status_code == 200
        assert httpx.get(s.url + "/live").status_code == 200  # probes need no key
        flush = httpx.post(s.url + "/flush_cache", headers=keyed("sk-team-a"))
        assert flush.status_code == 403 and "admin" in flush.json()["error"]["message"]
        # the admin key passes (the synthetic engine has no cache to flush: 501)
        assert httpx.post(s.url + "/flush_cache", headers=keyed("sk-ops")).status_code == 501
        assert httpx.post(s.url + "/flush_cache").status_code == 401
        text = httpx.get(s.url + "/metrics").text
        got = samples(text, "tokenwire_api_key_requests_total")
        assert got[(("key", "team-a"), ("status", "200"))] == 1.0
        assert got[(("key", "team-a"), ("status", "403"))] == 1.0
        tokens = samples(text, "tokenwire_api_key_tokens_total")
        assert tokens[(("key", "team-a"), ("kind", "generation"))] == 4.0
        # a reload takes new keys; a broken file leaves them as they were
        Path(path).write_text(json.dumps([{"key": "sk-new", "name": "new"}]))
        assert s.app.keys.reload()
        assert completion(s.url, headers=keyed("sk-team-a")).status_code == 401
        assert completion(s.url, headers=keyed("sk-new")).status_code == 200
        Path(path).write_text("{not json")
        assert not s.app.keys.reload()
        assert completion(s.url, headers=keyed("sk-new")).status_code == 200


def test_admin_keys_alone_guard_only_the_admin_routes():
    with serve(ECHO, admin_api_keys=("sk-root",)) as s:
        assert completion(s.url).status_code == 200
        assert httpx.post(s.url + "/abort_request", json={"rid": "x"}).status_code == 401
        ok = httpx.post(s.url + "/abort_request", json={"rid": "x"}, headers=keyed("sk-root"))
        assert ok.status_code == 200


def test_quotas_answer_openais_429_with_rate_limit_headers():
    entries = [
        {"key": "sk-a", "name": "a", "requests_per_minute": 3},
        {"key": "sk-b", "name": "b", "tokens_per_minute": 30},
        {"key": "sk-c", "name": "c", "max_concurrent_requests": 1},
    ]
    slow = SyntheticConfig(output="echo", step_time=0.05)
    with keys_file(entries) as path, serve(slow, api_keys_file=path) as s:
        for i in range(3):
            r = completion(s.url, headers=keyed("sk-a"))
            assert r.status_code == 200
            assert r.headers["x-ratelimit-limit-requests"] == "3"
            assert r.headers["x-ratelimit-remaining-requests"] == str(2 - i)
        r = completion(s.url, headers=keyed("sk-a"))
        assert r.status_code == 429
        err = r.json()["error"]
        assert err["type"] == "requests" and err["code"] == "rate_limit_exceeded"
        assert "requests per min (RPM): Limit 3" in err["message"]
        assert (
            int(r.headers["retry-after"]) >= 1
            and r.headers["x-ratelimit-remaining-requests"] == "0"
        )
        assert r.headers["x-ratelimit-reset-requests"].endswith("s")
        # tokens: the prompt at admission, the output as it finishes
        prompt = [1000 + i for i in range(12)]  # 12 tokens, then 8 out: 10 of 30 left
        ok = completion(s.url, prompt, n=8, headers=keyed("sk-b"))
        assert ok.status_code == 200 and ok.headers["x-ratelimit-limit-tokens"] == "30"
        r = completion(s.url, prompt, n=8, headers=keyed("sk-b"))
        assert r.status_code == 429 and r.json()["error"]["type"] == "tokens"
        # requests at once
        t = in_background(lambda: completion(s.url, n=30, headers=keyed("sk-c")))
        wait_until(lambda: len(s.runtime.shard) == 1)
        r = completion(s.url, headers=keyed("sk-c"))
        assert r.status_code == 429 and r.json()["error"]["type"] == "concurrent_requests"
        t.join(30)
        assert completion(s.url, headers=keyed("sk-c")).status_code == 200
        limited = samples(
            httpx.get(s.url + "/metrics").text, "tokenwire_api_key_rate_limited_total"
        )
        assert limited == {
            (("key", "a"), ("quota", "requests")): 1.0,
            (("key", "b"), ("quota", "tokens")): 1.0,
            (("key", "c"), ("quota", "concurrent_requests")): 1.0,
        }


def test_two_hundred_requests_from_two_keys_meet_a_full_queue():
    """The acceptance case. Key "batch" (priority 10, 30 requests a minute) sends 100 requests:
    30 pass its quota (4 run, 26 wait), 70 get 429 with x-ratelimit-*. Then key "live"
    (priority 0) sends 100: the queue (110 places) fills, and the 16 latest "batch" requests
    waiting make room for more urgent ones (429, with their key's headers). Every "live" request
    finishes before the 10 "batch" requests still waiting start; nothing is left unanswered."""
    entries = [
        {"key": "sk-batch", "name": "batch", "priority": 10, "requests_per_minute": 30},
        {"key": "sk-live", "name": "live", "priority": 0, "requests_per_minute": 100000},
    ]
    with (
        keys_file(entries) as path,
        serve(ECHO, api_keys_file=path, max_concurrent_requests=4, max_waiting_requests=110) as s,
    ):
        done: list[tuple[str, int, float, httpx.Response]] = []

        async def one(client: httpx.AsyncClient, key: str, i: int) -> None:
            # (a batch request runs 1.2 s, a live one 0.12 s)
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 60 if key == "batch" else 6}
            r = await client.post("/v1/completions", json=body, headers=keyed(f"sk-{key}"))
            done.append((key, i, time.monotonic(), r))

        async def wave(key: str, count: int) -> None:
            limits = httpx.Limits(max_connections=count)
            async with httpx.AsyncClient(base_url=s.url, timeout=120, limits=limits) as client:
                await asyncio.gather(*(one(client, key, i) for i in range(count)))

        batch = in_background(lambda: asyncio.run(wave("batch", 100)))
        assert wait_until(
            lambda: (
                sum(1 for d in done if d[0] == "batch") >= 70
                and s.runtime.admission.waiting == 26
                and len(s.runtime.shard) == 4
            ),
            30,
        )
        live = in_background(lambda: asyncio.run(wave("live", 100)))
        batch.join(120)
        live.join(120)
        assert len(done) == 200  # nothing lost
        by_key = {k: [d for d in done if d[0] == k] for k in ("batch", "live")}
        assert all(d[3].status_code == 200 for d in by_key["live"])
        batch_ok = [d for d in by_key["batch"] if d[3].status_code == 200]
        refused = [d[3] for d in by_key["batch"] if d[3].status_code == 429]
        assert len(batch_ok) + len(refused) == 100
        quota = [r for r in refused if r.json()["error"]["type"] == "requests"]
        displaced = [r for r in refused if r.json()["error"]["type"] != "requests"]
        assert len(quota) >= 65 and len(displaced) == 16
        for r in refused:
            assert r.headers["x-ratelimit-limit-requests"] == "30"
        assert all("more urgent request" in r.json()["error"]["message"] for r in displaced)
        # the batch requests that waited finish after every live request
        last_live = max(d[2] for d in by_key["live"])
        waited = sorted(d[2] for d in batch_ok)[4:]  # (the first 4 were running already)
        assert len(waited) == len(batch_ok) - 4 >= 10
        assert all(t >= last_live for t in waited)
        text = httpx.get(s.url + "/metrics").text
        counted = samples(text, "tokenwire_api_key_requests_total")
        assert counted[(("key", "live"), ("status", "200"))] == 100.0
        assert counted[(("key", "batch"), ("status", "429"))] == float(len(refused))


# ---- probes, load reports, the OpenAPI document --------------------------------------------------


def test_load_reports_and_the_openapi_document():
    slow = SyntheticConfig(output="echo", step_time=0.05)
    with serve(slow, max_concurrent_requests=1, max_waiting_requests=4) as s:
        t = in_background(lambda: completion(s.url, n=20))
        wait_until(lambda: len(s.runtime.shard) == 1)
        t2 = in_background(lambda: completion(s.url, n=2))
        wait_until(lambda: s.runtime.admission.waiting == 1)
        (load,) = httpx.get(s.url + "/get_load").json()
        assert load == {"dp_rank": 0, "num_reqs": 2, "num_waiting_reqs": 1, "num_tokens": 0}
        loads = httpx.get(s.url + "/v1/loads").json()
        assert loads["dp_rank_count"] == 1 and loads["aggregate"]["total_reqs"] == 2
        core = loads["loads"][0]
        assert core["num_running_reqs"] == 1 and core["num_waiting_reqs"] == 1
        prom = httpx.get(s.url + "/v1/loads?format=prometheus").text
        assert 'sglang_num_waiting_reqs{dp_rank="0"} 1' in prom
        assert httpx.get(s.url + "/v1/loads?include=nope").status_code == 400
        assert httpx.get(s.url + "/v1/loads?dp_rank=3").json()["loads"] == []
        t.join(30)
        t2.join(30)
        doc = httpx.get(s.url + "/openapi.json").json()
        assert doc["openapi"].startswith("3.")
        paths = doc["paths"]
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/live", "/ready"):
            assert path in paths
        assert paths["/v1/chat/completions"]["post"]["requestBody"]["content"]
        assert "/sleep" not in paths  # (dev mode is off)
        assert set(paths) >= {p for _, p in s.app._routes}


def test_sighup_rereads_the_keys_file():
    entries = [{"key": "sk-one", "name": "one"}]
    with keys_file(entries) as path:
        port = free_port()
        argv = [sys.executable, "-m", "tokenwire", "serve", "--port", str(port)]
        argv += ["--api-keys-file", path, "--step-time-ms", "0", "--log-level", "warning"]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:

            def up() -> bool:
                try:
                    return httpx.get(url + "/live", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False

            assert wait_until(up, 60)
            assert httpx.get(url + "/v1/models", headers=keyed("sk-one")).status_code == 200
            Path(path).write_text(json.dumps([{"key": "sk-two", "name": "two"}]))
            proc.send_signal(signal.SIGHUP)
            assert wait_until(
                lambda: httpx.get(url + "/v1/models", headers=keyed("sk-two")).status_code == 200,
                10,
            )
            assert httpx.get(url + "/v1/models", headers=keyed("sk-one")).status_code == 401
        finally:
            stop_process(proc)


@pytest.mark.parametrize("bad", ['{"keys": 5}', '[{"name": "x"}]', '[{"key": "k", "rpm": 1}]'])
def test_a_bad_keys_file_stops_the_server_with_its_reason(bad):
    fd, path = tempfile.mkstemp(suffix=".json")
    os.write(fd, bad.encode())
    os.close(fd)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "tokenwire", "serve", "--api-keys-file", path],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0 and path in out.stderr
    finally:
        os.unlink(path)


def test_keys_files_in_text_and_json_and_the_quota_buckets_refill():
    from tokenwire.server.keys import KeyRing, parse_keys_file
    from tokenwire.server.quotas import Quotas
    from tokenwire.server.security import ApiKey

    text = "# team keys\nsk-a team-a\nsk-b   # no name\n\n"
    assert [(k, n) for k, n, _ in parse_keys_file(text)] == [("sk-a", "team-a"), ("sk-b", None)]
    with pytest.raises(ValueError, match="line 2"):
        parse_keys_file("sk-a\nsk-b name extra\n")
    with keys_file({"keys": [{"key": "sk-q", "name": "q", "requests_per_minute": 60}]}) as path:
        ring = KeyRing(["sk-flag"], ["sk-root"], path)
        assert ring.required and ring.has_admin and len(ring) == 3
        assert set(ring.names()) == {"q", "key-" + ApiKey.of("sk-flag").id[:8], "admin-"
                                     + ApiKey.of("sk-root").id[:8]}  # fmt: skip
        q = ring.find(b"Bearer sk-q", None)
        assert q is not None and q.name == "q" and ring.find(None, b"sk-q") == q
        assert ring.find(b"Bearer nope", b"nope") is None
        now = [0.0]
        quotas = Quotas(ring, clock=lambda: now[0])
        tickets = [quotas.admit(q, 0) for _ in range(60)]
        with pytest.raises(Exception) as refused:
            quotas.admit(q, 0)
        assert refused.value.status == 429 and dict(refused.value.headers)[b"retry-after"] == b"1"
        now[0] += 1.0  # one request a second comes back
        tickets.append(quotas.admit(q, 0))
        assert dict(quotas.headers(q))[b"x-ratelimit-remaining-requests"] == b"0"
        for t in tickets:
            t.close()


def test_the_official_clients_read_keep_alives_and_rate_limits():
    import anthropic
    import openai

    entries = [{"key": "sk-a", "name": "a", "requests_per_minute": 2}]
    slow = SyntheticConfig(output="echo", step_time=0.05)
    config = {"max_concurrent_requests": 1, "max_waiting_requests": 4}
    config["sse_keep_alive_interval"] = 0.05
    with keys_file(entries) as path, serve(slow, api_keys_file=path, **config) as s:
        tok = s.runtime.tokenizer
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="sk-a", max_retries=0)
        # a stream that waits for a place (kept alive) while another request runs
        t = in_background(lambda: completion(s.url, n=10, headers=keyed("sk-a")))
        wait_until(lambda: len(s.runtime.shard) == 1)
        chunks = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, stream=True)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == tok.decode(tok.encode(PROMPT)[:3])
        t.join(30)
        with pytest.raises(openai.RateLimitError) as limited:
            client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
        assert limited.value.response.headers["x-ratelimit-limit-requests"] == "2"
        assert limited.value.body["type"] == "requests"
    with serve(slow, **config) as s:
        # Anthropic's client skips the ping events of a stream kept alive
        t = in_background(lambda: completion(s.url, n=10))
        wait_until(lambda: len(s.runtime.shard) == 1)
        claude = anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0)
        msg = [{"role": "user", "content": "hi"}]
        with claude.messages.stream(model=MODEL, max_tokens=2, messages=msg) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_message()
        assert kinds[0] == "message_start" and "ping" not in kinds
        assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 2
        t.join(30)
