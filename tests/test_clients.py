"""What real clients send, replayed: every request body in ``tests/clients/`` (captured from the
openai, langchain-openai, litellm, anthropic and openai-agents packages, reconstructed from the
source of guidellm, aiperf, SGLang's bench_serving, vLLM's benchmark and lm-eval) goes to a live
server over the echo engine, and the answer must be exactly the echo of the prompt the server
rendered: the text, the finish, the usage, in the client's own streaming or non-streaming shape
(the Responses API's and the Messages API's included)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.runtime import Features
from tokenwire.server import ServerConfig, create_app
from tokenwire.server.anthropic.request import read_count_tokens, read_messages
from tokenwire.server.responses.request import read_request

from api_echo import sse_events
from conftest import real_tokenizer
from served import run_tokenwire

CLIENTS = Path(__file__).resolve().parent / "clients"
MODEL = "Qwen/Qwen3-0.6B"


def _cases() -> list[Any]:
    out = []
    for path in sorted(CLIENTS.glob("*.json")):
        corpus = json.loads(path.read_text(encoding="utf-8"))
        for k, req in enumerate(corpus["requests"]):
            out.append(pytest.param(req, id=f"{path.stem}-{k}-{req['name']}"))
    return out


@contextlib.contextmanager
def _serve() -> Iterator[str]:
    tok = real_tokenizer("default")
    engine = SyntheticEngine(tok, SyntheticConfig(output="echo", step_time=0.0))
    # The echo replays the prompt, whose tools section holds hermes' <tool_call> trigger: a
    # client's strict tools (openai-agents marks them so) would constrain the echo from there.
    features = Features(
        tool_call_parser="hermes", enable_auto_tool_choice=True, tool_strict_level="off"
    )
    config = ServerConfig(model_name=MODEL, access_log=False, features=features)
    with run_tokenwire(create_app(tok, engine, config)) as url:
        yield url


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with _serve() as u:
        yield u


def test_the_corpus_covers_every_client():
    names = {p.stem for p in CLIENTS.glob("*.json")}
    assert names >= {
        "openai",
        "langchain-openai",
        "litellm",
        "guidellm",
        "aiperf",
        "sglang-bench-serving",
        "vllm-bench",
        "lm-eval",
        "anthropic",
        "openai-agents",
    }


# ---- what the echo engine must answer ------------------------------------------------------------


def _prompts(url: str, req: dict) -> list[list[int]]:
    """The prompt ids the server works on, as the client's body asks (chat: /tokenize renders)."""
    tok = real_tokenizer("default")
    body = req["body"]
    # The other conversational APIs: the chat request they amount to.
    if req["path"] == "/v1/responses":
        body = read_request(body).chat
    elif req["path"] == "/v1/messages":
        body = read_messages(body).chat
    elif req["path"] == "/v1/messages/count_tokens":
        body = read_count_tokens(body)
    if "messages" in body:
        keys = ("messages", "tools", "chat_template_kwargs", "add_generation_prompt")
        ask = {k: body[k] for k in keys if body.get(k) is not None}
        r = httpx.post(url + "/tokenize", json=ask, timeout=30)
        assert r.status_code == 200, r.text
        return [r.json()["tokens"]]
    value = body["prompt"] if req["path"] == "/v1/completions" else body.get("text")
    if value is None:
        value = body["input_ids"]
    if isinstance(value, str) or (value and isinstance(value[0], int)):
        value = [value]
    return [tok.encode(v) if isinstance(v, str) else list(v) for v in value]


def _expected(req: dict, ids: list[int]) -> tuple[str, int]:
    """The echo engine's answer to ``ids``: (text, completion tokens)."""
    tok = real_tokenizer("default")
    body = req["body"]
    sp = body.get("sampling_params") or {}
    limit = body.get("max_tokens", body.get("max_completion_tokens", sp.get("max_new_tokens")))
    limit = body.get("max_output_tokens", limit)  # the Responses API's
    ignore_eos = body.get("ignore_eos", sp.get("ignore_eos", False))
    k = len(ids) if limit is None else min(limit, len(ids))
    if not ignore_eos:
        eos = [i for i, t in enumerate(ids[:k]) if t in tok.eos_token_ids]
        if eos:
            k = eos[0] + 1
    text = tok.decode(ids[:k])
    stops = body.get("stop") or body.get("stop_sequences") or sp.get("stop") or []
    stops = [stops] if isinstance(stops, str) else stops
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    text = text[:cut] if cut >= 0 else text
    if body.get("echo"):  # lm-eval's loglikelihood: the prompt comes back in front
        text = tok.decode(ids) + text
    return text, k


# ---- reading the answer --------------------------------------------------------------------------


def _events(raw: str) -> list[Any]:
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    out = []
    for block in raw.split("\n\n")[:-2]:
        assert block.startswith("data: "), block
        out.append(json.loads(block[len("data: ") :]))
    return out


def _answers(req: dict, resp: httpx.Response) -> tuple[dict[int, str], dict[int, Any], list[Any]]:
    """Per choice index: the text and the tool calls; and every usage object seen."""
    route = req["path"]
    texts: dict[int, str] = {}
    calls: dict[int, Any] = {}
    usages = []
    if route in ("/v1/responses", "/v1/messages"):
        return _conversational(route, req["body"].get("stream"), resp)
    if req["body"].get("stream"):
        for event in _events(resp.text):
            assert "error" not in event, event
            if route == "/generate":
                texts[event.get("index", 0)] = event["text"]  # cumulative
                continue
            if event.get("usage") is not None:
                usages.append(event["usage"])
            for ch in event["choices"]:
                i = ch["index"]
                if route == "/v1/chat/completions":
                    piece = ch["delta"].get("content") or ""
                    if ch["delta"].get("tool_calls"):
                        calls.setdefault(i, []).extend(ch["delta"]["tool_calls"])
                else:
                    piece = ch["text"]
                texts[i] = texts.get(i, "") + piece
        return texts, calls, usages
    data = resp.json()
    if route == "/generate":
        for i, item in enumerate(data if isinstance(data, list) else [data]):
            texts[i] = item["text"]
        return texts, calls, usages
    usages.append(data["usage"])
    for ch in data["choices"]:
        if route == "/v1/chat/completions":
            texts[ch["index"]] = ch["message"]["content"] or ""
            if ch["message"].get("tool_calls"):
                calls[ch["index"]] = ch["message"]["tool_calls"]
        else:
            texts[ch["index"]] = ch["text"]
    return texts, calls, usages


def _conversational(route: str, stream: bool, resp: httpx.Response) -> tuple:
    """A Responses API or Messages API answer: its text, its calls and its usage, in the chat
    route's words."""
    text, calls = "", []
    if route == "/v1/responses":
        if stream:
            events = [data for _, data in sse_events(resp.text)]
            assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
            text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
            body = events[-1]["response"]
        else:
            body = resp.json()
        for item in body["output"]:
            if item["type"] == "function_call":
                calls.append(item)
            elif not stream:
                text += "".join(part["text"] for part in item["content"])
        use = body["usage"]
        usage = {"prompt_tokens": use["input_tokens"], "completion_tokens": use["output_tokens"]}
    else:
        if stream:
            events = sse_events(resp.text)
            assert events[-1][0] == "message_stop", events[-1]
            use = {**events[0][1]["message"]["usage"], **events[-2][1]["usage"]}
            for name, data in events:
                if name == "content_block_start" and data["content_block"]["type"] == "tool_use":
                    calls.append(data["content_block"])
                elif name == "content_block_delta" and data["delta"]["type"] == "text_delta":
                    text += data["delta"]["text"]
        else:
            body = resp.json()
            use = body["usage"]
            calls = [b for b in body["content"] if b["type"] == "tool_use"]
            text = "".join(b["text"] for b in body["content"] if b["type"] == "text")
        prompt = use["input_tokens"] + use.get("cache_read_input_tokens", 0)
        usage = {"prompt_tokens": prompt, "completion_tokens": use["output_tokens"]}
    return {0: text}, ({0: calls} if calls else {}), [usage]


@pytest.mark.parametrize("req", _cases())
def test_a_real_clients_request_gets_the_right_answer(url, req):
    resp = httpx.request(req["method"], url + req["path"], json=req["body"], timeout=60)
    if req["path"] == "/v1/messages/count_tokens":
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"input_tokens": len(_prompts(url, req)[0])}
        return
    if "expect_error" in req:
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] in req["expect_error"]  # a field it cannot honour
        return
    assert resp.status_code == 200, resp.text
    prompts = _prompts(url, req)
    n = req["body"].get("n") or 1
    texts, calls, usages = _answers(req, resp)
    assert sorted(texts) == list(range(len(prompts) * n))
    total = 0
    for index, text in texts.items():
        want, k = _expected(req, prompts[index // n])
        total += k
        if index not in calls:  # a parsed tool call replaces text by design
            assert text == want, (index, text, want)
    if req["body"].get("logprobs") and not req["body"].get("stream"):
        for ch in resp.json()["choices"]:  # one logprob entry per token (echoed prompt too)
            want = len(prompts[0]) * bool(req["body"].get("echo")) + total
            assert len(ch["logprobs"]["tokens"]) == want
    if usages:
        assert usages[-1]["prompt_tokens"] == sum(len(p) for p in prompts)
        assert usages[-1]["completion_tokens"] == total
    opts = req["body"].get("stream_options") or {}
    if opts.get("include_usage") and opts.get("continuous_usage_stats"):
        chunks = _events(resp.text)
        assert all(c.get("usage") is not None for c in chunks)
