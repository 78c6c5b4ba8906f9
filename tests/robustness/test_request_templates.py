"""A request's own chat template (``--trust-request-chat-template``) renders in a worker process,
bounded in time and memory: a template built to exhaust the server is a 400 naming
``chat_template``, the server and its other requests unaffected."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tokenwire import ValidationError
from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.runtime import Features
from tokenwire.server import template_sandbox

from served import serve

GOOD = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}<assistant>"
HOSTILE = {
    "a huge join": "{{ range(100000)|join(',' * 10000) }}",
    "a huge string": "{{ 'a' * 10**8 }}",
    "loops": "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
    "a bigger string": "{{ 'a' * 10**10 }}",
}


@pytest.fixture(scope="module")
def server():
    with serve(
        SyntheticConfig(step_time=0), features=Features(trust_request_chat_template=True)
    ) as s:
        yield s


def _chat(url: str, template: str, path: str = "/v1/chat/completions") -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "Hi"}], "chat_template": template}
    if path != "/tokenize":
        body["max_tokens"] = 2
    return httpx.post(url + path, json=body, timeout=60)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_a_request_template_renders(server, path):
    for _ in range(2):
        resp = _chat(server.url, GOOD, path)
        assert resp.status_code == 200, resp.text
    if path == "/tokenize":
        text = server.runtime.tokenizer.decode(resp.json()["tokens"])
        assert text == "<user>Hi</user><assistant>"


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_request_template_is_a_400_and_the_server_lives_on(server, name):
    health: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            assert httpx.get(server.url + "/health", timeout=10).status_code == 200
            health.append(time.perf_counter() - t0)
            time.sleep(0.05)

    t = threading.Thread(target=probe)
    t.start()
    try:
        resp = _chat(server.url, HOSTILE[name])
    finally:
        done.set()
        t.join()
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == "chat_template" and err["code"] == 400
    assert max(health) < 1.0  # /health answered all along
    # The next request's template renders (in a new worker, if the last one was killed).
    assert _chat(server.url, GOOD).status_code == 200


def test_the_bounds_are_the_modules(monkeypatch):
    monkeypatch.setattr(template_sandbox, "SECONDS", 0.5)
    t0 = time.perf_counter()
    with pytest.raises(ValidationError, match=r"did not render within 0\.5 s") as exc:
        template_sandbox.render_request_template(HOSTILE["loops"], [], bos_token="", eos_token="")
    assert exc.value.param == "chat_template"
    assert time.perf_counter() - t0 < 5


def _plain_100kb(url: str) -> float:
    body = {"prompt": "lorem ipsum " * 8500, "max_tokens": 2}  # about 100 KB: parsed off the loop
    t0 = time.perf_counter()
    resp = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return time.perf_counter() - t0


def test_slow_request_templates_do_not_hold_up_other_requests(server, monkeypatch):
    """Twelve templates that each run to the time limit, at once: another client's plain 100 KB
    completion takes about what it takes alone (on main each waiting template held a thread of
    the executor that also parses large bodies, and they rendered one at a time: the completion
    waited behind them), and past ``MAX_WAITING`` a template request is a 429 at once."""
    monkeypatch.setattr(template_sandbox, "SECONDS", 0.5)
    monkeypatch.setattr(template_sandbox, "MAX_WAITING", 8)
    _chat(server.url, GOOD)  # (the worker processes started)
    quiet = min(_plain_100kb(server.url) for _ in range(2))
    statuses: list[int] = []

    def slow() -> None:
        statuses.append(_chat(server.url, HOSTILE["loops"]).status_code)

    threads = [threading.Thread(target=slow) for _ in range(12)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    loaded = _plain_100kb(server.url)
    for t in threads:
        t.join(120)
    assert loaded < 5 * quiet + 3.0, (quiet, loaded)  # (on main: 15 s)
    assert sorted(set(statuses)) == [400, 429], statuses
    assert statuses.count(429) >= 2
