"""Logprobs: the synthetic engine reports numbers consistent with what it "samples", they travel
through the batch frame's logprob columns and the shard, and come out in OpenAI's and vLLM's
shapes, streamed exactly as not streamed."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.runtime import Features
from tokenwire.server.logprobs import TokenStrings

from conftest import real_tokenizer
from test_server_e2e import MODEL, serve

PROMPT = "Hello 你好 👋 world, the quick brown fox."


@pytest.fixture(scope="module")
def echo():
    with serve(SyntheticConfig(output="echo")) as s:
        yield s


@pytest.fixture(scope="module")
def replay():
    with serve(SyntheticConfig(output="replay")) as s:
        yield s


def test_engine_distribution_is_consistent() -> None:
    tok = real_tokenizer("default")
    engine = SyntheticEngine(tok)
    for pos in range(50):
        chosen = 1000 + pos
        lp, ids, lps = engine.logprob_row(7, pos, chosen, True, 5)
        assert ids[0] == chosen and lps[0] == lp  # greedy: the chosen token is the top one
        assert lps == sorted(lps, reverse=True) and len(set(ids)) == 5
        assert sum(math.exp(v) for v in lps) < 1
        lp, ids, lps = engine.logprob_row(7, pos, chosen, False, 5)
        assert chosen in ids[:3] and lps[ids.index(chosen)] == lp  # sampled: among the top
        assert engine.logprob_row(7, pos, chosen, False, 5) == (lp, ids, lps)  # seeded
    ranks = {engine.logprob_row(9, pos, 5, False, 3)[1].index(5) for pos in range(40)}
    assert ranks == {0, 1, 2}
    lp, ids, lps = engine.logprob_row(7, 3, 42, False, 0)
    assert ids == [] and lps == [] and lp < 0


def _completion(s, **kw):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "seed": 11} | kw
    r = httpx.post(s.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _stream(s, route: str, body: dict) -> list[dict]:
    body = {"model": MODEL, "stream": True, "seed": 11} | body
    with httpx.stream("POST", s.url + route, json=body, timeout=30) as resp:
        lines = [ln[6:] for ln in resp.read().decode().split("\n") if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def test_completion_logprobs_shape(replay) -> None:
    choice = _completion(replay, logprobs=3)["choices"][0]
    lp = choice["logprobs"]
    n = len(lp["tokens"])
    assert n == 8 and all(len(lp[k]) == n for k in lp)
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert top[token] == value and 3 <= len(top) <= 4  # the top 3, and the chosen one
    # Text offsets: where each token's text starts in the choice's text.
    choice = _completion(replay, logprobs=1, prompt="x", max_tokens=12)["choices"][0]
    lp = choice["logprobs"]
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert "".join(lp["tokens"]) == choice["text"]
    for token, at in zip(lp["tokens"], lp["text_offset"]):
        assert choice["text"][at : at + len(token)] == token


def test_greedy_picks_the_top(replay) -> None:
    lp = _completion(replay, logprobs=5, temperature=0)["choices"][0]["logprobs"]
    for value, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert value == max(top.values()) and len(top) == 5


def test_echo_with_max_tokens_zero_scores_the_prompt(echo) -> None:
    """lm-eval's loglikelihood request: the prompt back with a logprob for each token."""
    tok = echo.tok
    choice = _completion(echo, max_tokens=0, echo=True, logprobs=1)["choices"][0]
    assert choice["text"] == PROMPT
    lp = choice["logprobs"]
    ids = tok.encode(PROMPT)
    strings = TokenStrings(tok)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(isinstance(v, float) and v < 0 for v in lp["token_logprobs"][1:])
    # vLLM's tokens: a token that is only part of a character is "" (at the same offset), the
    # one that completes it carries the whole character; so they make the text, and each
    # offset is where its token starts in it.
    assert "".join(lp["tokens"]) == PROMPT
    partial = [i for i, t in enumerate(lp["tokens"]) if t == ""]
    assert partial and all(strings.text(ids[i]).startswith("bytes:") for i in partial)
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(ids))]
    for i in partial:
        assert lp["text_offset"][i] == lp["text_offset"][i + 1]


def test_echo_with_generation(echo) -> None:
    choice = _completion(echo, max_tokens=3, echo=True, logprobs=2)["choices"][0]
    n_prompt = len(echo.tok.encode(PROMPT))
    assert choice["text"].startswith(PROMPT) and len(choice["text"]) > len(PROMPT)
    assert len(choice["logprobs"]["tokens"]) == n_prompt + 3
    assert choice["prompt_logprobs"] is None  # vLLM writes the key always, null unless asked


@pytest.mark.parametrize("kw", [{"logprobs": 2}, {"logprobs": 0, "echo": True}, {"echo": True}])
def test_completion_streamed_equals_non_streamed(echo, kw) -> None:
    whole = _completion(echo, **kw)["choices"][0]
    chunks = _stream(echo, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8} | kw)
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == whole["text"]
    if whole["logprobs"] is None:
        assert all(c["choices"][0]["logprobs"] is None for c in chunks)
        return
    joined = {k: [] for k in whole["logprobs"]}
    for c in chunks:
        for k in joined:
            joined[k] += c["choices"][0]["logprobs"][k]
    assert joined == whole["logprobs"]


def test_chat_logprobs_streamed_equals_non_streamed(echo) -> None:
    body = {
        "messages": [{"role": "user", "content": "Hi 👋 there"}],
        "max_tokens": 10,
        "logprobs": True,
        "top_logprobs": 2,
    }
    r = echo.client.chat.completions.create(model=MODEL, seed=11, **body)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens  # every token, the stop token included
    for entry in content:
        assert len(entry.top_logprobs) == 2
        # vLLM's order: the chosen token first, then the top ones
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (
            entry.token,
            entry.logprob,
        )
        assert bytes(entry.bytes).decode() == entry.token  # (vLLM's: "" for a partial one)
    assert b"".join(bytes(e.bytes) for e in content).decode(errors="replace")
    chunks = _stream(echo, "/v1/chat/completions", body)
    streamed = [
        e for c in chunks for e in (c["choices"][0].get("logprobs") or {}).get("content", [])
    ]
    assert streamed == r.model_dump()["choices"][0]["logprobs"]["content"]
    # The bytes of the tokens make the text (the stop token's text is not in the content).
    text = b"".join(bytes(e["bytes"]) for e in streamed).decode()
    assert text.startswith("<|im_start|>user\nHi 👋 there")


def test_chat_logprobs_with_parsers_keep_coming() -> None:
    """While a parser holds the text back, the logprobs of its tokens still go out."""
    features = Features(
        chat_template="{{ messages[-1]['content'] }}",
        reasoning_parser="qwen3",
    )
    with serve(SyntheticConfig(output="echo"), features=features) as s:
        body = {
            "messages": [{"role": "user", "content": "<think>hmm</think>yes<|im_end|>"}],
            "max_tokens": 20,
            "logprobs": True,
        }
        whole = s.client.chat.completions.create(model=MODEL, seed=3, **body)
        chunks = _stream(s, "/v1/chat/completions", body | {"seed": 3})
        streamed = [
            e for c in chunks for e in (c["choices"][0].get("logprobs") or {}).get("content", [])
        ]
        n = len(s.tok.encode("<think>hmm</think>yes<|im_end|>", add_special_tokens=False))
        assert len(streamed) == n == len(whole.choices[0].logprobs.content)


def test_limits_and_fields(echo) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        echo.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=21
        )
    assert exc.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as exc:
        echo.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], top_logprobs=2
        )
    assert exc.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as exc:
        echo.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            logprobs=True,
            extra_body={"echo": True},
        )
    assert exc.value.body["param"] == "echo"  # (chat echo itself is vLLM's, and honoured)
    with pytest.raises(openai.BadRequestError) as exc:
        echo.client.completions.create(model=MODEL, prompt="x", extra_body={"top_logprobs": 2})
    assert exc.value.body["param"] == "top_logprobs"
    with serve(SyntheticConfig(output="echo"), features=Features(max_logprobs=2)) as s:
        with pytest.raises(openai.BadRequestError) as exc:
            s.client.completions.create(model=MODEL, prompt="x", logprobs=3)
        assert exc.value.body["param"] == "logprobs" and "max_logprobs" in exc.value.body["message"]
        assert s.client.completions.create(model=MODEL, prompt="x", logprobs=2).choices[0].logprobs


def test_tokens_as_token_ids_and_vllm_prompt_logprobs(echo) -> None:
    ids = echo.tok.encode(PROMPT)
    choice = _completion(echo, logprobs=1, return_tokens_as_token_ids=True, max_tokens=4)[
        "choices"
    ][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{i}" for i in ids[:4]]
    choice = _completion(echo, prompt_logprobs=2, max_tokens=1)["choices"][0]
    plp = choice["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    for tid, entry in zip(ids[1:], plp[1:]):
        assert str(tid) in entry and len(entry) in (2, 3)
        ranked = [e for e in entry.values() if e["rank"] is not None]
        assert sorted(e["rank"] for e in ranked) == [1, 2]


def test_generate_logprobs_sglang_shapes(echo) -> None:
    ids = echo.tok.encode(PROMPT)
    body = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0, "sampling_seed": 5},
        "return_logprob": True,
        "top_logprobs_num": 2,
        "logprob_start_len": 0,
        "return_text_in_logprobs": True,
    }
    r = httpx.post(echo.url + "/generate", json=body)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    inp, out = meta["input_token_logprobs"], meta["output_token_logprobs"]
    assert [t[1] for t in inp] == ids and inp[0][0] is None and inp[0][2] == "Hello"
    assert [t[1] for t in out] == ids[:4]
    for (lp, tid, _), top in zip(out, meta["output_top_logprobs"]):
        assert len(top) == 2 and top[0][1] == tid and top[0][0] == lp  # greedy: the top one
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"]) == len(ids)
    # The default logprob_start_len (-1): only the last prompt token; no text unless asked.
    r = httpx.post(
        echo.url + "/generate",
        json=body
        | {"logprob_start_len": -1, "top_logprobs_num": 0, "return_text_in_logprobs": False},
    )
    meta = r.json()["meta_info"]
    assert [t[1] for t in meta["input_token_logprobs"]] == ids[-1:]
    assert meta["output_token_logprobs"][0][2] is None and "output_top_logprobs" not in meta
    # Streamed: cumulative, ending with the non-streamed lists.
    with httpx.stream("POST", echo.url + "/generate", json=body | {"stream": True}) as resp:
        lines = [ln[6:] for ln in resp.read().decode().split("\n") if ln.startswith("data: {")]
    last = json.loads(lines[-1])["meta_info"]
    r = httpx.post(echo.url + "/generate", json=body)
    whole = r.json()["meta_info"]
    for key in ("input_token_logprobs", "output_token_logprobs", "output_top_logprobs"):
        assert last[key] == whole[key]
    r = httpx.post(echo.url + "/generate", json=body | {"top_logprobs_num": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs_num"


def test_logprob_rows_survive_a_slow_clients_merged_items() -> None:
    """A client that reads slowly gets several steps merged into one item: the rows of the
    merged extras are the steps' rows in order."""
    from tokenwire.engine import EngineRequest
    from tokenwire.messages.egress import EgressSink, Frame
    from tokenwire.messages.frames import decode_batch_frame
    from tokenwire.messages.sampling import SamplingParams
    from tokenwire.server.logprobs import rows_from_extras

    tok = real_tokenizer("default")
    engine = SyntheticEngine(tok, SyntheticConfig(output="echo", tokens_per_step=2))
    engine._alive = True
    params = SamplingParams(max_new_tokens=6, logprobs=2, prompt_logprobs=1).normalize(tok)
    engine.submit(EngineRequest("r", tok.encode(PROMPT), params))
    engine._admit()
    extras = [decode_batch_frame(engine._step()[0]).extras_at(0) for _ in range(3)]
    sink = EgressSink(1)
    for k, e in enumerate(extras):
        item = Frame("r", [0, 0], None, 1, "ab", 2 * (k + 1), extras=e)
        if sink.try_send(item) is not None:
            assert sink.merge_into_last(item, 1 << 20)
    (merged,) = sink.drain()
    expected = [row for e in extras for row in rows_from_extras(e)]
    assert rows_from_extras(merged.extras) == expected and len(expected) == 6
    assert rows_from_extras(merged.extras, "in") == rows_from_extras(extras[0], "in")
    assert len(rows_from_extras(merged.extras, "in")) == len(tok.encode(PROMPT)) - 1
