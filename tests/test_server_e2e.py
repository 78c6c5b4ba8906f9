"""End to end: the real server on a loopback port, driven by the official ``openai`` client and by
raw HTTP (SSE framing, error shapes, /generate, disconnects). Every test runs under plain uvicorn
(streams go through ASGI ``send`` from a task each) and under tokenwire's connection protocol
(one-choice streams are written from their sinks' wake-ups: ``DirectStream``)."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator

import httpx
import msgspec
import openai
import pytest

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.server import ServerConfig, create_app
from tokenwire.server.direct_stream import DirectStream

from conftest import real_tokenizer
from served import run_app, run_tokenwire

#: Plain uvicorn, and uvicorn with tokenwire's connection protocol (as ``tokenwire serve``).
SERVERS = ("uvicorn", "tokenwire")

MODEL = "test-model"


class Served:
    def __init__(self, url: str, engine: SyntheticEngine, app, tok, server: str) -> None:
        self.url = url
        self.server = server  # one of SERVERS
        self.engine = engine
        self.app = app
        self.tok = tok
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

    @property
    def runtime(self):
        return self.app.state.runtime


@contextlib.contextmanager
def serve(config: SyntheticConfig, server: str = "tokenwire", **server_kw) -> Iterator[Served]:
    """Serve the default tokenizer over a synthetic engine under ``server`` (one of
    ``SERVERS``) until the block ends."""
    tok = real_tokenizer("default")
    engine = SyntheticEngine(tok, config)
    app = create_app(tok, engine, ServerConfig(model_name=MODEL, **server_kw))
    if server == "uvicorn":
        with run_app(app) as url:
            yield Served(url, engine, app, tok, server)
        return
    with run_tokenwire(app) as url:
        yield Served(url, engine, app, tok, server)


@pytest.fixture(params=SERVERS)
def server(request):
    return request.param


def wait_until(done, timeout: float = 10) -> None:
    """Poll ``done()`` until it holds (or give up after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.005)


def stream_completion(url: str, prompt: str, max_tokens: int) -> str:
    """The raw SSE body of one streaming completion."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as resp:
        return resp.read().decode()


@pytest.fixture(scope="module", params=SERVERS)
def echo(request):
    with serve(SyntheticConfig(output="echo", step_time=0.0), request.param) as s:
        yield s


@pytest.fixture(scope="module", params=SERVERS)
def rand(request):
    with serve(SyntheticConfig(output="random", step_time=0.0), request.param) as s:
        yield s


PROMPT = "The quick brown fox jumps over the lazy dog. 你好，世界！ Ünïcödé 👋🏽 done."


def echo_text(tok, prompt: str, n: int) -> str:
    return tok.decode(tok.encode(prompt)[:n])


def test_completion_non_streaming(echo):
    r = echo.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12)
    assert r.object == "text_completion" and r.model == MODEL
    (choice,) = r.choices
    assert choice.text == echo_text(echo.tok, PROMPT, 12)
    assert choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(echo.tok.encode(PROMPT))
    assert r.usage.completion_tokens == 12


def test_completion_streaming_equals_non_streaming(echo):
    full = echo.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30)
    stream = echo.client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, usage, reasons = [], None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts.append(c.text)
            reasons.append(c.finish_reason)
    assert "".join(texts) == full.choices[0].text
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])
    n = min(30, len(echo.tok.encode(PROMPT)))  # echo ends with the prompt
    assert usage.completion_tokens == n and usage.total_tokens == usage.prompt_tokens + n


def test_chat_streaming_and_not(echo):
    messages = [{"role": "user", "content": "Hello there, 世界"}]
    full = echo.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    rendered = echo.tok.encode(
        "<|im_start|>user\nHello there, 世界<|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    # echo stops at the first <|im_end|> (EOS) inside the prompt; specials are skipped
    assert full.choices[0].message.content == echo.tok.decode(rendered[:8])
    stream = echo.client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_n_choices_and_batch_prompts(rand):
    r = rand.client.completions.create(model=MODEL, prompt="x", max_tokens=6, n=3, seed=11)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 18
    texts = {c.text for c in r.choices}
    assert len(texts) == 3  # each choice its own sample
    again = rand.client.completions.create(model=MODEL, prompt="x", max_tokens=6, n=3, seed=11)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]  # reproducible
    batch = rand.client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=2, n=2)
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]
    stream = rand.client.completions.create(
        model=MODEL, prompt="x", max_tokens=6, n=2, seed=11, stream=True
    )
    got = {0: "", 1: ""}
    for chunk in stream:
        for c in chunk.choices:
            got[c.index] += c.text
    assert got == {0: r.choices[0].text, 1: r.choices[1].text}


def test_streamed_equals_non_streamed_for_the_same_seed(rand):
    kw = dict(model=MODEL, prompt="go", max_tokens=40, seed=1234, stop=["\n"])
    full = rand.client.completions.create(**kw)
    streamed = "".join(c.choices[0].text for c in rand.client.completions.create(**kw, stream=True))
    assert streamed == full.choices[0].text


def test_stop_strings_and_stop_reason(echo):
    prompt = "one two three four five six seven"
    r = echo.client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, stop=[" four"])
    assert r.choices[0].text == "one two three"
    assert r.choices[0].finish_reason == "stop"
    raw = httpx.post(
        echo.url + "/v1/completions",
        json={
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": 20,
            "stop": " four",
            "include_stop_str_in_output": True,
        },
    ).json()
    assert raw["choices"][0]["text"] == "one two three four"
    assert raw["choices"][0]["stop_reason"] == " four"
    ids = echo.tok.encode(prompt)
    raw = httpx.post(
        echo.url + "/v1/completions",
        json={
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": 20,
            "stop_token_ids": [ids[2]],
        },
    ).json()
    assert raw["choices"][0]["text"] == echo.tok.decode(ids[:2])
    assert raw["choices"][0]["stop_reason"] == ids[2]


def error_of(resp: httpx.Response) -> dict:
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, 400, "temperature"),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "max_tokens": 10**6},
            400,
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "max_completion_tokens": 10**6,
            },
            400,
            "max_completion_tokens",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": [1, 151936]}, 400, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "echo": "yes"}, 400, "echo"),
        ("/generate", {"text": "x", "sampling_params": {"max_tokens": 3}}, 400, "max_tokens"),
        ("/generate", {"input_ids": [151936]}, 400, "input_ids"),
    ],
)
def test_error_shapes(echo, path, body, status, param):
    resp = httpx.post(echo.url + path, json=body)
    assert resp.status_code == status
    err = error_of(resp)
    assert err["param"] == param and err["code"] == status
    assert "max_new_tokens" not in err["message"] or path == "/generate"
    assert not err["message"].startswith("validation failed")  # the kind is in "type"
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_unknown_model_is_openais_404(echo, path):
    body = {"model": "gpt-4o", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}
    resp = httpx.post(echo.url + path, json=body)
    assert resp.status_code == 404
    assert error_of(resp) == {
        "message": f"The model `gpt-4o` does not exist (this server serves `{MODEL}`).",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    with pytest.raises(openai.NotFoundError):
        echo.client.completions.create(model="gpt-4o", prompt="x", max_tokens=1)


def test_model_route(echo):
    card = echo.client.models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model"
    assert httpx.get(f"{echo.url}/v1/models/{MODEL}").json()["max_model_len"] == 40960
    with pytest.raises(openai.NotFoundError):
        echo.client.models.retrieve("Qwen/Qwen3-0.6B")  # a hub id with a slash
    resp = httpx.get(echo.url + "/v1/models/Qwen/Qwen3-0.6B")
    assert resp.status_code == 404 and error_of(resp)["code"] == "model_not_found"


def test_invalid_json_and_openai_client_error(echo):
    resp = httpx.post(echo.url + "/v1/completions", content=b"{not json")
    assert resp.status_code == 400 and "JSON" in error_of(resp)["message"]
    with pytest.raises(openai.BadRequestError) as info:
        echo.client.completions.create(model=MODEL, prompt="x", max_tokens=-5)
    assert "max_tokens must be at least 0" in str(info.value)


def sse_events(text: str) -> list[str]:
    assert text.endswith("\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def test_sse_framing(echo):
    with httpx.stream(
        "POST",
        echo.url + "/v1/completions",
        json={
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": 6,
            "stream": True,
        },
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        text = resp.read().decode()
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    bodies = [msgspec.json.decode(e) for e in events[:-1]]
    assert "".join(b["choices"][0]["text"] for b in bodies) == echo_text(echo.tok, PROMPT, 6)


def test_generate_native(echo):
    ids = echo.tok.encode(PROMPT)
    r = httpx.post(
        echo.url + "/generate",
        json={
            "text": PROMPT,
            "sampling_params": {"max_new_tokens": 5},
            "rid": "my-rid",
        },
    ).json()
    assert r["text"] == echo_text(echo.tok, PROMPT, 5)
    assert r["output_ids"] == ids[:5]
    assert r["meta_info"] == {
        "id": "my-rid",
        "finish_reason": {"type": "length", "length": 5},
        "prompt_tokens": len(ids),
        "completion_tokens": 5,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "matched_stop": None,
    }
    with httpx.stream(
        "POST",
        echo.url + "/generate",
        json={
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 5},
            "stream": True,
        },
    ) as resp:
        events = sse_events(resp.read().decode())
    assert events[-1] == "[DONE]"
    bodies = [msgspec.json.decode(e) for e in events[:-1]]
    # cumulative, as SGLang streams
    for a, b in itertools.pairwise(bodies):
        assert (
            b["text"].startswith(a["text"])
            and b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
        )
    assert bodies[-1]["text"] == r["text"] and bodies[-1]["output_ids"] == ids[:5]
    assert bodies[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    batch = httpx.post(
        echo.url + "/generate",
        json={
            "text": ["ab", "cd"],
            "sampling_params": {"max_new_tokens": 1},
        },
    ).json()
    assert isinstance(batch, list) and len(batch) == 2


def test_usage_counts_each_prompt_once_whatever_n(echo):
    """OpenAI and vLLM count the prompt once with n > 1 (and each prompt of a batch once)."""
    plen = len(echo.tok.encode(PROMPT))

    def prompt_metric() -> float:
        text = httpx.get(echo.url + "/metrics").text
        line = next(x for x in text.splitlines() if x.startswith("vllm:prompt_tokens_total"))
        return float(line.split()[-1])

    before = prompt_metric()
    r = echo.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, n=3)
    assert r.usage.prompt_tokens == plen and r.usage.completion_tokens == 15
    assert prompt_metric() - before == plen
    stream = echo.client.completions.create(
        model=MODEL,
        prompt=[PROMPT, "two words"],
        max_tokens=4,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage for c in stream if c.usage is not None][-1]
    assert usage.prompt_tokens == plen + len(echo.tok.encode("two words"))
    assert usage.completion_tokens == 2 * 4 + 2 * 2  # "two words" echoes its 2 tokens
    chat = echo.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=4
    )
    single = echo.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.usage.prompt_tokens == single.usage.prompt_tokens


def test_continuous_usage_request_id_and_priority(echo, monkeypatch):
    seen = []
    submit = echo.engine.submit
    monkeypatch.setattr(echo.engine, "submit", lambda req: (seen.append(req), submit(req)))
    stream = echo.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"request_id": "trace-42", "priority": 3, "unheard_of": {"x": 1}},
    )
    chunks = list(stream)
    assert {c.id for c in chunks} == {"chatcmpl-trace-42"}
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 6
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[0].usage.prompt_tokens == chunks[-1].usage.prompt_tokens > 0
    assert [r.priority for r in seen] == [3] and seen[0].rid.startswith("trace-42")


def test_x_request_id_header_names_the_request(echo):
    """vLLM's: the X-Request-Id header is the request id, over the body's request_id."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "request_id": "from-body"}
    r = httpx.post(echo.url + "/v1/completions", json=body, headers={"X-Request-Id": "hdr-7"})
    assert r.status_code == 200 and r.json()["id"] == "cmpl-hdr-7"
    r = httpx.post(echo.url + "/v1/completions", json=body)
    assert r.json()["id"] == "cmpl-from-body"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    r = httpx.post(echo.url + "/v1/chat/completions", json=chat, headers={"x-request-id": "c-9"})
    assert r.json()["id"] == "chatcmpl-c-9"
    r = httpx.post(echo.url + "/v1/completions", json=body, headers={"x-request-id": "z" * 300})
    assert r.status_code == 400 and error_of(r)["param"] == "x-request-id"


def test_a_request_id_that_names_a_live_rid_gets_engine_ids_of_its_own(server):
    """Engine ids made from a client's request id (``{id}-{n}``) skip ids in flight: a
    /generate ``rid`` may already hold one (it was a 500, ``already registered``)."""
    with serve(SyntheticConfig(output="random", step_time=0.01), server) as s:
        body = {
            "text": ["x"] * 4,
            "rid": [f"foo-{k}" for k in range(4)],
            "sampling_params": {"max_new_tokens": 30000},
        }
        held = threading.Thread(
            target=lambda: httpx.post(s.url + "/generate", json=body, timeout=30)
        )
        held.start()
        wait_until(lambda: len(s.runtime.shard) == 4)
        completion = {"model": MODEL, "prompt": "x", "max_tokens": 2, "n": 2}
        r = httpx.post(s.url + "/v1/completions", json=completion, headers={"x-request-id": "foo"})
        assert r.status_code == 200 and r.json()["id"] == "cmpl-foo"
        assert len(r.json()["choices"]) == 2
        assert len(s.runtime.shard) == 4  # the held ones go on
        assert httpx.post(s.url + "/abort_request", json={"abort_all": True}).json() == {
            "aborted": 4
        }
        held.join(10)
        wait_until(lambda: s.engine.running == 0)
        assert s.engine.running == 0 and len(s.runtime.shard) == 0


def test_models_health_metrics(echo):
    models = httpx.get(echo.url + "/v1/models").json()
    assert models["data"][0]["id"] == MODEL
    assert echo.client.models.list().data[0].id == MODEL
    assert httpx.get(echo.url + "/health").status_code == 200
    echo.client.completions.create(model=MODEL, prompt="x", max_tokens=2, stream=False)
    text = httpx.get(echo.url + "/metrics").text
    for name in (
        "tokenwire_requests_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="test-model"}',
        "tokenwire_egress_step_seconds_bucket",
        "tokenwire_requests_in_flight",
    ):
        assert name in text, name


def test_mid_stream_failure_only_hits_that_request(server):
    with serve(SyntheticConfig(output="echo", step_time=0.02), server) as s:
        results = {}

        def run(name):
            results[name] = stream_completion(s.url, PROMPT, 20)

        threads = [threading.Thread(target=run, args=(k,)) for k in ("a", "b")]
        for t in threads:
            t.start()
        wait_until(lambda: len(s.runtime.shard) >= 2)
        victim = sorted(s.runtime.shard._reqs)[0]
        s.engine.inject("bad_id", victim)
        for t in threads:
            t.join()
        failed = [k for k, v in results.items() if '"error"' in v]
        assert len(failed) == 1
        bad = sse_events(results[failed[0]])
        assert bad[-1] == "[DONE]"
        err = msgspec.json.decode(bad[-2])["error"]
        assert "detokenize failed" in err["message"] and err["code"] == 500
        good = next(k for k in results if k not in failed)
        body = [msgspec.json.decode(e) for e in sse_events(results[good])[:-1]]
        assert "".join(b["choices"][0]["text"] for b in body) == echo_text(s.tok, PROMPT, 20)


def test_overload_429_and_engine_gone_503(server):
    with serve(
        SyntheticConfig(output="echo", step_time=0.05), server, max_concurrent_requests=2
    ) as s:
        threads = [
            threading.Thread(
                target=lambda: httpx.post(
                    s.url + "/v1/completions",
                    json={"model": MODEL, "prompt": PROMPT, "max_tokens": 20},
                    timeout=30,
                )
            )
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        wait_until(lambda: len(s.runtime.shard) >= 2)
        resp = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert resp.status_code == 429 and error_of(resp)["code"] == 429
        for t in threads:
            t.join()
        # A request in flight when the engine dies gets an error, not a hang.
        result = {}

        def in_flight():
            result["body"] = stream_completion(s.url, PROMPT, 20)

        t = threading.Thread(target=in_flight)
        t.start()
        wait_until(lambda: len(s.runtime.shard) > 0)
        s.engine.inject("crash")
        t.join(30)
        events = sse_events(result["body"])
        assert events[-1] == "[DONE]" and "engine crashed" in events[-2]
        assert len(s.runtime.shard) == 0
        wait_until(lambda: not s.engine.alive)
        assert httpx.get(s.url + "/health").status_code == 503
        resp = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert resp.status_code == 503 and error_of(resp)["type"] == "service_unavailable"


def test_disconnects_abort_and_leak_nothing(server):
    with serve(SyntheticConfig(output="echo", step_time=0.01), server) as s:
        n = 40
        long_prompt = PROMPT * 20  # echo takes hundreds of steps: no request ends by itself
        for k in range(n):
            path = "/v1/chat/completions" if k % 2 else "/v1/completions"
            body = (
                {"model": MODEL, "messages": [{"role": "user", "content": long_prompt}]}
                if k % 2
                else {"model": MODEL, "prompt": long_prompt}
            ) | {"max_tokens": 1000, "stream": k % 4 != 3, "ignore_eos": True}
            if body["stream"]:
                with httpx.stream("POST", s.url + path, json=body, timeout=30) as resp:
                    next(resp.iter_bytes())  # the first chunk, then hang up
            else:
                # the client gives up while the server is still collecting the answer
                with contextlib.suppress(httpx.TimeoutException):
                    httpx.post(s.url + path, json=body, timeout=0.15)
        wait_until(lambda: not len(s.runtime.shard) and not s.engine.running)
        assert len(s.runtime.shard) == 0  # no sink, no decoder state
        assert s.runtime.shard.live_slots == 0
        assert s.engine.running == 0 and s.engine.waiting == 0  # no engine slot
        assert s.engine.stats["aborted"] == n
        assert s.engine.stats["finished"] == 0


def test_silent_engine_death_fails_requests_in_flight(server):
    with serve(SyntheticConfig(output="echo", step_time=0.05), server) as s:
        result = {}

        def run():
            result["resp"] = httpx.post(
                s.url + "/v1/completions",
                json={"model": MODEL, "prompt": PROMPT * 5, "max_tokens": 100},
                timeout=30,
            )

        t = threading.Thread(target=run)
        t.start()
        wait_until(lambda: len(s.runtime.shard) > 0)
        s.engine._alive = False  # dies without a word: no error frame, no finish
        t.join(30)
        resp = result["resp"]
        assert resp.status_code == 503
        assert "engine is not running" in error_of(resp)["message"]
        assert len(s.runtime.shard) == 0


def test_one_choice_streams_are_written_from_their_sinks_under_tokenwires_protocol(
    echo, monkeypatch
):
    """Under tokenwire's connection protocol a one-choice stream is a ``DirectStream``; under
    plain uvicorn (no body writer) and with several choices it is the task loop. The bytes are
    the same either way (the other tests here run under both)."""
    used = []
    real = DirectStream.wait

    async def counted(self):
        used.append(True)
        return await real(self)

    monkeypatch.setattr(DirectStream, "wait", counted)
    one = stream_completion(echo.url, PROMPT, 12)
    assert one.endswith("data: [DONE]\n\n")
    direct = bool(used)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "n": 2, "stream": True}
    used.clear()
    with httpx.stream("POST", echo.url + "/v1/completions", json=body, timeout=30) as resp:
        assert resp.read().decode().endswith("data: [DONE]\n\n")
    assert not used  # several choices: the task loop
    assert direct == (echo.server == "tokenwire")
