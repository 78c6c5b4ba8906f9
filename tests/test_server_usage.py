"""Usage details from the engine's counts (SGLang 0.5.23 frames: cached and reasoning tokens) and
SGLang's ``matched_stop``, in OpenAI responses and ``/generate``, streamed and not."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from tokenwire import FinishReason
from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.messages.frames import LAYOUT_SGLANG_0_5_23
from tokenwire.server.openai.chunks import reasoning_count, usage
from tokenwire.server.streaming import matched_stop

from test_server_e2e import MODEL, serve

PROMPT = "<think>a few thoughts</think> The answer is four. Done"


def sse_bodies(text: str) -> list[dict]:
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [msgspec.json.decode(e) for e in events[:-1]]


@pytest.fixture(scope="module")
def counted():
    config = SyntheticConfig(output="echo", frame_layout=LAYOUT_SGLANG_0_5_23, cached_tokens=3)
    with serve(config) as s:
        yield s


@pytest.fixture(scope="module")
def echo():
    with serve(SyntheticConfig(output="echo")) as s:
        yield s


def test_usage_helper():
    assert usage(5, 2) == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert usage(5, 2, 1, cached_tokens=3) == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 3},
        "completion_tokens_details": {"reasoning_tokens": 1},
    }
    assert reasoning_count(0, None) is None and reasoning_count(0, 4) == 4
    assert reasoning_count(2, 4) == 2
    assert matched_stop(FinishReason.stop(7)) == 7
    assert matched_stop(FinishReason.stop([1, 2])) == [1, 2]
    assert matched_stop(FinishReason.length(3)) is None and matched_stop(None) is None


def _reasoning(tok, n: int) -> int:
    """Tokens from <think> through </think> among the first ``n`` echoed prompt ids."""
    ids = tok.encode(PROMPT)[:n]
    start, end = ids.index(tok.token_to_id("<think>")), ids.index(tok.token_to_id("</think>"))
    return end - start + 1


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_cached_and_reasoning_tokens_in_usage(counted, route):
    n = 12
    if route == "completions":
        r = counted.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=n)
        prompt_len = len(counted.tok.encode(PROMPT))
    else:
        r = counted.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=n
        )
        prompt_len = r.usage.prompt_tokens
    assert r.usage.prompt_tokens == prompt_len
    assert r.usage.prompt_tokens_details.cached_tokens == 3
    if route == "completions":
        assert r.usage.completion_tokens_details.reasoning_tokens == _reasoning(counted.tok, n)
    stream = counted.client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=n,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    last = list(stream)[-1]
    assert last.usage.prompt_tokens_details.cached_tokens == 6  # two choices
    assert last.usage.completion_tokens_details.reasoning_tokens == 2 * _reasoning(counted.tok, n)


def test_without_counts_usage_has_no_details(echo):
    raw = httpx.post(
        echo.url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 4}
    ).json()
    assert set(raw["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


def test_generate_meta_info_counts(counted):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 12}}
    r = httpx.post(counted.url + "/generate", json=body).json()
    assert r["meta_info"]["cached_tokens"] == 3
    assert r["meta_info"]["reasoning_tokens"] == _reasoning(counted.tok, 12)
    with httpx.stream("POST", counted.url + "/generate", json=body | {"stream": True}) as resp:
        bodies = sse_bodies(resp.read().decode())
    assert bodies[-1]["meta_info"]["cached_tokens"] == 3
    assert bodies[-1]["meta_info"]["reasoning_tokens"] == _reasoning(counted.tok, 12)


@pytest.mark.parametrize("stream", [False, True])
def test_matched_stop_next_to_stop_reason(echo, stream):
    tok = echo.tok
    ids = tok.encode(PROMPT)
    eos = tok.eos_token_ids[0]
    cases = [
        ({"stop": [" four"]}, " four", " four"),
        ({"stop_token_ids": [ids[5]]}, ids[5], ids[5]),
        ({"stop_token_ids": [ids[5:7]]}, ids[5:7], str(ids[5:7])),
    ]
    for extra, matched, stop_reason in cases:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "stream": stream} | extra
        if stream:
            with httpx.stream("POST", echo.url + "/v1/completions", json=body) as resp:
                choice = sse_bodies(resp.read().decode())[-1]["choices"][0]
        else:
            choice = httpx.post(echo.url + "/v1/completions", json=body).json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert choice["matched_stop"] == matched, extra
        assert choice["stop_reason"] == stop_reason, extra
    # EOS: SGLang names the token, vLLM's stop_reason is null.
    body = {"model": MODEL, "prompt": [*ids[:3], eos], "max_tokens": 40, "stream": stream}
    if stream:
        with httpx.stream("POST", echo.url + "/v1/completions", json=body) as resp:
            choice = sse_bodies(resp.read().decode())[-1]["choices"][0]
    else:
        choice = httpx.post(echo.url + "/v1/completions", json=body).json()["choices"][0]
    assert (choice["matched_stop"], choice["stop_reason"]) == (eos, None)
    gen = httpx.post(
        echo.url + "/generate",
        json={"text": PROMPT, "sampling_params": {"stop": " four"}},
    ).json()
    assert gen["meta_info"]["matched_stop"] == " four"
