"""Operations: the access log, and ``tokenwire serve`` announcing itself only once it accepts."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

import httpx

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.entrypoints.cli import build_parser
from tokenwire.server.access_log import access_line

from conftest import REPO
from test_server_e2e import MODEL, serve


def test_access_line_shape():
    scope = {
        "client": ("10.0.0.7", 5123),
        "method": "POST",
        "path": "/v1/completions",
        "query_string": b"a=1",
        "http_version": "1.1",
    }
    assert access_line(scope, 200, 0.01234) == (
        '10.0.0.7:5123 - "POST /v1/completions?a=1 HTTP/1.1" 200 12.3ms'
    )
    assert access_line({"method": "GET", "path": "/x"}, None, 0) == '- - "GET /x HTTP/1.1" - 0.0ms'


def test_access_log_one_line_per_request_after_the_response(caplog):
    with (
        caplog.at_level(logging.INFO, logger="tokenwire.access"),
        serve(SyntheticConfig(output="echo", step_time=0.0)) as s,
    ):
        body = {"model": MODEL, "prompt": "a b c", "max_tokens": 3, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body) as r:
            r.read()
        httpx.get(s.url + "/nowhere")
        httpx.post(s.url + "/v1/completions", json={"model": "other", "prompt": "x"})
    lines = [r.getMessage() for r in caplog.records if r.name == "tokenwire.access"]
    assert len(lines) == 3, lines
    assert '"POST /v1/completions HTTP/1.1" 200 ' in lines[0] and lines[0].endswith("ms")
    assert '"GET /nowhere HTTP/1.1" 404 ' in lines[1]
    assert '"POST /v1/completions HTTP/1.1" 404 ' in lines[2]


def test_a_stream_ending_in_an_error_is_logged_with_its_request_id(caplog):
    """The access line shows the error status the client read after the 200, and the server's
    log names the request and the reason; a refused request is logged with the field."""
    with (
        caplog.at_level(logging.INFO),
        serve(SyntheticConfig(output="echo", step_time=0.01)) as s,
    ):
        body = {"model": MODEL, "prompt": "a b c", "max_tokens": 200, "stream": True}
        headers = {"X-Request-Id": "my-request-7"}
        lines = []
        with httpx.stream("POST", s.url + "/v1/completions", json=body, headers=headers) as r:
            for line in r.iter_lines():
                if not lines:  # streaming: the next step gives it an id past the model's
                    s.engine.inject("bad_id")
                lines.append(line)
        assert any('"error"' in line for line in lines) and r.status_code == 200
        httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "top_p": 7})
    access = [r.getMessage() for r in caplog.records if r.name == "tokenwire.access"]
    assert '"POST /v1/completions HTTP/1.1" 200 -> 500 ' in access[0], access
    assert '"POST /v1/completions HTTP/1.1" 400 ' in access[1], access
    server = [r.getMessage() for r in caplog.records if r.name == "tokenwire.server"]
    failed = [m for m in server if "my-request-7" in m and "failed (500" in m]
    assert failed and "outside the model's vocabulary" in failed[0], server
    assert any("400" in m and "[top_p]" in m for m in server), server


def test_access_log_can_be_disabled(caplog):
    assert build_parser().parse_args(["serve", "--disable-access-log"]).disable_access_log
    # (vLLM's name for it)
    assert build_parser().parse_args(["serve", "--disable-uvicorn-access-log"]).disable_access_log
    with (
        caplog.at_level(logging.INFO, logger="tokenwire.access"),
        serve(SyntheticConfig(output="echo", step_time=0.0), access_log=False) as s,
    ):
        httpx.get(s.url + "/health")
    assert not [r for r in caplog.records if r.name == "tokenwire.access"]


def test_serve_announces_itself_once_the_socket_accepts():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenwire", "serve", "--port", str(port), "--step-time-ms", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        banner = ""
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("tokenwire: serving"):
                banner = line
                break
        assert f"on http://127.0.0.1:{port} (ready in " in banner
        # The moment it is printed, requests are served (no refused connection).
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        line = proc.stdout.readline()
        assert '"GET /health HTTP/1.1" 200' in line
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_server_process_collects_garbage_in_a_larger_young_generation(monkeypatch):
    """The served process starts a young garbage collection after 50,000 net container
    allocations, not Python's 700: the state of the requests in flight (a long prompt's 8,000
    token ids among it) is freed by reference counting when each ends, instead of being walked
    by a collection every few requests (docs/performance.md, round 14)."""
    import gc

    from tokenwire.entrypoints import serve
    from tokenwire.server.serving import TokenwireServer

    seen: list[tuple[int, int, int]] = []
    monkeypatch.setattr(TokenwireServer, "__init__", lambda self, *a, **k: None)
    monkeypatch.setattr(
        TokenwireServer, "run", lambda self, *a, **k: seen.append(gc.get_threshold())
    )
    before = gc.get_threshold()
    try:
        serve.run_server(None, None, 1.0, "", 0.0)
    finally:
        gc.set_threshold(*before)
    assert seen == [(50_000, 10, 10)] == [serve.SERVER_GC_THRESHOLD]


def test_no_access_line_is_made_while_its_logger_takes_no_info(caplog, monkeypatch):
    """Below INFO (``--log-level warning``) the access log writes nothing, so no request pays for
    its line; at INFO each request gets one."""
    from tokenwire.server import access_log

    made: list[int] = []
    real = access_log.access_line

    def counting(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(access_log, "access_line", counting)
    with serve(SyntheticConfig(output="echo", step_time=0.0)) as s:
        with caplog.at_level(logging.WARNING, logger="tokenwire.access"):
            httpx.get(s.url + "/health")
            assert made == []
        with caplog.at_level(logging.INFO, logger="tokenwire.access"):
            httpx.get(s.url + "/health")
    assert made == [1]
    assert [r for r in caplog.records if r.name == "tokenwire.access"]
