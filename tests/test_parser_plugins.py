"""Parsers of one's own: the reference's example plugin (``examples/parser_plugin.py``) loads,
registers its parsers under their names, parses as documented whatever the split, and serves;
a plugin file that is missing, fails or registers nothing is a clear error that leaves the
registries as they were."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.parsers import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ParserPluginError,
    ReasoningParser,
    ToolCallParser,
    load_parser_plugin,
    merge_tool_deltas,
    register_reasoning_parser,
    register_tool_parser,
)
from tokenwire.parsers.output import OutputSpec

from conftest import examples

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "parser_plugin.py"


@pytest.fixture
def registries():
    """The registries as they were before the test, afterwards."""
    tools, reasonings = dict(TOOL_CALL_PARSERS), dict(REASONING_PARSERS)
    yield
    TOOL_CALL_PARSERS.clear()
    TOOL_CALL_PARSERS.update(tools)
    REASONING_PARSERS.clear()
    REASONING_PARSERS.update(reasonings)


def test_the_reference_shows_the_example_as_it_is() -> None:
    readme = (REPO / "docs" / "output.md").read_text(encoding="utf-8")
    assert EXAMPLE.read_text(encoding="utf-8") in readme


def test_example_registers_its_parsers(registries) -> None:
    assert load_parser_plugin(EXAMPLE) == ["acme", "acme_lines"]
    assert issubclass(TOOL_CALL_PARSERS["acme"], ToolCallParser)
    assert issubclass(REASONING_PARSERS["acme"], ReasoningParser)


ACME = (
    "<reflect>Weather 🌧 wanted.</reflect>Checking.\n"
    '<call>{"name": "get_weather", "arguments": {"city": "巴黎", "note": "</call>"}}</call>'
)
LINES = 'Sure.\n>>> get_weather {"city": "巴黎"}\n>>> now\nDone >>> x\n>>> cut {"a": '


def _parse(reasoning: str | None, tools: str, pieces: list[str]):
    spec = OutputSpec(
        REASONING_PARSERS[reasoning] if reasoning else None,
        False,
        TOOL_CALL_PARSERS[tools],
        lambda i: f"call{i}",
    )
    parser = spec.new()
    deltas = [parser.feed(p) for p in pieces] + [parser.finish()]
    calls = merge_tool_deltas(c for d in deltas for c in d.tool_calls)
    return (
        "".join(d.reasoning for d in deltas),
        "".join(d.content for d in deltas),
        [(c.name, c.arguments) for c in calls],
    )


def test_example_parses(registries) -> None:
    load_parser_plugin(EXAMPLE)
    assert _parse("acme", "acme", [ACME]) == (
        "Weather 🌧 wanted.",
        "Checking.\n",
        [("get_weather", '{"city": "巴黎", "note": "</call>"}')],
    )
    assert _parse(None, "acme_lines", [LINES]) == (
        "",
        'Sure.\nDone >>> x\n>>> cut {"a": ',
        [("get_weather", '{"city": "巴黎"}'), ("now", "{}")],
    )


@settings(max_examples=examples(60))
@given(cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=10))
def test_example_streams_as_it_parses(cuts: list[int]) -> None:
    load_parser_plugin(EXAMPLE)
    try:
        for reasoning, tools, text in (("acme", "acme", ACME), (None, "acme_lines", LINES)):
            points = sorted({c % (len(text) + 1) for c in cuts})
            pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
            assert _parse(reasoning, tools, pieces) == _parse(reasoning, tools, [text])
    finally:
        for name in ("acme", "acme_lines"):
            TOOL_CALL_PARSERS.pop(name, None)
            REASONING_PARSERS.pop(name, None)


def test_example_serves(registries) -> None:
    """A registered parser needs nothing more of the server: its name selects it."""
    from test_server_tools import ECHO_TEMPLATE, END
    from tokenwire.runtime import Features

    from test_server_e2e import MODEL, serve

    load_parser_plugin(EXAMPLE)
    features = Features(
        chat_template=ECHO_TEMPLATE,
        tool_call_parser="acme",
        reasoning_parser="acme",
        enable_auto_tool_choice=True,
    )
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    with serve(SyntheticConfig(output="echo"), features=features) as s:
        reply = s.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": ACME + END}],
            tools=tools,
            max_tokens=200,
        )
    message = reply.choices[0].message
    assert (message.model_extra or {}).get("reasoning") == "Weather 🌧 wanted."
    assert message.content == "Checking.\n"
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("get_weather", '{"city": "巴黎", "note": "</call>"}')
    ]
    assert reply.choices[0].finish_reason == "tool_calls"


def test_missing_plugin(registries, tmp_path: Path) -> None:
    with pytest.raises(ParserPluginError, match="no such file"):
        load_parser_plugin(tmp_path / "nope.py")


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("raise RuntimeError('broken on purpose')", "failed: RuntimeError: broken on purpose"),
        ("def f(:\n", "failed: SyntaxError"),
        ("x = 1", "registered no parser"),
    ],
)
def test_failing_plugin_leaves_the_registries(registries, tmp_path: Path, source, match) -> None:
    tools, reasonings = dict(TOOL_CALL_PARSERS), dict(REASONING_PARSERS)
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "from tokenwire.parsers import register_tool_parser, JsonToolParser, JsonMarkup\n"
        "@register_tool_parser('half_done')\n"
        "class P(JsonToolParser):\n"
        "    markup = JsonMarkup({'<x>': '</x>'})\n"
        if "registered" not in match
        else ""
    )
    plugin.write_text(plugin.read_text() + source)
    with pytest.raises(ParserPluginError, match=match):
        load_parser_plugin(plugin)
    assert (tools, reasonings) == (TOOL_CALL_PARSERS, REASONING_PARSERS)


def test_register_checks_what_it_registers(registries) -> None:
    with pytest.raises(TypeError, match="ToolCallParser"):
        register_tool_parser("x")(ReasoningParser)
    with pytest.raises(TypeError, match="ReasoningStream"):
        register_reasoning_parser("x")(ToolCallParser)
    with pytest.raises(ValueError, match="needs a name"):
        register_tool_parser()(type("Nameless", (ToolCallParser,), {}))

    @register_tool_parser()
    class Named(ToolCallParser):
        name = "named_by_class"

    assert TOOL_CALL_PARSERS["named_by_class"] is Named
    register_tool_parser("hermes")(Named)  # a plugin may replace a built-in parser
    assert TOOL_CALL_PARSERS["hermes"] is Named and Named.name == "hermes"


def test_the_serve_flags_load_plugins_before_the_names_are_checked(registries) -> None:
    """``--tool-parser-plugin`` / ``--reasoning-parser-plugin`` (vLLM's flags) register their
    parsers, which ``--tool-call-parser`` / ``--reasoning-parser`` then name; an unknown name
    is still refused."""
    from tokenwire.entrypoints.cli import build_parser
    from tokenwire.entrypoints.options import output

    argv = ["serve", "--tool-parser-plugin", str(EXAMPLE), "--tool-call-parser", "acme_lines"]
    argv += ["--reasoning-parser-plugin", str(EXAMPLE), "--reasoning-parser", "acme"]
    features = output.features(build_parser().parse_args(argv))
    assert (features.tool_call_parser, features.reasoning_parser) == ("acme_lines", "acme")
    assert TOOL_CALL_PARSERS["acme_lines"].__module__ != "tokenwire"
    with pytest.raises(ValueError, match="tool-call parser must be one of"):
        output.features(build_parser().parse_args(["serve", "--tool-call-parser", "acme_nope"]))
