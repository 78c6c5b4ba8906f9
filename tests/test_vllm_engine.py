"""tokenwire's vLLM engine end to end over ``tokenwire mock-engine`` processes speaking the engine
side of vLLM's EngineCore protocol: handshake, requests, stops and aborts, engine death, several
engines (data parallelism)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator

import httpx
import openai
import pytest
import zmq

from tokenwire.engine.vllm import VllmEngine, VllmEngineConfig
from tokenwire.entrypoints import serve
from tokenwire.entrypoints.cli import build_parser
from tokenwire.entrypoints.options.engine import engine_transport
from tokenwire.server import ServerConfig, create_app
from vllm_helpers import (
    free_port,
    metric,
    spawn_mock,
    start_streams,
    stop_process,
    wait_until,
)

from conftest import real_tokenizer
from served import run_app

MODEL = "mock-model"


class Served:
    def __init__(self, url: str, engine: VllmEngine, mocks: list) -> None:
        self.url = url
        self.engine = engine
        self.mocks = mocks
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

    def running(self) -> float:
        return metric(self.url, "vllm:num_requests_running")


@contextlib.contextmanager
def served(engines: int = 1, *mock_args: str, transport: str = "tcp") -> Iterator[Served]:
    tok = real_tokenizer("default")
    address = f"tcp://127.0.0.1:{free_port()}"
    mocks = [spawn_mock(address, r, *mock_args) for r in range(engines)]
    engine = VllmEngine(
        tok,
        VllmEngineConfig(
            handshake_address=address,
            data_parallel_size=engines,
            ready_timeout=60,
            transport=transport,
        ),
    )
    try:
        app = create_app(tok, engine, ServerConfig(model_name=MODEL))
        with run_app(app, start_timeout=120) as url:
            yield Served(url, engine, mocks)
    finally:
        for proc in mocks:
            stop_process(proc)


@pytest.fixture(scope="module")
def echo():
    with served(1, "--synthetic-output", "echo", "--step-time-ms", "2") as srv:
        yield srv


def test_completion_streamed_and_not_over_the_engine_protocol(echo):
    tok = real_tokenizer("default")
    prompt = "The quick brown fox jumps over the lazy dog"
    ids = tok.encode(prompt)
    out = echo.client.completions.create(model=MODEL, prompt=prompt, max_tokens=5)
    assert out.choices[0].text == tok.decode(ids[:5])
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 5
    chunks = echo.client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, stream=True)
    assert "".join(c.choices[0].text for c in chunks) == out.choices[0].text
    chat = echo.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].finish_reason == "length" and chat.choices[0].message.content


def _endpoints(engine: VllmEngine) -> list[str]:
    return [
        sock.getsockopt_string(zmq.LAST_ENDPOINT) for sock in (engine._input, engine._output_sock)
    ]


def test_engines_on_this_host_may_reach_the_server_over_unix_sockets():
    """``transport="ipc"``: the input and output sockets are Unix sockets in a directory of the
    server's own (mode 0700), the only endpoints bound, so the engine's requests and outputs go
    through them; the directory is gone once the engine closes. The default binds TCP ports on
    the handshake's host."""
    tok = real_tokenizer("default")
    prompt = "The quick brown fox jumps over the lazy dog"
    with served(1, "--synthetic-output", "echo", transport="ipc") as srv:
        endpoints = _endpoints(srv.engine)
        assert all(e.startswith("ipc://") for e in endpoints), endpoints
        folder = os.path.dirname(endpoints[0].removeprefix("ipc://"))
        assert os.path.dirname(endpoints[1].removeprefix("ipc://")) == folder
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        chunks = srv.client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=5, stream=True
        )
        assert "".join(c.choices[0].text for c in chunks) == tok.decode(tok.encode(prompt)[:5])
    assert not os.path.exists(folder)
    with served(1, "--synthetic-output", "echo") as srv:
        assert all(e.startswith("tcp://127.0.0.1:") for e in _endpoints(srv.engine))


def test_the_unix_sockets_go_under_tmp_when_the_temporary_directory_is_too_long(
    monkeypatch, tmp_path
):
    """A socket's path holds 107 bytes: under a long ``TMPDIR`` the sockets' directory is made in
    ``/tmp`` instead (and removed, as the other)."""
    long_dir = tmp_path / ("d" * 60) / ("e" * 60)
    long_dir.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(long_dir))
    engine = VllmEngine(real_tokenizer("default"), VllmEngineConfig(transport="ipc"))
    input_at, output_at = engine._endpoints("127.0.0.1")
    folder = engine._ipc_dir
    assert folder is not None and os.path.dirname(folder) == "/tmp"
    assert input_at == f"ipc://{folder}/input" and output_at == f"ipc://{folder}/output"
    assert len(output_at.removeprefix("ipc://")) <= 107
    assert os.listdir(long_dir) == []
    engine._remove_ipc_dir()
    assert not os.path.exists(folder)


def test_engine_transport_flag():
    """``--engine-transport``: ``auto`` is ipc for the engines ``--model`` spawns and tcp for
    engines that dial ``--handshake-address``; tcp or ipc as said otherwise; another value is
    refused, by the flag and by the engine's config."""
    parser = build_parser()
    auto = parser.parse_args(["serve", "--engine", "vllm"])
    assert engine_transport(auto, spawned=True) == "ipc"
    assert engine_transport(auto, spawned=False) == "tcp"
    for chosen in ("tcp", "ipc"):
        args = parser.parse_args(["serve", "--engine", "vllm", "--engine-transport", chosen])
        assert engine_transport(args, spawned=True) == chosen
        assert engine_transport(args, spawned=False) == chosen
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--engine", "vllm", "--engine-transport", "udp"])
    with pytest.raises(ValueError, match="tcp or ipc"):
        VllmEngine(real_tokenizer("default"), VllmEngineConfig(transport="udp"))


def test_api_servers_refuse_the_tcp_engine_transport():
    """With ``--api-server-count`` the API servers reach the engines over Unix sockets: an
    explicit ``--engine-transport tcp`` is refused at start, before anything runs."""
    argv = ["serve", "--engine", "vllm", "--handshake-address", "tcp://127.0.0.1:1"]
    argv += ["--api-server-count", "2", "--engine-transport", "tcp"]
    args = build_parser().parse_args(argv)
    with pytest.raises(SystemExit, match="--engine-transport tcp"):
        serve._supervise(args, argv)


def test_version_is_the_engines_vllm_version(echo):
    """vLLM's /version: the engine's version (its ready response says it), tokenwire's beside."""
    from tokenwire import __version__

    got = httpx.get(echo.url + "/version").json()
    assert got == {"version": "0.32.0", "tokenwire_version": __version__}


def test_stop_token_ids_and_eos_follow_vllms_finish_codes(echo):
    tok = real_tokenizer("default")
    ids = tok.encode("one two three four five")
    raw = httpx.post(
        echo.url + "/v1/completions",
        json={"model": MODEL, "prompt": ids, "max_tokens": 10, "stop_token_ids": [ids[2]]},
    ).json()
    choice = raw["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == ids[2]
    assert choice["text"] == tok.decode(ids[:2])
    # The prompt's own EOS: a stop with no stop_reason (the engine got _eos_token_id) ...
    eos = tok.eos_token_ids[0]
    raw = httpx.post(
        echo.url + "/v1/completions", json={"model": MODEL, "prompt": [*ids[:2], eos, 7]}
    ).json()
    assert raw["choices"][0]["finish_reason"] == "stop"
    assert raw["choices"][0]["stop_reason"] is None
    assert raw["usage"]["completion_tokens"] == 3
    # ... unless the request ignores EOS.
    raw = httpx.post(
        echo.url + "/v1/completions",
        json={"model": MODEL, "prompt": [*ids[:2], eos, 7], "ignore_eos": True},
    ).json()
    assert raw["choices"][0]["finish_reason"] == "length"
    assert raw["usage"]["completion_tokens"] == 4


def test_logprobs_in_frames_of_their_own_read_as_the_inline_ones(echo):
    # vLLM (and the mock) send arrays of 256 bytes and more as extra frames of the message,
    # numbered from the message's own frame: 20 top logprobs of 9 prompt tokens travel so, 2 inline.
    body = {"model": MODEL, "prompt": "one two three four five six seven eight nine ten"}
    # (tokens as ``token_id:N``: two candidates that decode to one text would share a key)
    body |= {"max_tokens": 3, "temperature": 0, "echo": True, "return_tokens_as_token_ids": True}
    for top in (2, 20):
        raw = httpx.post(echo.url + "/v1/completions", json={**body, "logprobs": top}).json()
        lp = raw["choices"][0]["logprobs"]
        assert len(lp["tokens"]) > 9 and lp["token_logprobs"][0] is None
        for token, value, tops in zip(
            lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:]
        ):
            assert top <= len(tops) <= top + 1
            # vLLM's order: the chosen (or prompt) token first, then the top ones
            first, *rest = tops.items()
            assert first == (token, value) and value <= 0
            assert [v for _, v in rest] == sorted((v for _, v in rest), reverse=True)


def test_prompt_logprobs_rank_the_prompt_token_as_the_engine_says(echo):
    """vLLM's prompt_logprobs: the prompt token first, with the rank the engine gave it."""
    body = {"model": MODEL, "prompt": "one two three four", "max_tokens": 1, "prompt_logprobs": 1}
    plp = httpx.post(echo.url + "/v1/completions", json=body).json()["choices"][0][
        "prompt_logprobs"
    ]
    assert plp[0] is None and len(plp) > 2
    for entry in plp[1:]:
        first = next(iter(entry.values()))
        assert isinstance(first["rank"], int) and first["rank"] >= 1, entry


def test_vllms_engine_series_are_exported(echo):
    """The vllm: families vLLM's frontend exports from its engines' outputs: step sizes,
    preemptions, prefix cache queries and hits, the waiting requests by reason, the KV cache's
    settings, cached and computed prompt tokens, and the _created samples."""
    from prometheus_client.parser import text_string_to_metric_families

    prompt = "one two three four five"
    n_prompt = len(real_tokenizer("default").encode(prompt))
    before = _samples(echo.url)
    for _ in range(3):
        httpx.post(
            echo.url + "/v1/completions",
            json={"model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True},
        )
    text = httpx.get(echo.url + "/metrics").text
    after = _samples(echo.url)
    names = {f.name for f in text_string_to_metric_families(text)}
    for family in (
        "vllm:iteration_tokens_total",
        "vllm:num_preemptions",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_requests_waiting_by_reason",
        "vllm:cache_config_info",
        "vllm:prompt_tokens_cached",
        "vllm:request_prefill_kv_computed_tokens",
    ):
        assert family in names, family
    key = f'vllm:iteration_tokens_total_sum{{engine="0",model_name="{MODEL}"}}'
    # each step's tokens: the prompts prefilled and every token made
    assert after[key] - before.get(key, 0) >= 3 * (n_prompt + 4) - 3
    queries = f'vllm:prefix_cache_queries_total{{engine="0",model_name="{MODEL}"}}'
    assert after[queries] >= 3 * n_prompt
    assert "vllm:time_to_first_token_seconds_created" in text
    assert "vllm:num_preemptions_created" in text
    info = [
        s
        for f in text_string_to_metric_families(text)
        if f.name == "vllm:cache_config_info"
        for s in f.samples
    ]
    assert info and info[0].labels["kv_cache_size_tokens"] not in ("", "None")


def _samples(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_beam_search_over_the_engine_protocol(echo):
    """vLLM's beam search, run by tokenwire over the engine's ordinary requests with logprobs."""
    body = {"model": MODEL, "prompt": "one two three", "max_tokens": 3, "n": 2}
    got = httpx.post(echo.url + "/v1/completions", json=body | {"use_beam_search": True})
    assert got.status_code == 200, got.text
    choices = got.json()["choices"]
    assert len(choices) == 2 and all(c["text"] for c in choices)
    assert echo.engine.engines[0]["in_flight"] == 0


def test_a_stop_string_aborts_the_engine_request(echo):
    slow = "the end " * 300
    before = echo.engine.engines[0]["in_flight"]
    raw = httpx.post(
        echo.url + "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "one two the end " + slow,
            "max_tokens": 600,
            "stop": ["the end"],
        },
    ).json()
    assert raw["choices"][0]["text"] == "one two "
    assert raw["choices"][0]["stop_reason"] == "the end"
    wait_until(lambda: echo.running() == 0, 10, "the engine to drop the request")
    assert echo.engine.engines[0]["in_flight"] == before
    # The mock engine reports max_model_len x max batch as its KV capacity.
    assert metric(echo.url, "tokenwire_kv_cache_capacity_tokens") > 0


def test_disconnect_mid_stream_aborts_in_the_engine(echo):
    with httpx.stream(
        "POST",
        echo.url + "/v1/completions",
        json={"model": MODEL, "prompt": "word " * 2000, "max_tokens": 1500, "stream": True},
    ) as resp:
        for _ in resp.iter_lines():
            if echo.running() >= 1:
                break
    wait_until(lambda: echo.running() == 0, 10, "the engine to drop the request")
    wait_until(lambda: echo.engine.engines[0]["in_flight"] == 0, 10, "no request in flight")


def test_max_tokens_zero_and_what_vllm_refuses(echo):
    raw = httpx.post(
        echo.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 0}
    ).json()
    assert raw["choices"][0]["text"] == "" and raw["choices"][0]["finish_reason"] == "length"
    resp = httpx.post(
        echo.url + "/v1/completions",
        json={"model": MODEL, "prompt": "x", "presence_penalty": 2.5},
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "presence_penalty"


def test_n_with_a_seed_over_random_output():
    with served(1, "--synthetic-output", "random", "--step-time-ms", "0") as srv:
        kw = {"model": MODEL, "prompt": "x", "max_tokens": 6, "n": 2, "seed": 11}
        a = srv.client.completions.create(**kw)
        b = srv.client.completions.create(**kw)
        assert [c.text for c in a.choices] == [c.text for c in b.choices]
        assert a.choices[0].text != a.choices[1].text


def test_engine_killed_mid_stream_errors_then_503():
    with served(1, "--synthetic-output", "random", "--step-time-ms", "20") as srv:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2000, "stream": True}
        (t,), bodies = start_streams(srv.url, 1, body, timeout=30)
        wait_until(lambda: srv.engine.engines[0]["in_flight"] == 1, 10, "the stream")
        srv.mocks[0].kill()
        t.join(20)
        assert not t.is_alive()
        (got,) = bodies
        assert '"error"' in got and got.endswith("data: [DONE]\n\n")
        assert "the engine died" in got
        wait_until(lambda: httpx.get(srv.url + "/health").status_code == 503, 10, "503")
        resp = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert resp.status_code == 503


def test_two_engines_least_loaded_and_one_dying_fails_only_its_requests():
    with served(2, "--synthetic-output", "random", "--step-time-ms", "10") as srv:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 300, "stream": True}
        threads, bodies = start_streams(srv.url, 6, body)
        wait_until(lambda: sum(e["in_flight"] for e in srv.engine.engines) == 6, 10, "six streams")
        assert [e["in_flight"] for e in srv.engine.engines] == [3, 3]
        srv.mocks[1].kill()
        wait_until(lambda: not srv.engine.engines[1]["alive"], 10, "rank 1 out of rotation")
        assert httpx.get(srv.url + "/health").status_code == 200
        out = srv.client.completions.create(model=MODEL, prompt="x", max_tokens=3)
        assert out.choices[0].finish_reason == "length"
        for t in threads:
            t.join(60)
        assert sum("the engine died" in b for b in bodies) == 3
        assert sum('"finish_reason":"length"' in b for b in bodies) == 3
        assert metric(srv.url, "tokenwire_engines_alive") == 1


def test_a_serving_mock_engine_exits_promptly_on_sigterm():
    with served(1, "--synthetic-output", "echo", "--step-time-ms", "2") as srv:
        out = srv.client.completions.create(model=MODEL, prompt="a b c", max_tokens=2)
        assert out.choices[0].finish_reason == "length"
        srv.mocks[0].terminate()
        assert srv.mocks[0].wait(5) == 0  # no socket left open that would hold its context


def test_structured_outputs_constrain_the_mock_engine():
    """The mock engine honours the structured outputs a vLLM frontend sends (its synthetic engine
    constrains decoding), as a real engine does."""
    import json

    import jsonschema

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
    with served(1, "--synthetic-output", "replay", "--step-time-ms", "1") as srv:
        out = srv.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather?"}],
            max_tokens=60,
            response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
        )
        jsonschema.validate(json.loads(out.choices[0].message.content), schema)
        choice = srv.client.completions.create(
            model=MODEL, prompt="x", max_tokens=5, extra_body={"guided_choice": ["yes", "no"]}
        )
        assert choice.choices[0].text in ("yes", "no")
