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
