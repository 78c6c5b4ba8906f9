"""Engine faults end requests everywhere: the client hears of it, and nothing keeps decoding in
the engine (no zombie work outside the concurrency limit)."""

from __future__ import annotations

import threading

import httpx
import msgspec

from tokenwire.engine.synthetic import SyntheticConfig

from served import MODEL, serve, wait_until


def _stream(url: str, out: dict) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 5000, "stream": True}
    body["ignore_eos"] = True
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as resp:
        out["body"] = resp.read().decode()


def test_malformed_frame_aborts_the_request_in_the_engine():
    with serve(SyntheticConfig(step_time=0.01)) as s:
        out: dict = {}
        t = threading.Thread(target=_stream, args=(s.url, out))
        t.start()
        assert wait_until(lambda: s.engine.running == 1)
        s.engine.inject("malformed")
        t.join(30)
        events = [e[len("data: ") :] for e in out["body"].split("\n\n") if e]
        assert events[-1] == "[DONE]"
        err = msgspec.json.decode(events[-2])["error"]
        assert "malformed engine output frame" in err["message"] and err["code"] == 500
        # The engine gave the request up too, long before its 5000 tokens.
        assert wait_until(lambda: s.engine.running == 0 and s.engine.waiting == 0, 5)
        assert s.engine.stats["aborted"] == 1 and s.engine.stats["finished"] == 0
        assert len(s.runtime.shard) == 0


def test_a_handler_failing_unplanned_ends_its_requests_in_the_engine(monkeypatch):
    from tokenwire.server import streaming

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in response shaping")

    # The first choice to finish trips the bug while the other is still being decoded.
    monkeypatch.setattr(streaming, "count_finish", broken)
    with serve(SyntheticConfig(step_time=0.01)) as s:
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 3000, "n": 2, "seed": 1}
        body["stop_token_ids"] = []
        resp = httpx.post(s.url + "/v1/completions", json=body, timeout=60)
        assert resp.status_code == 500
        assert resp.json()["error"]["code"] == 500 and "bug" not in resp.text
        assert wait_until(lambda: s.engine.running == 0 and len(s.runtime.shard) == 0, 5)
        assert s.engine.stats["aborted"] >= 1
