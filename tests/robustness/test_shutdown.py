"""Graceful shutdown: requests in flight may finish within --shutdown-timeout; after it, streams
end with an error event and [DONE], unary requests with a JSON 503; the server exits promptly."""

from __future__ import annotations

import threading
import time

import httpx
import msgspec

from tokenwire.engine.synthetic import SyntheticConfig

from served import MODEL, serve, wait_until


def _post(url: str, stream: bool, max_tokens: int, out: dict, key: str) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": max_tokens, "stream": stream}
    body["ignore_eos"] = True
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as resp:
        out[key] = (resp.status_code, resp.read())


def test_shutdown_ends_requests_in_flight_with_readable_errors():
    with serve(SyntheticConfig(step_time=0.01), shutdown_timeout=0.5) as s:
        out: dict = {}
        threads = [
            threading.Thread(target=_post, args=(s.url, True, 5000, out, "stream")),
            threading.Thread(target=_post, args=(s.url, False, 5000, out, "unary")),
        ]
        for t in threads:
            t.start()
        assert wait_until(lambda: s.engine.running == 2)
        start = time.monotonic()
        s.server.should_exit = True  # what SIGTERM does
        for t in threads:
            t.join(20)
        s.thread.join(20)
        assert not s.thread.is_alive() and time.monotonic() - start < 10  # exits promptly
        status, body = out["stream"]
        events = [e[len(b"data: ") :] for e in body.split(b"\n\n") if e]
        assert status == 200 and events[-1] == b"[DONE]"
        err = msgspec.json.decode(events[-2])["error"]
        assert err["code"] == 503 and "shutting down" in err["message"]
        status, body = out["unary"]
        assert status == 503
        assert msgspec.json.decode(body)["error"]["code"] == 503
        assert s.engine.stats["aborted"] == 2 and s.engine.stats["finished"] == 0


def test_requests_that_finish_within_the_shutdown_timeout_complete():
    with serve(SyntheticConfig(step_time=0.01), shutdown_timeout=10) as s:
        out: dict = {}
        t = threading.Thread(target=_post, args=(s.url, True, 50, out, "stream"))
        t.start()
        assert wait_until(lambda: s.engine.running == 1)
        s.server.should_exit = True
        t.join(20)
        s.thread.join(20)
        status, body = out["stream"]
        assert status == 200 and body.endswith(b"data: [DONE]\n\n") and b'"error"' not in body
        assert s.engine.stats["finished"] == 1
