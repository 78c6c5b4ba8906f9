"""``--health-port``: ``/health`` and ``/metrics`` on a listener of their own keep answering while
a flood of connections holds the main port past its cap."""

from __future__ import annotations

import socket

import httpx

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.server.serving import ConnectionLimits

from served import serve, wait_until


def test_health_answers_on_its_own_port_while_the_main_one_is_full():
    limits = ConnectionLimits(max_connections=4, idle_timeout=60, header_timeout=60)
    with serve(SyntheticConfig(step_time=0), limits, health_port=0) as s:
        assert wait_until(lambda: s.app.health is not None and s.app.health.port)
        health = f"http://127.0.0.1:{s.app.health.port}"
        held = []
        try:
            for _ in range(40):  # past the cap and its reserve: new ones are closed at once
                c = socket.create_connection(("127.0.0.1", s.port))
                held.append(c)
            assert wait_until(lambda: len(s.server.server_state.connections) >= limits.hard_cap, 10)
            try:
                main = httpx.get(s.url + "/health", timeout=2).status_code
            except httpx.HTTPError:
                main = None
            assert main != 200  # the main port is full
            for _ in range(5):
                resp = httpx.get(health + "/health", timeout=5)
                assert resp.status_code == 200 and resp.json() == {"status": "ok"}
            metrics = httpx.get(health + "/metrics", timeout=5)
            assert metrics.status_code == 200 and "tokenwire_requests_total" in metrics.text
            assert httpx.head(health + "/health", timeout=5).status_code == 200
            assert httpx.get(health + "/v1/models", timeout=5).status_code == 404
            assert httpx.post(health + "/health", timeout=5).status_code == 405
        finally:
            for c in held:
                c.close()


def test_health_says_503_on_its_own_port_when_the_engine_is_down():
    with serve(SyntheticConfig(step_time=0), health_port=0) as s:
        assert wait_until(lambda: s.app.health is not None and s.app.health.port)
        s.engine.inject("crash")
        assert wait_until(lambda: not s.engine.alive)
        resp = httpx.get(f"http://127.0.0.1:{s.app.health.port}/health", timeout=5)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == 503
