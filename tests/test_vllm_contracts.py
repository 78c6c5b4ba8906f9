"""What vLLM's own API-server tests hold a server to (``scripts/vllm_api_tests.py`` runs them
against stock vLLM and tokenwire), checked here on the synthetic engine: the keys vLLM always
writes, ``--return-tokens-as-token-ids``, the error messages its tests match, ``/invocations``,
``/detokenize``'s shape, logprob tokens and offsets as vLLM writes them, and beam search."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.entrypoints.cli import build_parser
from tokenwire.entrypoints.options.output import features as features_of
from tokenwire.runtime import Features

from served import MODEL, serve

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with serve(SyntheticConfig(output="echo", step_time=0.0)) as s:
        yield s


@pytest.fixture(scope="module")
def as_ids() -> Iterator[Any]:
    args = build_parser().parse_args(["serve", "--return-tokens-as-token-ids"])
    assert args.return_tokens_as_token_ids
    with serve(SyntheticConfig(output="echo", step_time=0.0), features=features_of(args)) as s:
        yield s


def _post(s, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(s.url + path, json={"model": MODEL, **body}, timeout=30)


def test_the_keys_vllm_always_writes_are_there_null_when_unused(server):
    got = _post(server, "/v1/completions", {"prompt": "a b", "max_tokens": 2}).json()
    choice = got["choices"][0]
    for key in ("token_ids", "prompt_logprobs", "prompt_token_ids"):
        assert key in choice and choice[key] is None, key
    got = _post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2}).json()
    for key in ("prompt_logprobs", "prompt_token_ids", "prompt_text"):
        assert key in got and got[key] is None, key
    assert got["choices"][0]["token_ids"] is None
    assert got["choices"][0]["message"]["refusal"] is None
    # ... and filled when asked for
    got = _post(
        server, "/v1/completions", {"prompt": "a b", "max_tokens": 2, "return_token_ids": True}
    ).json()
    assert got["choices"][0]["token_ids"] and got["choices"][0]["prompt_token_ids"]
    got = _post(
        server,
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 2, "return_token_ids": True},
    ).json()
    assert got["prompt_token_ids"] and got["choices"][0]["token_ids"]


def test_return_tokens_as_token_ids_server_flag(as_ids, server):
    """The flag makes it the default; a request's own field says otherwise."""
    body = {"prompt": "a b", "max_tokens": 2, "logprobs": 1}
    tokens = _post(as_ids, "/v1/completions", body).json()["choices"][0]["logprobs"]["tokens"]
    assert all(t.startswith("token_id:") for t in tokens) and tokens
    off = _post(as_ids, "/v1/completions", body | {"return_tokens_as_token_ids": False}).json()
    assert not any(t.startswith("token_id:") for t in off["choices"][0]["logprobs"]["tokens"])
    chat = _post(
        as_ids, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "logprobs": True}
    ).json()
    assert chat["choices"][0]["logprobs"]["content"][0]["token"].startswith("token_id:")
    plain = _post(server, "/v1/completions", body).json()
    assert not any(t.startswith("token_id:") for t in plain["choices"][0]["logprobs"]["tokens"])
    assert Features().return_tokens_as_token_ids is False


@pytest.mark.parametrize(
    ("seed", "word"), [(-(2**63) - 1, "greater_than_equal"), (2**63, "less_than_equal")]
)
def test_an_out_of_range_seed_says_what_vllm_says(server, seed, word):
    for path, body in (
        ("/v1/chat/completions", {"messages": MESSAGES}),
        ("/v1/completions", {"prompt": "x"}),
    ):
        got = _post(server, path, body | {"seed": seed})
        assert got.status_code == 400
        err = got.json()["error"]
        assert word in err["message"] and err["param"] == "seed", err


def test_out_of_vocabulary_stop_token_ids_name_the_vocabulary_size(server):
    vocab = server.runtime.tokenizer.model_vocab_size
    for path, body in (
        ("/v1/chat/completions", {"messages": MESSAGES}),
        ("/v1/completions", {"prompt": "x"}),
    ):
        got = _post(server, path, body | {"stop_token_ids": [10**7]})
        assert got.status_code == 400
        err = got.json()["error"]
        assert f"Vocabulary size: {vocab}" in err["message"] and "out-of-vocab" in err["message"]
        assert err["param"] == "stop_token_ids"


def test_invocations_serves_chat_or_completions_by_the_body(server):
    """SageMaker's route as vLLM serves it: the same answer as the route the body is for."""
    chat = {"messages": MESSAGES, "max_tokens": 3, "temperature": 0}
    a = _post(server, "/v1/chat/completions", chat).json()
    b = _post(server, "/invocations", chat).json()
    assert a.keys() == b.keys() and a["choices"] == b["choices"]
    assert b["object"] == "chat.completion"
    completion = {"prompt": "a b c", "max_tokens": 2}
    b = _post(server, "/invocations", completion).json()
    assert b["object"] == "text_completion"
    assert b["choices"] == _post(server, "/v1/completions", completion).json()["choices"]
    streamed = httpx.post(
        server.url + "/invocations", json={"model": MODEL, **completion, "stream": True}
    )
    assert streamed.text.rstrip().endswith("data: [DONE]")
    bad = httpx.post(server.url + "/invocations", content=b"{nope")
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]


def test_detokenize_is_vllms_shape(server):
    ids = server.runtime.tokenizer.encode("a b c")
    assert httpx.post(server.url + "/detokenize", json={"tokens": ids}).json() == {
        "prompt": "a b c"
    }
    sglang = httpx.post(server.url + "/v1/detokenize", json={"tokens": ids}).json()
    assert sglang["text"] == "a b c"


def test_a_custom_role_is_answered(server):
    got = _post(
        server,
        "/v1/chat/completions",
        {"messages": [{"role": "my-custom-role", "content": "hi"}], "max_tokens": 2},
    )
    assert got.status_code == 200, got.text


def test_logprob_tokens_inside_a_character_are_vllms(server):
    """A token that is part of a UTF-8 character is "" at the same offset until the token that
    completes the character, which carries it whole (vLLM's), in completions and chat; and each
    position's top logprobs list the chosen token first."""
    tok = server.runtime.tokenizer
    text = "ok 👋🏽 你好"
    ids = tok.encode(text)
    assert any(tok.decode([i]).endswith("\ufffd") for i in ids)  # (the case is there)
    body = {"prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 1}
    lp = _post(server, "/v1/completions", body).json()["choices"][0]["logprobs"]
    prompt_tokens = lp["tokens"][: len(ids)]
    assert "".join(prompt_tokens[1:]) == text[len(prompt_tokens[0]) :]
    assert "" in prompt_tokens and not any("bytes:" in t for t in lp["tokens"])
    offsets = lp["text_offset"]
    assert offsets == [len("".join(lp["tokens"][:k])) for k in range(len(lp["tokens"]))]
    for token, value, top in zip(
        lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:]
    ):
        assert next(iter(top.items())) == (token, value)
    chat = _post(
        server,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 12,
            "logprobs": True,
            "top_logprobs": 1,
        },
    ).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert any(e["token"] == "" and e["bytes"] == [] for e in content)
    assert all(e["top_logprobs"][0]["token"] == e["token"] for e in content)
    assert "👋🏽" in "".join(e["token"] for e in content)


def test_logprob_fields_as_vllm_reads_them(server):
    """vLLM's request models read ``logprobs: "true"`` as true, and -1 as the whole vocabulary
    (within --max-logprobs, which a spawned vLLM engine is given too)."""
    from tokenwire.entrypoints.options.engine import vllm_engines

    body = {"messages": MESSAGES, "max_tokens": 2, "logprobs": "true", "top_logprobs": 1}
    got = _post(server, "/v1/chat/completions", body)
    assert got.status_code == 200 and got.json()["choices"][0]["logprobs"]["content"]
    got = _post(server, "/v1/chat/completions", body | {"logprobs": "maybe"})
    assert got.status_code == 400 and got.json()["error"]["param"] == "logprobs"
    got = _post(server, "/v1/chat/completions", body | {"top_logprobs": -1})
    assert got.status_code == 400 and "max_logprobs" in got.json()["error"]["message"]
    got = _post(server, "/v1/completions", {"prompt": "x", "prompt_logprobs": -1})
    assert got.status_code == 400 and got.json()["error"]["param"] == "prompt_logprobs"
    args = build_parser().parse_args(
        ["serve", "--engine", "vllm", "--model", "m", "--max-logprobs", "151936"]
    )
    _, launcher = vllm_engines(args)
    launcher.port = 1  # (the handshake's port, set when tokenwire binds it)
    assert launcher.argv[-2:] == ["--max-logprobs", "151936"] or ("--max-logprobs" in launcher.argv)


@pytest.fixture(scope="module")
def sampler() -> Iterator[Any]:
    with serve(SyntheticConfig(output="random", step_time=0.0)) as s:
        yield s


@pytest.mark.parametrize("penalty", [1.0, 0.0, 2.0])
def test_beam_search_in_the_frontend(sampler, penalty):
    """vLLM's beam search over ordinary engine requests with logprobs: n beams, best first by
    cumulative logprob over length ** length_penalty (the prompt counts in the length)."""
    body = {"prompt": "a b c", "max_tokens": 4, "n": 3, "temperature": 0, "logprobs": 0}
    body |= {"use_beam_search": True, "length_penalty": penalty}
    got = _post(sampler, "/v1/completions", body)
    assert got.status_code == 200, got.text
    choices = got.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    prompt_len = got.json()["usage"]["prompt_tokens"]
    scores = []
    for c in choices:
        lps = c["logprobs"]["token_logprobs"]
        assert c["finish_reason"] in ("length", "stop") and len(lps) <= 4
        scores.append(sum(lps) / (prompt_len + len(lps)) ** penalty)
    assert scores == sorted(scores, reverse=True)
    texts = [c["text"] for c in choices]
    assert len(set(texts)) == 3  # distinct beams
    chat = _post(
        sampler,
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 3, "n": 2, "use_beam_search": True},
    )
    assert chat.status_code == 200 and len(chat.json()["choices"]) == 2


def test_beam_search_refuses_streaming_by_name(sampler):
    body = {"prompt": "a", "max_tokens": 2, "n": 2, "use_beam_search": True, "stream": True}
    got = _post(sampler, "/v1/completions", body)
    assert got.status_code == 400
    assert got.json()["error"]["message"] == "Streaming is not currently supported with beam search"
    got = _post(sampler, "/v1/completions", body | {"stream": False, "length_penalty": "x"})
    assert got.status_code == 400 and got.json()["error"]["param"] == "length_penalty"
    # without use_beam_search, a length_penalty other than 1 is still refused by name
    got = _post(sampler, "/v1/completions", {"prompt": "a", "length_penalty": 2.0})
    assert got.status_code == 400 and got.json()["error"]["param"] == "length_penalty"
