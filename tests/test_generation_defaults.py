"""The model's generation defaults (``--generation-config``, ``--override-generation-config``) and
``--default-chat-template-kwargs``, as vLLM names and applies them: a request that omits a field
gets the model's value, one that sets it keeps its own."""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys

import pytest

from tokenwire import Tokenizer
from tokenwire.entrypoints.cli import build_parser
from tokenwire.entrypoints.options import output
from tokenwire.generation_config import GenerationDefaults, load_generation_defaults
from tokenwire.runtime import Features
from tokenwire.server.generate import parse_generate
from tokenwire.server.openai.parse import parse_chat, parse_completion

from conftest import REPO

QWEN3 = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0, "max_new_tokens": 9}


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.default()


def model_dir(tmp_path, config: dict) -> str:
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    return str(tmp_path)


def features(**values) -> Features:
    return Features(generation_defaults=GenerationDefaults(values, "test"))


def test_auto_reads_the_model_folder_vllm_reads_none_a_folder_its_own(tmp_path):
    folder = model_dir(tmp_path, {**QWEN3, "bos_token_id": 1, "do_sample": True})
    got = load_generation_defaults("auto", folder)
    assert dict(got.values) == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "min_p": 0,
        "max_new_tokens": 9,
    }
    assert "temperature=0.6" in got.describe() and folder in got.describe()
    assert load_generation_defaults("vllm", folder).values == {}
    assert load_generation_defaults("vllm", folder).describe() == "none"
    assert load_generation_defaults(folder, None).values == got.values
    # --override-generation-config goes on top, with either
    over = load_generation_defaults("auto", folder, {"temperature": 0.2, "top_k": 0})
    assert over.values["temperature"] == 0.2 and over.values["top_k"] == -1
    assert load_generation_defaults("vllm", folder, {"top_p": 0.5}).values == {"top_p": 0.5}
    # vLLM caps every request by a named folder's max_new_tokens, or the override's; the
    # model's own (auto) is a default only
    assert got.max_tokens_cap is None
    assert load_generation_defaults(folder, None).max_tokens_cap == 9
    assert load_generation_defaults("auto", folder, {"max_new_tokens": 4}).max_tokens_cap == 4
    # no folder: what the tokenizer read from its own
    assert load_generation_defaults("auto", None, model_generation_config={"top_k": 5}).values == {
        "top_k": 5
    }
    assert load_generation_defaults("auto", str(tmp_path / "none")).values == {}


def test_bad_defaults_fail_at_startup(tmp_path):
    with pytest.raises(ValueError, match="top_p"):
        load_generation_defaults("auto", model_dir(tmp_path, {"top_p": 7}))
    with pytest.raises(ValueError, match="temperature"):
        load_generation_defaults("vllm", None, {"temperature": "hot"})
    with pytest.raises(ValueError, match="not auto, vllm or a folder"):
        load_generation_defaults(str(tmp_path / "missing"), None)


def test_requests_that_omit_a_field_get_the_models_default(tok):
    f = features(**{k: v for k, v in QWEN3.items() if k != "min_p"}, repetition_penalty=1.1)
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    p = parse_chat(body, tok, "m", features=f).params
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (0.6, 0.95, 20, 1.1)
    assert p.max_new_tokens == 9  # chat: the model's max_new_tokens (vLLM's)
    # what the request says wins, each field on its own
    p = parse_chat(
        {**body, "temperature": 1.0, "top_k": -1, "max_tokens": 30}, tok, "m", features=f
    )
    assert (p.params.temperature, p.params.top_p, p.params.max_new_tokens) == (1.0, 0.95, 30)
    # completions: max_tokens keeps OpenAI's 16, as vLLM's does; the sampling values apply
    p = parse_completion({"prompt": "Hi"}, tok, "m", features=f).params
    assert (p.temperature, p.top_k, p.max_new_tokens) == (0.6, 20, 16)
    # /generate: the sampling values (SGLang's preferred sampling params), its own 128 tokens
    p = parse_generate({"text": "Hi"}, tok, "m", features=f).params
    assert (p.temperature, p.top_k, p.max_new_tokens) == (0.6, 20, 128)
    p = parse_generate({"text": "Hi", "sampling_params": {"top_k": 3}}, tok, "m", features=f)
    assert p.params.top_k == 3 and p.params.top_p == 0.95
    # a cap (vLLM's override_max_tokens) holds whatever the request asks
    capped = Features(generation_defaults=GenerationDefaults({}, "test", 5))
    assert (
        parse_completion(
            {"prompt": "Hi", "max_tokens": 50}, tok, "m", features=capped
        ).params.max_new_tokens
        == 5
    )
    assert parse_chat(body, tok, "m", features=capped).params.max_new_tokens == 5
    assert (
        parse_chat({**body, "max_tokens": 3}, tok, "m", features=capped).params.max_new_tokens == 3
    )
    # a greedy model default (top_k 1) keeps decoding greedy
    assert parse_chat(body, tok, "m", features=features(top_k=1)).params.top_k == 1
    # no defaults: the API's own
    p = parse_chat(body, tok, "m").params
    assert (p.temperature, p.top_k > 1 << 20) == (1.0, True)


def test_default_chat_template_kwargs_under_the_requests(tok):
    f = Features(default_chat_template_kwargs={"enable_thinking": False})
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    off = parse_chat(body, tok, "m", features=f)
    on = parse_chat(
        {**body, "chat_template_kwargs": {"enable_thinking": True}}, tok, "m", features=f
    )
    plain = parse_chat(body, tok, "m")
    assert off.prompts != plain.prompts and on.prompts == plain.prompts
    assert "<think>" in tok.decode(off.prompts[0], False)  # Qwen3's empty thinking block


def test_flags_and_the_startup_line(tmp_path, tok):
    folder = model_dir(tmp_path, QWEN3)
    args = build_parser().parse_args(
        [
            "serve",
            "--tokenizer",
            folder,
            "--override-generation-config",
            '{"temperature": 0.3}',
            "--default-chat-template-kwargs",
            '{"enable_thinking": false}',
        ]
    )
    assert output.generation_defaults(args, tok).values["temperature"] == 0.3
    assert output.features(args).default_chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--override-generation-config", "[1]"])
    # the startup line says which defaults are in force
    bundled = REPO / "src" / "tokenwire" / "_data" / "qwen3"
    for name in ("tokenizer_config.json", "config.json"):
        (tmp_path / name).write_bytes((bundled / name).read_bytes())
    raw = (bundled / "tokenizer.json.xz").read_bytes()
    (tmp_path / "tokenizer.json").write_bytes(lzma.decompress(raw))
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenwire", "serve", "--tokenizer", folder, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(30)
    assert "generation defaults: temperature=0.6, top_p=0.95, top_k=20" in line, line
