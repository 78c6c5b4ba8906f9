"""Request logs (``--enable-log-requests``, ``--enable-log-outputs``, ``--max-log-len``) and echoed
request ids (``--enable-request-id-headers``), as vLLM has them, over real sockets."""

from __future__ import annotations

import json
import logging
import re

import httpx
import pytest

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.server.observe import ObserveConfig

from served import MODEL, serve
from test_listening import free_port
from test_listening import serve as serve_process

ECHO = SyntheticConfig(output="echo", step_time=0.0)


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "tokenwire.requests" and r.levelno == level
    ]


def stream_text(resp: httpx.Response) -> str:
    out = ""
    for line in resp.text.splitlines():
        if line.startswith("data: {"):
            choice = json.loads(line[6:])["choices"]
            if choice:
                out += choice[0].get("text") or choice[0].get("delta", {}).get("content") or ""
    return out


def test_each_request_logged_with_its_id_and_parameters_and_outputs_when_asked(caplog):
    observe = ObserveConfig(log_requests=True, log_outputs=True)
    with caplog.at_level(logging.INFO, "tokenwire.requests"), serve(ECHO, observe=observe) as s:
        body = {"model": MODEL, "prompt": "one two three", "max_tokens": 3, "temperature": 0.5}
        whole = httpx.post(s.url + "/v1/completions", json=body, timeout=30).json()
        streamed = httpx.post(s.url + "/v1/completions", json={**body, "stream": True})
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        httpx.post(s.url + "/v1/chat/completions", json={**chat, "n": 2, "seed": 1}, timeout=30)
        gen = {"text": "a b c d", "sampling_params": {"max_new_tokens": 2}, "stream": True}
        httpx.post(s.url + "/generate", json=gen, timeout=30)
        httpx.get(s.url + "/health")  # not a generation request: no line
    got = lines(caplog)
    received = [x for x in got if x.startswith("Received request")]
    generated = [x for x in got if x.startswith("Generated response")]
    assert len(received) == 4, got
    rid = whole["id"].removeprefix("cmpl-")
    assert received[0] == (
        f"Received request {rid}: completion, model '{MODEL}', 3 prompt token(s), 1 choice(s), "
        "params: max_new_tokens=3, temperature=0.5"
    )
    assert received[2].startswith("Received request ") and ": chat, " in received[2]
    assert "2 choice(s)" in received[2] and "sampling_seed=1" in received[2]
    assert ": generate, " in received[3]
    # One line per choice, with its whole output (as the client read it) and finish reason.
    assert generated[0] == (
        f"Generated response {rid}: output: {whole['choices'][0]['text']!r}, finish_reason: length"
    )
    assert generated[1].endswith(f"output: {stream_text(streamed)!r}, finish_reason: length")
    chat_lines = sorted(x for x in generated if " choice " in x)
    assert [x.split(":")[0].rsplit(" ", 1)[1] for x in chat_lines] == ["0", "1"]
    assert generated[-1].endswith("output: 'a b', finish_reason: length"), generated


def test_outputs_are_not_logged_unless_asked_and_max_log_len_cuts(caplog):
    observe = ObserveConfig(log_requests=True, max_log_len=4)
    with caplog.at_level(logging.DEBUG, "tokenwire.requests"), serve(ECHO, observe=observe) as s:
        body = {"model": MODEL, "prompt": "alpha beta gamma delta epsilon", "max_tokens": 5}
        httpx.post(s.url + "/v1/completions", json={**body, "stop": ["a long stop string"]})
    assert not [x for x in lines(caplog) if x.startswith("Generated")]
    (info,) = lines(caplog)
    assert "stop=['a ..." in info  # parameters cut too
    (debug,) = lines(caplog, logging.DEBUG)
    # The prompt's first 4 ids and their text (cut to 4 characters).
    match = re.fullmatch(r"Request \w+ prompt 0: '(.*)', prompt_token_ids: \[(.*)\]", debug)
    assert match is not None, debug
    assert match.group(1) == "alph..." and len(match.group(2).split(", ")) == 4


def test_nothing_is_logged_by_default(caplog):
    with caplog.at_level(logging.DEBUG, "tokenwire.requests"), serve(ECHO) as s:
        assert not s.app._observing
        httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    assert not lines(caplog) and not lines(caplog, logging.DEBUG)


def test_request_id_headers_echo_the_clients_id_or_say_the_requests_own():
    with serve(ECHO, observe=ObserveConfig(request_id_headers=True)) as s:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        mine = httpx.post(s.url + "/v1/completions", json=body, headers={"X-Request-Id": "req-42"})
        assert mine.headers["x-request-id"] == "req-42" and mine.json()["id"] == "cmpl-req-42"
        with httpx.stream("POST", s.url + "/v1/completions", json={**body, "stream": True}) as r:
            first = next(r.iter_lines())
            own = r.headers["x-request-id"]
        assert json.loads(first[6:])["id"] == f"cmpl-{own}"
        # Requests that never became a plan still get one, and each its own.
        ids = {httpx.get(s.url + "/health").headers["x-request-id"] for _ in range(3)}
        assert len(ids) == 3 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
        bad = httpx.post(
            s.url + "/v1/completions", json={"prompt": 1}, headers={"X-Request-Id": "z"}
        )
        assert bad.status_code == 400 and bad.headers["x-request-id"] == "z"
        # SGLang's /generate: the header is echoed, else the request's rid names it.
        gen = {"text": "a b", "sampling_params": {"max_new_tokens": 2}, "rid": "sg-7"}
        assert httpx.post(s.url + "/generate", json=gen).headers["x-request-id"] == "sg-7"
        r = httpx.post(
            s.url + "/generate", json=gen | {"rid": "sg-8"}, headers={"X-Request-Id": "h"}
        )
        assert r.status_code == 200 and r.headers["x-request-id"] == "h"
    with serve(ECHO) as s:  # off by default
        assert "x-request-id" not in httpx.get(s.url + "/health").headers


def test_the_flags_on_tokenwire_serve():
    port = free_port()
    flags = ["--port", str(port), "--synthetic-output", "echo", "--enable-log-requests"]
    flags += ["--enable-log-outputs", "--max-log-len", "6", "--enable-request-id-headers"]
    with serve_process(*flags) as srv:
        body = {"model": "ops-model", "prompt": "hello there world", "max_tokens": 3}
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30)
        rid = r.headers["x-request-id"]
        assert r.json()["id"] == f"cmpl-{rid}"
        srv.wait_for(f"INFO tokenwire.requests: Received request {rid}: completion")
        line = srv.wait_for(f"Generated response {rid}")
        assert line.rstrip().endswith("output: 'hello ...', finish_reason: length")
    refused = pytest.raises(RuntimeError, match="--enable-log-outputs needs --enable-log-requests")
    with refused, serve_process("--port", str(free_port()), "--enable-log-outputs"):
        pass
