"""``tokenwire serve --api-server-count 2 --data-parallel-size 2``: two API-server processes over
two ``tokenwire mock-engine`` processes, end to end with the official ``openai`` client; one
/metrics for all; an engine, a worker or the whole server going away."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tokenwire import Tokenizer
from tokenwire.engine.pooling import PoolingRequest
from tokenwire.engine.synthetic_pooling import SyntheticPooler
from tokenwire.pooling import PoolingParams
from vllm_helpers import alive, children, free_port, metric, start_streams, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process tree")

MODEL = "scale-model"


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class Scaled:
    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc = proc
        self.url = url
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

    def role(self, word: str, rank: int | None = None) -> list[int]:
        """Processes of the server whose command line has ``word`` (and the engine rank)."""
        out = []
        for pid in descendants(self.proc.pid):
            line = cmdline(pid)
            if word in line and (rank is None or f"--data-parallel-rank {rank} " in line + " "):
                out.append(pid)
        return out


@contextlib.contextmanager
def scaled(*extra: str) -> Iterator[Scaled]:
    port = free_port()
    argv = [sys.executable, "-m", "tokenwire", "serve", "--api-server-count", "2"]
    argv += ["--data-parallel-size", "2", "--served-model-name", MODEL, "--port", str(port)]
    argv += ["--log-level", "warning", "--disable-access-log", *extra]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    everyone: list[int] = []
    try:
        wait_until(up, 120, "the server")
        srv = Scaled(proc, url)
        wait_until(lambda: len(srv.role("serve --api-server-count")) == 2, 30, "the workers")
        everyone = descendants(proc.pid)
        yield srv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for pid in everyone:
            with contextlib.suppress(ProcessLookupError):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_two_api_servers_over_two_engines_with_the_openai_client():
    with scaled("--synthetic-output", "echo", "--step-time-ms", "2") as srv:
        prompt = "one two three four five six"
        out = srv.client.completions.create(model=MODEL, prompt=prompt, max_tokens=4)
        assert out.choices[0].text == "one two three four"  # the echo engine: the prompt back
        assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 4
        streamed = srv.client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=4, stream=True
        )
        assert "".join(c.choices[0].text for c in streamed) == out.choices[0].text
        stop = srv.client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=6, stop=[" three"]
        )
        assert stop.choices[0].text == "one two" and stop.choices[0].finish_reason == "stop"
        n2 = srv.client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, n=2)
        assert [c.text for c in n2.choices] == ["one two three"] * 2
        chat = srv.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert chat.choices[0].message.content
        done = []

        def one() -> None:
            r = httpx.post(
                srv.url + "/v1/completions",
                json={"model": MODEL, "prompt": prompt, "max_tokens": 3},
                timeout=30,
            )
            done.append(r.status_code)

        def burst() -> list[float]:
            threads = [threading.Thread(target=one) for _ in range(30)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return [
                metric(srv.url, f'tokenwire_api_server_requests_total{{worker="{i}"}}')
                for i in (0, 1)
            ]

        # The kernel picks which worker accepts each connection, and a worker takes every
        # connection waiting when it wakes: one burst may all go to one worker, a few cannot.
        bursts = 0
        per_worker = [0.0, 0.0]
        while bursts < 5 and (bursts == 0 or min(per_worker) == 0):
            per_worker = burst()
            bursts += 1
        assert done == [200] * 30 * bursts
        # One /metrics for the whole server: nothing counted twice, nothing lost.
        total = 5 + 30 * bursts
        assert metric(srv.url, "tokenwire_requests_total") == total
        assert sum(per_worker) == total and min(per_worker) > 0
        assert metric(srv.url, "tokenwire_engines_alive") == 2
        # Embeddings too: the mock engines' vectors are the synthetic engine's.
        tok = Tokenizer.default()
        body = {"model": MODEL, "input": ["a b", "c"], "dimensions": 16}
        got = httpx.post(srv.url + "/v1/embeddings", json=body, timeout=30).json()
        want = SyntheticPooler(384, 0, tok.special_ids).pool(
            [PoolingRequest(t, tok.encode(t), PoolingParams("embed", 16)) for t in body["input"]]
        )
        assert [d["embedding"] for d in got["data"]] == [w.tolist() for w in want]
        # Each engine step's scheduler stats reach one worker only (vLLM's rule): the merge takes
        # each engine's newest, so nothing is left running once every request is done.
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            assert metric(srv.url, name) == 0, name
        models = {httpx.get(srv.url + "/v1/models").json()["data"][0]["id"] for _ in range(6)}
        assert models == {MODEL}


def test_an_engine_dying_mid_load_fails_only_its_requests():
    with scaled("--synthetic-output", "random", "--step-time-ms", "10") as srv:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 300, "stream": True}
        threads, bodies = start_streams(srv.url, 8, body)
        wait_until(lambda: metric(srv.url, "vllm:num_requests_running") >= 8, 20, "load")
        (engine,) = srv.role("mock-engine", rank=1)
        os.kill(engine, signal.SIGKILL)
        for t in threads:
            t.join(60)
        died = sum("the engine died" in b for b in bodies)
        finished = sum('"finish_reason":"length"' in b for b in bodies)
        assert died + finished == 8 and 0 < died < 8
        assert httpx.get(srv.url + "/health").status_code == 200
        assert metric(srv.url, "tokenwire_engines_alive") == 1
        out = srv.client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert out.choices[0].finish_reason == "length"


def test_an_engines_scheduler_gauges_are_its_newest_stats_whichever_worker_holds_them():
    # vLLM sends each step's scheduler stats to one API server only (the first with outputs in
    # that step), so a worker whose requests ended keeps stats from back then. One engine, two
    # workers, a stream on each: the first ends (its client goes away) while the second runs, so
    # the first worker's last stats count a request running; the second runs to its length, and
    # the engine's newest stats (the second worker's) count none.
    body = {"model": MODEL, "prompt": "x", "stream": True}

    def running() -> float:
        return metric(srv.url, "vllm:num_requests_running")

    with scaled(
        "--synthetic-output", "random", "--step-time-ms", "5", "--data-parallel-size", "1"
    ) as srv:
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(httpx.Client(base_url=srv.url, timeout=30))
            one = stack.enter_context(
                first.stream("POST", "/v1/completions", json={**body, "max_tokens": 5000})
            )
            one_lines = one.iter_lines()  # kept: dropping the iterator would close the stream
            assert next(one_lines).startswith("data:")
            # A connection to the other worker: the one with no request of its own.
            for _ in range(100):
                second = stack.enter_context(httpx.Client(base_url=srv.url, timeout=30))
                info = second.get("/get_server_info").json()
                if info["internal_states"][0]["num_running_reqs"] == 0:
                    break
            else:
                pytest.fail("no connection reached the second worker")
            two = stack.enter_context(
                second.stream("POST", "/v1/completions", json={**body, "max_tokens": 400})
            )
            two_lines = two.iter_lines()
            assert next(two_lines).startswith("data:")
            one.close()  # the client goes away: the engine aborts its request
            assert '"finish_reason":"length"' in "".join(two_lines)
        wait_until(lambda: running() == 0, 10, "no request running")
        assert metric(srv.url, "vllm:num_requests_waiting") == 0
        assert metric(srv.url, "vllm:kv_cache_usage_perc") == 0


def test_a_worker_dying_stops_the_server_and_leaves_no_process():
    with scaled("--step-time-ms", "5") as srv:
        everyone = descendants(srv.proc.pid)
        os.kill(srv.role("serve --api-server-count")[0], signal.SIGKILL)
        assert srv.proc.wait(60) == 1
        wait_until(lambda: not any(alive(p) for p in everyone), 30, "no process left")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_every_worker_and_engine(sig):
    with scaled("--step-time-ms", "5") as srv:
        everyone = descendants(srv.proc.pid)
        assert len(everyone) >= 4  # two workers, two engines
        t0 = time.monotonic()
        srv.proc.send_signal(sig)
        assert srv.proc.wait(60) == 0
        wait_until(lambda: not any(alive(p) for p in everyone), 30, "no process left")
        assert time.monotonic() - t0 < 30


def _refused_at_once(url: str) -> bool:
    """Whether a new connection is refused at once (not left waiting in a backlog)."""
    try:
        httpx.get(url + "/health", timeout=3)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


@pytest.mark.parametrize("how", ["sigterm", "a worker dies"])
def test_new_connections_are_refused_at_once_while_the_server_drains(how):
    """As with one process: the moment the server drains, the port refuses new connections
    (they used to wait in the backlog, unanswered, for the whole drain, then be reset)."""
    # (The streams hold the drain open for the whole shutdown timeout: 10 s, most of the test.)
    with scaled("--step-time-ms", "20", "--shutdown-timeout", "10") as srv:
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 5000, "stream": True}
        body["ignore_eos"] = True
        threads, _ = start_streams(srv.url, 2, body, timeout=60)  # they hold the drain open
        wait_until(lambda: metric(srv.url, "vllm:num_requests_running") >= 2, 20, "streams")
        if how == "sigterm":
            srv.proc.send_signal(signal.SIGTERM)
        else:
            os.kill(srv.role("serve --api-server-count")[0], signal.SIGKILL)
        t0 = time.monotonic()
        wait_until(lambda: _refused_at_once(srv.url), 8, "new connections refused")
        assert time.monotonic() - t0 < 8 and srv.proc.poll() is None  # still draining
        srv.proc.wait(60)
        for t in threads:
            t.join(60)


def test_a_restarted_engine_is_taken_in_by_every_worker():
    """Engines dialing in (--handshake-address): one killed and started again (same rank) says
    hello to the supervisor, which still answers, and every worker takes it in."""
    from vllm_helpers import spawn_mock, stop_process

    address = f"tcp://127.0.0.1:{free_port()}"
    mocks = [spawn_mock(address, r, "--step-time-ms", "2") for r in range(2)]
    try:
        with scaled("--engine", "vllm", "--handshake-address", address) as srv:
            mocks[0].kill()
            mocks[0].wait(10)
            mocks.append(spawn_mock(address, 0, "--step-time-ms", "2"))
            wait_until(lambda: metric(srv.url, "tokenwire_engines_alive") == 2, 60, "rank 0")
            mocks[1].kill()  # now every request of every worker must go to the new rank 0
            mocks[1].wait(10)
            wait_until(lambda: metric(srv.url, "tokenwire_engines_alive") == 1, 30, "rank 1 gone")
            body = {"model": MODEL, "prompt": "a b", "max_tokens": 3}

            def every_worker_serves() -> bool:
                # (engines_alive merges by max: one worker may take the engine in before the
                # other.) A connection each: they spread over both workers.
                for _ in range(12):
                    resp = httpx.post(srv.url + "/v1/completions", json=body, timeout=30)
                    if resp.status_code != 200:
                        return False
                    assert resp.json()["choices"][0]["finish_reason"] == "length"
                return True

            wait_until(every_worker_serves, 60, "every worker serving the restarted engine")
    finally:
        for proc in mocks:
            stop_process(proc)
