"""vLLM's and SGLang's utility routes: /tokenize, /detokenize, /version, /ping, /get_model_info,
/get_server_info and /abort_request, as functions and over HTTP."""

from __future__ import annotations

import threading

import httpx
import pytest

from tokenwire import Tokenizer, ValidationError, __version__
from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.messages.errors import ModelNotFoundError
from tokenwire.server import utility

from test_server_e2e import MODEL, serve, wait_until


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.default()


def test_tokenize_a_prompt_and_a_chat(tok):
    out = utility.tokenize({"prompt": "Hello, 世界", "return_token_strs": True}, tok, "m")
    ids = tok.encode("Hello, 世界")
    assert out == {
        "count": len(ids),
        "max_model_len": 40960,
        "tokens": ids,
        "token_strs": [tok.id_to_token(i) for i in ids],
    }
    chat = utility.tokenize(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}, tok, "m"
    )
    text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert chat["tokens"] == tok.encode(text, add_special_tokens=False)
    assert chat["token_strs"] is None
    closed = utility.tokenize(
        {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": False}, tok, "m"
    )
    assert (
        tok.decode(closed["tokens"], skip_special_tokens=False)
        == text[: text.index("<|im_start|>a")]
    )
    with pytest.raises(ValidationError, match="prompt"):
        utility.tokenize({"prompt": 5}, tok, "m")
    with pytest.raises(ModelNotFoundError):
        utility.tokenize({"prompt": "x", "model": "other"}, tok, "m")


def test_detokenize(tok):
    ids = tok.encode("<|im_start|>user\nHi ✓", add_special_tokens=False)
    text = "<|im_start|>user\nHi ✓"
    assert utility.detokenize({"tokens": ids}, tok, "m") == {"prompt": text}  # vLLM's shape
    # a model row past the tokenizer (a padding id) has no text, as in generated output
    assert utility.detokenize({"tokens": [*ids, 151935]}, tok, "m")["prompt"] == text
    # SGLang's /v1/detokenize: special tokens skipped by default, batches of id lists
    got = utility.detokenize(
        {"tokens": [ids, ids[-2:]]}, tok, "m", skip_special=True, keys=("text",)
    )
    assert got["text"] == ["user\nHi ✓", tok.decode(ids[-2:])]
    got = utility.detokenize(
        {"tokens": ids, "skip_special_tokens": False}, tok, "m", skip_special=True, keys=("text",)
    )
    assert got["text"] == text
    with pytest.raises(ValidationError, match="out of range"):
        utility.detokenize({"tokens": [-1]}, tok, "m")
    with pytest.raises(ValidationError, match="list of token ids"):
        utility.detokenize({"tokens": "12"}, tok, "m")


def test_parse_abort():
    assert utility.parse_abort({"rid": "r1"}) == utility.AbortRequest("r1", False)
    assert utility.parse_abort({"abort_all": True}) == utility.AbortRequest("", True)
    with pytest.raises(ValidationError, match="rid"):
        utility.parse_abort({})
    with pytest.raises(ValidationError, match="abort_all"):
        utility.parse_abort({"rid": "x", "abort_all": "yes"})


def test_info_routes_over_http():
    with serve(SyntheticConfig(output="echo", step_time=0.0)) as s:
        assert httpx.get(s.url + "/version").json() == {
            "version": __version__,  # (vLLM's version when the engine is vLLM)
            "tokenwire_version": __version__,
        }
        for method in ("GET", "POST"):
            assert httpx.request(method, s.url + "/ping").status_code == 200
        info = httpx.get(s.url + "/get_model_info").json()
        assert info["model_path"] == MODEL and info["is_generation"] is True
        server = httpx.get(s.url + "/get_server_info").json()
        assert server["version"] == __version__ and server["context_length"] == 40960
        assert server["internal_states"] == [{"num_running_reqs": 0}]
        r = httpx.post(s.url + "/tokenize", json={"model": MODEL, "prompt": "a b c"})
        assert r.json()["tokens"] == s.tok.encode("a b c")
        r = httpx.post(s.url + "/detokenize", json={"model": MODEL, "tokens": r.json()["tokens"]})
        assert r.json() == {"prompt": "a b c"}  # vLLM's shape (SGLang's /v1/detokenize: text)
        r = httpx.post(s.url + "/detokenize", json={"model": "nope", "tokens": [1]})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_abort_request_ends_the_request_with_finish_reason_abort():
    with serve(SyntheticConfig(output="random", step_time=0.01)) as s:
        results: dict[str, object] = {}

        def generate():
            body = {"text": "x", "rid": "job-7", "sampling_params": {"max_new_tokens": 30000}}
            results["generate"] = httpx.post(s.url + "/generate", json=body, timeout=30).json()

        def chat():
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "request_id": "conv-1",
                "n": 2,
                "stream": True,
            }
            with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=30) as r:
                results["chat"] = r.read().decode()

        threads = [threading.Thread(target=generate), threading.Thread(target=chat)]
        for t in threads:
            t.start()
        wait_until(lambda: len(s.runtime.shard) == 3)
        assert len(s.runtime.shard) == 3
        r = httpx.post(s.url + "/abort_request", json={"rid": "job-7"})
        assert r.status_code == 200 and r.json() == {"aborted": 1}
        r = httpx.post(s.url + "/abort_request", json={"rid": "conv-1"})
        assert r.json() == {"aborted": 2}
        for t in threads:
            t.join(10)
        meta = results["generate"]["meta_info"]
        assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] > 0
        assert results["chat"].count('"finish_reason":"abort"') == 2
        assert results["chat"].endswith("data: [DONE]\n\n")
        wait_until(lambda: s.engine.running == 0)
        assert s.engine.running == 0 and len(s.runtime.shard) == 0
        assert httpx.post(s.url + "/abort_request", json={"abort_all": True}).json() == {
            "aborted": 0
        }
