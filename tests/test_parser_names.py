"""Peers' parser names, strict tools under ``tool_choice: auto``, and the newer families end to
end: a command line written for SGLang, smg or vLLM 0.33 starts tokenwire unchanged; a strict
tool's call follows its schema once the model starts it (``--tool-strict-level``,
``SGLANG_TOOL_STRICT_LEVEL``); and the ``openai`` client streams the calls of three of the new
families through ``tokenwire serve`` (its synthetic engine echoing a recorded output)."""

from __future__ import annotations

import argparse
import json

import openai
import pytest

from parser_corpus import TOOL_FORMATS, TOOLS, WEATHER
from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.entrypoints.options import output
from tokenwire.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from tokenwire.parsers.names import (
    REASONING_PARSER_ALIASES,
    TOOL_PARSER_ALIASES,
    resolve_reasoning_parser,
    resolve_tool_parser,
)
from tokenwire.runtime import Features

from test_listening import MODEL as PROCESS_MODEL
from test_listening import free_port
from test_listening import serve as serve_process
from test_server_e2e import MODEL, serve


def _names(text: str) -> list[str]:
    return text.split()


#: SGLang 0.5.23's names (``function_call/parser_names.py``, ``parser/reasoning_parser_names.py``).
SGLANG_TOOL_NAMES = _names(
    """apertus2509 beam cohere_command4 deepseekv3 deepseekv31 deepseekv32
deepseekv4 deepseekv41 dots glm glm45 glm47 gpt-oss k2_horizon kimi_k2 kimi_k3 lfm2 ling3 llama3
mimo minicpm5 mistral muse poolside_v1 pythonic qwen qwen25 qwen3_coder spark25 step3 step3p5
minimax-m2 minimax-m3 nanbeige trinity interns1 hermes hunyuan gigachat3 gigachat35 gemma4 inkling
iquest_q1 response_template"""
)
SGLANG_REASONING_NAMES = _names(
    """apertus2509 beam deepseek-r1 deepseek-v3 deepseek-v4 deepseek-v41 dots
glm45 ling3 hunyuan gpt-oss k2_horizon kimi kimi_k2 kimi_k3 mimo muse poolside_v1 qwen3
qwen3-thinking minimax minimax-append-think minimax-m3 nanbeige step3 step3p5 mistral nemotron_3
granite_thinking_parser interns1 gemma4 inkling iquest_q1 cohere_command4 gigachat35
response_template"""
)
#: vLLM 0.33's names (``tool_parsers/__init__.py``, ``reasoning/__init__.py``).
VLLM_TOOL_NAMES = _names(
    """apertus beam cohere_command3 cohere_command4 deepseek_v3 deepseek_v31
deepseek_v32 deepseek_v4 deepseek_v41 dots ernie45 functiongemma gemma4 gigachat3 glm45 glm47
granite granite-20b-fc granite4 hermes hf hunyuan_a13b hy_v3 hy_v4 inkling internlm jamba k2_horizon
kimi_k2 kimi_k3 lfm2 ling3 llama3_json llama4_json llama4_pythonic longcat mimo minicpm5 minimax_m2
minimax_m3 mistral muse muse_glimmer musespark1x olmo3 openai phi4_mini_json plamo3 poolside_v1
pythonic qwen3_coder qwen3_json qwen3_xml seed_oss step3 step3p5 step5 xlam"""
)
VLLM_REASONING_NAMES = _names(
    """beam cohere_command3 cohere_command4 deepseek_r1 deepseek_v3 deepseek_v4
deepseek_v41 ernie45 gemma4 glm45 glm47 granite granite_thinking_parser hf holo2 hunyuan_a13b hy_v3
hy_v4 inkling k2_horizon kimi_k2 kimi_k3 ling3 mimo minicpmv minimax_m2 minimax_m2_append_think
minimax_m3 mistral muse muse_glimmer musespark1x nemotron_v3 olmo3 openai_gptoss plamo3
poolside_v1 qwen3 seed_oss step3 step3p5 step5"""
)
#: vLLM's names tokenwire leaves out, and why (docs/parsers.md says more).
LEFT_OUT = {"reasoning": {"minicpmv"}}


def test_every_peer_name_selects_a_parser() -> None:
    for name in SGLANG_TOOL_NAMES + VLLM_TOOL_NAMES:
        assert resolve_tool_parser(name) in TOOL_CALL_PARSERS, name
    for name in SGLANG_REASONING_NAMES + VLLM_REASONING_NAMES:
        if name not in LEFT_OUT["reasoning"]:
            assert resolve_reasoning_parser(name) in REASONING_PARSERS, name
    for table in (TOOL_PARSER_ALIASES, REASONING_PARSER_ALIASES):
        for alias, (name, whose) in table.items():
            assert whose and alias != name


@pytest.mark.parametrize("name", SGLANG_TOOL_NAMES)
def test_start_with_sglang_tool_parser_name(name: str) -> None:
    """The start path of ``tokenwire serve`` (its flags read into ``Features``) takes every
    name SGLang's ``--tool-call-parser`` does."""
    parser = argparse.ArgumentParser()
    output.add_arguments(parser)
    args = parser.parse_args(["--tool-call-parser", name, "--enable-auto-tool-choice"])
    features = output.features(args)
    assert features.tool_call_parser == resolve_tool_parser(name)


@pytest.mark.parametrize("name", SGLANG_REASONING_NAMES)
def test_start_with_sglang_reasoning_parser_name(name: str) -> None:
    parser = argparse.ArgumentParser()
    output.add_arguments(parser)
    features = output.features(parser.parse_args(["--reasoning-parser", name]))
    assert features.reasoning_parser == resolve_reasoning_parser(name)


def test_calls_counts_the_calls_of_every_parser() -> None:
    """Every parser's ``calls`` is the number of calls begun (the stream's finish reason reads
    it; a format's own ``calls`` method once shadowed it)."""
    for family, fmt in TOOL_FORMATS.items():
        cls = TOOL_CALL_PARSERS[family]
        if getattr(cls, "needs_template", False):
            continue
        parser = cls(tools=TOOLS)
        parser.parse(fmt.render([WEATHER]).removeprefix(fmt.no_open))
        assert isinstance(parser.calls, int) and parser.calls == 1, family


def test_unknown_name_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="'nonesuch'"):
        Features(tool_call_parser="nonesuch")


def test_help_lists_the_peers_names() -> None:
    parser = argparse.ArgumentParser()
    output.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    for alias in ("qwen25 (hermes)", "deepseek-r1 (deepseek_r1)", "openai_gptoss (gpt_oss)"):
        assert alias in text, alias


def test_strict_level_from_sglangs_variable() -> None:
    assert output.tool_strict_level(None, {}) == "auto"
    assert output.tool_strict_level(None, {"SGLANG_TOOL_STRICT_LEVEL": "1"}) == "function"
    assert output.tool_strict_level(None, {"SGLANG_TOOL_STRICT_LEVEL": "2"}) == "parameter"
    assert output.tool_strict_level("auto", {"SGLANG_TOOL_STRICT_LEVEL": "2"}) == "auto"
    assert output.tool_strict_level(None, {"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"}) == "off"
    with pytest.raises(ValueError, match="SGLANG_TOOL_STRICT_LEVEL"):
        output.tool_strict_level(None, {"SGLANG_TOOL_STRICT_LEVEL": "7"})


# ---- a real start with peers' names, and the new families through the openai client ---------

ECHO = "{{ messages[-1]['content'] }}"


@pytest.fixture(scope="module")
def echo_template(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("template") / "echo.jinja"
    path.write_text(ECHO, encoding="utf-8")
    return str(path)


def _stream_calls(client: openai.OpenAI, text: str) -> tuple[str, list[dict]]:
    content, calls = "", {}
    stream = client.chat.completions.create(
        model=PROCESS_MODEL,
        messages=[{"role": "user", "content": text}],
        tools=TOOLS,
        stream=True,
        max_tokens=400,
    )
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.function.name, "a call's first delta has its id and name"
                    calls[tc.index] = {"name": tc.function.name, "arguments": ""}
                calls[tc.index]["arguments"] += tc.function.arguments or ""
    return content, [calls[k] for k in sorted(calls)]


@pytest.mark.parametrize(
    ("family", "flags"),
    [
        ("kimi_k3", ["--tool-call-parser", "kimi_k3", "--reasoning-parser", "kimi_k3"]),
        # SGLang's names for both: a real start with them
        ("deepseek_v4", ["--tool-call-parser", "deepseekv4", "--reasoning-parser", "deepseek-v4"]),
        ("glm47", ["--tool-call-parser", "glm47_moe"]),  # smg's name
    ],
)
def test_openai_client_streams_a_new_familys_calls(
    echo_template: str, family: str, flags: list[str]
) -> None:
    """``tokenwire serve`` with a peer's parser names serves the family's calls (an echo of its
    recorded output) to the ``openai`` client as OpenAI's streamed tool calls."""
    fmt = TOOL_FORMATS[family]
    text = "Checking the weather. " + fmt.render([WEATHER, ("now", {})])
    port = free_port()
    flags = [*flags, "--synthetic-output", "echo", "--chat-template", echo_template]
    with serve_process(*flags, "--enable-auto-tool-choice", "--port", str(port)):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        content, calls = _stream_calls(client, text)
    assert content.strip() == "Checking the weather."
    assert [c["name"] for c in calls] == ["get_weather", "now"]
    assert json.loads(calls[0]["arguments"]) == WEATHER[1]
    assert json.loads(calls[1]["arguments"]) == {}


# ---- strict tools under tool_choice auto -----------------------------------------------------

STRICT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        },
    }
]
#: The recorded output the echo engine replays: a call whose arguments break the schema.
OFF_SCHEMA = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": 7, "days": "x"}}\n</tool_call>'
)


def _strict_server(level: str):
    features = Features(
        chat_template=ECHO,
        tool_call_parser="hermes",
        enable_auto_tool_choice=True,
        tool_strict_level=level,
    )
    return serve(SyntheticConfig(output="echo"), features=features)


def _call(s, tools: list[dict]) -> tuple[str, list]:
    r = s.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Sure. " + OFF_SCHEMA}],
        tools=tools,
        tool_choice="auto",
        max_tokens=120,
    )
    m = r.choices[0].message
    return m.content or "", m.tool_calls or []


def test_strict_tool_under_auto_follows_its_schema() -> None:
    """With a strict tool and tool_choice auto, text stays free and the call, once the model
    starts it, has arguments of the tool's schema (the echo wrote a string where an integer
    goes); without strict the recorded arguments come back as written."""
    with _strict_server("auto") as s:
        content, calls = _call(s, STRICT_TOOLS)
        assert content.strip() == "Sure."
        assert len(calls) == 1 and calls[0].function.name == "get_weather"
        args = json.loads(calls[0].function.arguments)
        assert isinstance(args["city"], str) and isinstance(args["days"], int)
        loose = [{"type": "function", "function": {**STRICT_TOOLS[0]["function"]}}]
        del loose[0]["function"]["strict"]
        _, calls = _call(s, loose)
        assert json.loads(calls[0].function.arguments) == {"city": 7, "days": "x"}


def test_parameter_level_pins_every_tool() -> None:
    loose = [{"type": "function", "function": {**STRICT_TOOLS[0]["function"]}}]
    del loose[0]["function"]["strict"]
    with _strict_server("parameter") as s:
        _, calls = _call(s, loose)
    args = json.loads(calls[0].function.arguments)
    assert isinstance(args["city"], str) and isinstance(args["days"], int)


def test_a_format_without_a_json_head_is_not_constrained() -> None:
    """Qwen3-Coder's XML parameters are no JSON after a fixed head: no structural tag."""
    from tokenwire.server.openai.tools import strict_tag

    features = Features(tool_call_parser="qwen3_coder", enable_auto_tool_choice=True)
    body = {"tools": STRICT_TOOLS, "tool_choice": "auto"}
    assert strict_tag(body, features, TOOL_CALL_PARSERS["qwen3_coder"]) is None
    tag = json.loads(strict_tag(body, features, TOOL_CALL_PARSERS["hermes"]) or "{}")
    assert tag["triggers"] == ["<tool_call>"]
    assert tag["structures"][0]["schema"] == STRICT_TOOLS[0]["function"]["parameters"]


def test_corpus_formats_are_strict_heads() -> None:
    """A format's strict head is what its own renderer writes before the arguments."""
    for family in ("hermes", "internlm", "mistral", "deepseek_v31", "kimi_k2", "gigachat3"):
        call = TOOL_CALL_PARSERS[family].strict_call("get_weather")
        assert call is not None, family
        trigger, begin, _ = call
        text = TOOL_FORMATS[family].render([WEATHER])
        assert text.startswith(begin) or begin in text, family
        assert trigger in text, family
