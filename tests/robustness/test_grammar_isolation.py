"""Structured output cannot hold other clients up: the synthetic engine chooses constrained
tokens off the event loop, so a grammar whose every token is costly (``\\p{L}{3000}``, whose
shortest finish is past any rollout) leaves another stream's inter-token latency and the loop's
responsiveness as they are; grammars compile in a pool, fairly between clients, so eight heavy
regexes from one client do not make another's trivial schema wait; a constrained request has a
CPU budget; a grammar that cannot finish within max_tokens is a 400 before it runs."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import pytest

from tokenwire.engine import EngineRequest
from tokenwire.engine.grammar import GrammarCompiler
from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.messages.frames import (
    EGRESS_TAG_BATCH,
    EGRESS_TAG_ERROR,
    decode_batch_frame,
    decode_error_frame,
)
from tokenwire.messages.sampling import SamplingParams
from tokenwire.server import ServerConfig, create_app

from asgi_client import call
from conftest import real_tokenizer

TOK = real_tokenizer("default")
HEAVY = r"\p{L}{3000}"  # every mask is costly, and no finish is within the rollout's reach
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}


def _request(rid: str, **params) -> EngineRequest:
    sp = SamplingParams(**params).normalize(TOK)
    return EngineRequest(rid, TOK.encode("Tell me.", add_special_tokens=False), sp)


class _Watch:
    """Frame arrival times per request, ends, and the event loop's lag (a 5 ms ticker)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.ended: dict[str, str] = {}
        self.lag: list[float] = []
        self.events: dict[str, asyncio.Event] = {}

    def output(self, frame) -> None:
        now = time.perf_counter()
        if frame[0] == EGRESS_TAG_ERROR:
            rid, message = decode_error_frame(frame)
            self.ended[rid] = "error: " + message
            self._fire(rid)
        elif frame[0] == EGRESS_TAG_BATCH:
            for ev in decode_batch_frame(frame).events:
                self.times.setdefault(ev.rid, []).append(now)
                self._fire(ev.rid + ":first")
                if ev.finish_reason is not None:
                    self.ended[ev.rid] = ev.finish_reason.kind
                    self._fire(ev.rid)

    def _fire(self, name: str) -> None:
        self.events.setdefault(name, asyncio.Event()).set()

    async def wait(self, name: str, timeout: float) -> None:
        await asyncio.wait_for(self.events.setdefault(name, asyncio.Event()).wait(), timeout)

    async def tick(self, seconds: float) -> list[float]:
        lags = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(time.perf_counter() - start - 0.005)
        return lags

    def gaps(self, rid: str) -> list[float]:
        t = self.times[rid]
        return sorted(b - a for a, b in itertools.pairwise(t))


async def _plain(engine: SyntheticEngine, watch: _Watch, rid: str) -> tuple[float, float]:
    """A plain stream's worst inter-token gap and the loop's worst lag while it runs."""
    engine.submit(_request(rid, max_new_tokens=120, ignore_eos=True))
    ticker = asyncio.ensure_future(watch.tick(1.0))
    await watch.wait(rid, 60)
    lag = max(await ticker)
    return watch.gaps(rid)[-2], lag  # (the second worst: one scheduler hiccup is not a stall)


def test_a_costly_grammar_does_not_delay_another_stream():
    """The baseline: a plain stream's gaps and the loop's lag alone; then the same beside a
    constrained request whose every token costs milliseconds of mask work and whose finish is
    re-measured from time to time (on main: on the loop, seconds each time)."""

    async def main() -> tuple[tuple[float, float], tuple[float, float]]:
        engine = SyntheticEngine(
            TOK, SyntheticConfig(step_time=0.01, grammar_cpu_seconds=4, grammar_compile_timeout=1)
        )
        watch = _Watch()
        await engine.start(watch.output)
        try:
            quiet = await _plain(engine, watch, "quiet")
            engine.submit(_request("heavy", regex=HEAVY, max_new_tokens=4000))
            await watch.wait("heavy:first", 60)
            loaded = await _plain(engine, watch, "loaded")
            assert "heavy" not in watch.ended or not watch.ended["heavy"].startswith("error")
            return quiet, loaded
        finally:
            await engine.close()

    (quiet_gap, quiet_lag), (gap, lag) = asyncio.run(main())
    assert gap < 4 * max(quiet_gap, 0.01) + 0.1, (quiet_gap, gap)
    assert lag < 4 * max(quiet_lag, 0.005) + 0.1, (quiet_lag, lag)


def test_compiles_are_fair_between_clients():
    """One client's eight heavy regexes compiling (each with its rollout) do not make another
    client's trivial schema wait: its compile takes about what it takes alone (on main the one
    worker took them in order, the schema last: tens of seconds)."""
    engine = SyntheticEngine(TOK, SyntheticConfig(grammar_compile_timeout=1.5))
    compiler = GrammarCompiler(TOK, prepare=engine._prepare_grammar, compile_timeout=1.5)
    try:
        compiler.compile("regex", "warm").result(60)  # (llguidance's tokenizer, the tables)
        start = time.perf_counter()
        compiler.compile("json_schema", json.dumps(WEATHER), client="b").result(30)
        quiet = time.perf_counter() - start
        for i in range(8):
            compiler.compile("regex", rf"\p{{L}}{{{3000 + i}}}", client="a")
        time.sleep(0.2)  # (the heavy ones are running)
        other = {**WEATHER, "required": ["city"]}
        start = time.perf_counter()
        compiler.compile("json_schema", json.dumps(other), client="b").result(30)
        loaded = time.perf_counter() - start
    finally:
        compiler.close()
    assert loaded < 10 * max(quiet, 0.02) + 0.3, (quiet, loaded)


def test_a_constrained_request_has_a_cpu_budget():
    """Past twice its CPU budget a request whose grammar never finishes ends with an error,
    its CPU bounded (without a budget it would walk its 4,000 tokens at milliseconds each)."""

    async def main() -> tuple[str, float]:
        engine = SyntheticEngine(
            TOK, SyntheticConfig(step_time=0, grammar_cpu_seconds=0.3, grammar_compile_timeout=1)
        )
        watch = _Watch()
        await engine.start(watch.output)
        try:
            engine.submit(_request("heavy", regex=HEAVY, max_new_tokens=4000))
            await watch.wait("heavy", 60)
            seq_cpu = engine.stats
            return watch.ended["heavy"], seq_cpu["finished"]
        finally:
            await engine.close()

    ended, finished = asyncio.run(main())
    assert ended.startswith("error: ") and "CPU" in ended and finished == 1


@pytest.fixture
async def app():
    engine = SyntheticEngine(TOK, SyntheticConfig(step_time=0))
    app = create_app(TOK, engine, ServerConfig())
    await app.runtime.start()
    yield app
    await app.runtime.close()


async def test_a_grammar_that_cannot_finish_within_max_tokens_is_a_400(app):
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": fmt}
    resp = await call(
        app, "POST", "/v1/chat/completions", json.dumps(body | {"max_tokens": 3}).encode()
    )
    assert resp.status == 400 and resp.error()["param"] == "max_tokens"
    assert "cannot be completed within max_tokens (3)" in resp.error()["message"]
    engine = app.runtime.engine
    assert engine.stats["submitted"] == 0  # refused before it ran
    resp = await call(
        app, "POST", "/v1/chat/completions", json.dumps(body | {"max_tokens": 64}).encode()
    )
    assert resp.status == 200
    json.loads(resp.json()["choices"][0]["message"]["content"])


def test_the_grammar_bounds_are_flags():
    from tokenwire.entrypoints.cli import build_parser
    from tokenwire.entrypoints.options.engine import mock_engine_args, synthetic_config

    args = build_parser().parse_args(
        ["serve", "--grammar-cpu-seconds", "2.5", "--grammar-compile-timeout", "0"]
    )
    config = synthetic_config(args)
    assert config.grammar_cpu_seconds == 2.5 and config.grammar_compile_timeout is None
    assert "--grammar-cpu-seconds" in mock_engine_args(args)  # (engines in their own processes)
    default = synthetic_config(build_parser().parse_args(["serve"]))
    assert default.grammar_cpu_seconds == default.grammar_compile_timeout == 10.0
