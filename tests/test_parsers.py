"""Reasoning and tool-call parsers: known outputs parse as expected, and streaming (any split of
the text, and the pieces a real tokenizer's decode stream yields) gives exactly the whole parse."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire import DecodeStream
from tokenwire.parsers import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ReasoningDelta,
    ToolCall,
    merge_tool_deltas,
    prompt_opens_reasoning,
)
from tokenwire.parsers.markers import find_marker, safe_length
from tokenwire.parsers.tools.forced import ForcedToolParser

from conftest import examples, real_tokenizer

W = '{"city": "巴黎 🌧", "days": [1, 2], "note": "a \\"}\\" b"}'

#: parser -> [(output text, expected content, expected [(name, arguments)])]
TOOL_CASES: dict[str, list[tuple[str, str, list[tuple[str, str]]]]] = {
    "hermes": [
        (
            f'Let me look 🔍.\n\n<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n'
            '</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
            "Let me look 🔍.\n\n",
            [("get_weather", W), ("now", "{}")],
        ),
        (
            '<tool_call>{"arguments": {"x": 1}, "name": "late"}</tool_call> then text',
            "then text",
            [("late", '{"x": 1}')],
        ),
        ("<tool_call>not json</tool_call> ok", "<tool_call>not json</tool_call> ok", []),
        (
            "no calls at all: <tool_ and </tool_call>",
            "no calls at all: <tool_ and </tool_call>",
            [],
        ),
        ('<tool_call>{"name": "cut", "arguments": {"a": [1,', "", [("cut", '{"a": [1,')]),
    ],
    "llama3_json": [
        (
            f'{{"name": "get_weather", "parameters": {W}}}; {{"name": "now", "parameters": {{}}}}',
            "",
            [("get_weather", W), ("now", "{}")],
        ),
        ('<|python_tag|>{"name": "f", "parameters": {"q": "é"}}', "", [("f", '{"q": "é"}')]),
        ('The answer is {"a": 1}', 'The answer is {"a": 1}', []),
        ('  {"a": 1} is JSON', '  {"a": 1} is JSON', []),
    ],
    "mistral": [
        (
            f'Sure. [TOOL_CALLS][{{"name": "get_weather", "arguments": {W}}}, '
            '{"name": "now", "arguments": {}}]',
            "Sure. ",
            [("get_weather", W), ("now", "{}")],
        ),
        (
            f"[TOOL_CALLS]get_weather[ARGS]{W}[TOOL_CALLS]now[ARGS]{{}}",
            "",
            [("get_weather", W), ("now", "{}")],
        ),
        ("[TOOL_CALLS] not a call", "[TOOL_CALLS] not a call", []),
    ],
    "pythonic": [
        (
            '[get_weather(city="巴黎", days=[1, 2]), now()]',
            "",
            [("get_weather", '{"city": "巴黎", "days": [1, 2]}'), ("now", "{}")],
        ),
        ('<|python_start|>[f(a="])")]<|python_end|>', "", [("f", '{"a": "])"}')]),
        ("[1] is a footnote", "[1] is a footnote", []),
        ("Plain answer.", "Plain answer.", []),
    ],
    "deepseek_v3": [
        (
            "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
            f"```json\n{W}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n"
            "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "Checking.",
            [("get_weather", W), ("now", "{}")],
        ),
        (
            f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{W}"
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "",
            [("get_weather", W)],
        ),
    ],
    "openai": [
        (
            "<|channel|>analysis<|message|>Weather 🌧?<|end|><|start|>assistant<|channel|>"
            f"commentary to=functions.get_weather <|constrain|>json<|message|>{W}<|call|>",
            "Weather 🌧?",
            [("get_weather", W)],
        ),
        (
            "<|start|>assistant to=functions.now<|channel|>commentary json<|message|>{}<|call|>"
            "<|start|>assistant<|channel|>final<|message|>Done 🎉<|return|>",
            "Done 🎉",
            [("now", "{}")],
        ),
        ("plain, no harmony", "plain, no harmony", []),
    ],
}
TOOL_PARAMS = [
    pytest.param(name, k, id=f"{name}-{k}")
    for name, cases in TOOL_CASES.items()
    for k in range(len(cases))
]


def _ids(index: int) -> str:
    return f"call{index}"


def _bound(cls):
    """A parser class, bound to the corpus's response_template if it reads one (``hf``)."""
    if getattr(cls, "needs_template", False):
        from parser_corpus import HF_TEMPLATE
        from tokenwire.parsers import ResponseTemplate

        return cls.for_template(_template(ResponseTemplate, HF_TEMPLATE))
    return cls


_TEMPLATES: dict = {}


def _template(kind, spec):
    if "t" not in _TEMPLATES:
        _TEMPLATES["t"] = kind.load(spec)
    return _TEMPLATES["t"]


def _stream_tools(
    name: str, pieces: list[str], tools: list | None = None
) -> tuple[str, list[ToolCall]]:
    parser = _bound(TOOL_CALL_PARSERS[name])(make_id=_ids, tools=tools)
    deltas = [parser.feed(p) for p in pieces] + [parser.finish()]
    for d in deltas:
        for c in d.calls:  # OpenAI's shape: id and name only on a call's first delta
            assert (c.id is None) == (c.name is None)
    content = "".join(d.content for d in deltas)
    return content, merge_tool_deltas(c for d in deltas for c in d.calls)


def _splits(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


@pytest.mark.parametrize(("name", "k"), TOOL_PARAMS)
def test_tool_parser_whole(name: str, k: int) -> None:
    text, content, calls = TOOL_CASES[name][k]
    got_content, got_calls = TOOL_CALL_PARSERS[name](make_id=_ids).parse(text)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    assert [c.id for c in got_calls] == [f"call{i}" for i in range(len(calls))]


_DEEP = "[" * 3000 + "]" * 3000
_LONG_INT = "1" * 5000
#: Outputs that look like calls but are no JSON a client can read back (or that no parser
#: takes): they stay content as written, never an exception (a 500 or a cut stream).
UNREADABLE_CALLS = [
    ("hermes", f'<tool_call>{{"arguments": {_DEEP}, "name": "f"}}</tool_call>'),
    ("hermes", f"<tool_call>{_DEEP}</tool_call>"),
    ("hermes", f'<tool_call>{{"arguments": {{"n": {_LONG_INT}}}, "name": "f"}}</tool_call>'),
    ("hermes", '<tool_call>{"arguments": {"n": NaN}, "name": "f"}</tool_call>'),
    ("llama3_json", f'{{"parameters": {_DEEP}, "name": "f"}}'),
    ("llama3_json", '{"parameters": {"x": 1e999}, "name": "f"}'),
    ("mistral", f'[TOOL_CALLS][{{"arguments": {_DEEP}, "name": "f"}}]'),
    ("pythonic", "[f(a=" + "-" * 100_000 + "1)]"),
    ("pythonic", "[f(a=" + "1+" * 100_000 + "1)]"),
    ("pythonic", "[f(a=1e999)]"),
]


@pytest.mark.parametrize(("name", "text"), UNREADABLE_CALLS, ids=lambda v: v[:24])
def test_unreadable_calls_stay_content(name: str, text: str) -> None:
    content, calls = TOOL_CALL_PARSERS[name](make_id=_ids).parse(text)
    assert (content, calls) == (text, [])
    assert _stream_tools(name, _splits(text, [7, 500, 4000, 9000])) == (text, [])


@pytest.mark.parametrize("function", [None, "f"])
@pytest.mark.parametrize("text", [_DEEP, '{"a": NaN}', '{"x": 1e999}', f'{{"n": {_LONG_INT}}}'])
def test_forced_output_that_is_no_readable_json_is_nothing(function, text) -> None:
    """Forced output that is not calls (cut by max_tokens, or unreadable) gives no content and no
    calls, as vLLM answers; the finish reason says why."""
    content, calls = ForcedToolParser(function, make_id=_ids).parse(text)
    assert (content, calls) == ("", [])
    cut = '[{"name": "get'
    assert ForcedToolParser(function, make_id=_ids).parse(cut) == ("", [])


@pytest.mark.parametrize(("name", "k"), TOOL_PARAMS)
def test_tool_parser_per_character(name: str, k: int) -> None:
    text = TOOL_CASES[name][k][0]
    assert _stream_tools(name, list(text)) == TOOL_CALL_PARSERS[name](make_id=_ids).parse(text)


@pytest.mark.parametrize(("name", "k"), TOOL_PARAMS)
@settings(max_examples=examples(40))
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_tool_parser_any_split(name: str, k: int, cuts: list[int]) -> None:
    text = TOOL_CASES[name][k][0]
    whole = TOOL_CALL_PARSERS[name](make_id=_ids).parse(text)
    assert _stream_tools(name, _splits(text, cuts)) == whole


#: Markup of every format, and text around it, for the any-text tests.
FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|python_tag|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "functions.f:0",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<function=f>",
    "<parameter=x>",
    "</parameter>",
    "</function>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<minimax:tool_call>",
    '<invoke name="f">',
    '<parameter name="x">',
    "</invoke>",
    '<｜DSML｜parameter name="x" string="false">',
    "<tool_calls>",
    "</tool_calls>",
    "<|tool_call|>",
    "functools",
    "<function_call>",
    "<|action_start|><|plugin|>",
    "<|action_end|>",
    "<|message_sep|>",
    "function call<|role_sep|>",
    "<start_function_call>",
    "call:f{x:",
    "<escape>",
    "<end_function_call>",
    "<function_calls>",
    "</function_calls>",
    "function",
    "```json\n",
    '{"name": "f", "arguments": ',
    '{"a": "}"}',
    "}",
    "]",
    "[",
    "f(",
    "x=1",
    ")",
    ";",
    " ",
    "\n",
    "é",
    "🌧",
    '"',
    "<",
    "12",
    "abc",
]
#: Tools for the any-text tests: ``f``'s ``x`` is an integer (typed), the rest strings.
FUZZ_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
        },
    }
]


@pytest.mark.parametrize("name", list(TOOL_CALL_PARSERS))
@settings(max_examples=examples(60))
@given(
    parts=st.lists(st.sampled_from(FRAGMENTS), max_size=14),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
)
def test_tool_parser_any_text_any_split(name: str, parts: list[str], cuts: list[int]) -> None:
    """Whatever the text (every format's markup in any order) and its split, streaming ==
    whole."""
    text = "".join(parts)
    whole = _stream_tools(name, [text], FUZZ_TOOLS)
    assert _stream_tools(name, _splits(text, cuts), FUZZ_TOOLS) == whole


# ---- real tokenizers -----------------------------------------------------------------------------

#: (tokenizer, parser, case index): outputs as a model with that tokenizer would write them.
REAL_CASES = [
    ("qwen3", "hermes", 0),
    ("qwen3", "hermes", 1),
    ("deepseek_v3", "deepseek_v3", 0),
    ("deepseek_v3", "deepseek_v3", 1),
    ("llama3", "llama3_json", 0),
    ("llama3", "pythonic", 0),
    ("gemma3", "hermes", 0),
    ("llama2", "mistral", 1),
    ("gptoss", "openai", 0),
    ("gptoss", "openai", 1),
]


def _decode_pieces(tok_name: str, text: str, skip: bool = False) -> list[str]:
    tok = real_tokenizer(tok_name)
    ids = tok.encode(text, add_special_tokens=False)
    stream = DecodeStream(tok, [], skip_special_tokens=skip)
    pieces = [stream.push_token(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text  # the tokenizer round-trips the sample
    return pieces


@pytest.mark.parametrize(("tok_name", "name", "k"), REAL_CASES)
def test_tool_parser_on_token_pieces(tok_name: str, name: str, k: int) -> None:
    text = TOOL_CASES[name][k][0]
    pieces = _decode_pieces(tok_name, text)
    assert _stream_tools(name, pieces) == TOOL_CALL_PARSERS[name](make_id=_ids).parse(text)


def test_samples_split_characters_across_tokens() -> None:
    """The samples do exercise characters split across tokens (pieces that decode to nothing)."""
    assert "" in _decode_pieces("qwen3", TOOL_CASES["hermes"][0][0])[:-1]
    assert "" in _decode_pieces("llama2", TOOL_CASES["hermes"][0][0])[:-1]


def test_markup_tokens_are_single_tokens_on_their_tokenizers() -> None:
    """The markup the parsers look for is one token each where the model defines it so (the
    parser still works on any split, but this is the case a server meets)."""
    qwen = real_tokenizer("qwen3")
    for tag in ("<tool_call>", "</tool_call>", "<think>", "</think>"):
        assert len(qwen.encode(tag, add_special_tokens=False)) == 1
    ds = real_tokenizer("deepseek_v3")
    for tag in ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"):
        assert len(ds.encode(tag, add_special_tokens=False)) == 1


# ---- reasoning -----------------------------------------------------------------------------------

REASONING_CASES = [
    # (parser, prompt opens thinking, output, reasoning, content)
    (
        "qwen3",
        False,
        "<think>\nLet me think 🤔.\n</think>\n\nThe answer.",
        "\nLet me think 🤔.\n",
        "\n\nThe answer.",
    ),
    ("qwen3", False, "The answer, no thinking.", "", "The answer, no thinking."),
    ("qwen3", False, "<thin", "", "<thin"),
    ("qwen3", True, "still thinking </think>answer", "still thinking ", "answer"),
    ("qwen3", False, "<think>cut off by max_tokens", "cut off by max_tokens", ""),
    ("qwen3", False, "Say </think> later", "", "Say </think> later"),
    (
        "deepseek_r1",
        False,
        "reasoning without an opening tag</think>answer",
        "reasoning without an opening tag",
        "answer",
    ),
    ("deepseek_r1", False, "<think>x</think>y</think>z", "x", "y</think>z"),
    ("deepseek_r1", False, "never closed", "never closed", ""),
    (
        "gpt_oss",
        False,
        "<|channel|>analysis<|message|>Hmm 🤔<|end|><|start|>assistant<|channel|>final"
        "<|message|>Answer 42.<|return|>",
        "Hmm 🤔",
        "Answer 42.",
    ),
    ("gpt_oss", False, "no harmony at all", "", "no harmony at all"),
    ("gpt_oss", False, "<|channel|>analysis<|message|>cut off", "cut off", ""),
]


def _stream_reasoning(name: str, opens: bool, pieces: list[str]) -> tuple[str, str]:
    parser = _bound(REASONING_PARSERS[name])(prompt_in_reasoning=opens)
    out = [parser.feed(p) for p in pieces] + [parser.finish()]
    return "".join(d.reasoning for d in out), "".join(d.content for d in out)


@pytest.mark.parametrize(("name", "opens", "text", "reasoning", "content"), REASONING_CASES)
def test_reasoning_parser(name: str, opens: bool, text: str, reasoning: str, content: str) -> None:
    whole = REASONING_PARSERS[name](prompt_in_reasoning=opens).parse(text)
    assert whole == ReasoningDelta(reasoning, content)
    assert _stream_reasoning(name, opens, list(text)) == (reasoning, content)


@pytest.mark.parametrize(("name", "opens", "text", "reasoning", "content"), REASONING_CASES)
@settings(max_examples=examples(30))
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=10))
def test_reasoning_any_split(name, opens, text, reasoning, content, cuts) -> None:
    assert _stream_reasoning(name, opens, _splits(text, cuts)) == (reasoning, content)


@pytest.mark.parametrize("name", list(REASONING_PARSERS))
@pytest.mark.parametrize("opens", [False, True])
@settings(max_examples=examples(40))
@given(
    parts=st.lists(
        st.sampled_from(
            [
                *{t for cls in REASONING_PARSERS.values() for t in getattr(cls, "start_tags", ())},
                *{t for cls in REASONING_PARSERS.values() for t in getattr(cls, "end_tags", ())},
                *{
                    t
                    for cls in REASONING_PARSERS.values()
                    for t in getattr(cls, "end_keep_tags", ())
                },
                "<answer>",
                "</answer>",
                "<response>",
                "</response>",
                "<|channel|>analysis<|message|>",
                "<|end|>",
                "<|start|>assistant",
                "<|channel|>final<|message|>",
                "Here",
                "<",
                " ",
                "\n",
                "é🌧",
                "abc",
            ]
        ),
        max_size=12,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
)
def test_reasoning_any_text_any_split(name, opens, parts, cuts) -> None:
    """Whatever the text (every format's markers in any order) and its split, streaming ==
    whole."""
    text = "".join(parts)
    assert _stream_reasoning(name, opens, _splits(text, cuts)) == _stream_reasoning(
        name, opens, [text]
    )


def test_gpt_oss_reasoning_on_token_pieces() -> None:
    text = REASONING_CASES[-3][2]
    pieces = _decode_pieces("gptoss", text)
    assert _stream_reasoning("gpt_oss", False, pieces) == ("Hmm 🤔", "Answer 42.")


@pytest.mark.parametrize("tok_name", ["qwen3", "deepseek_v3", "llama3"])
def test_reasoning_on_token_pieces(tok_name: str) -> None:
    text = "<think>\n考虑一下 🤔 the </thin k> case\n</think>\n\n答案是 42."
    pieces = _decode_pieces(tok_name, text)
    for name in REASONING_PARSERS:
        assert _stream_reasoning(name, False, pieces) == _stream_reasoning(name, False, [text])


def test_reasoning_end_offset() -> None:
    parser = REASONING_PARSERS["qwen3"]()
    parser.feed("<think>ab</th")
    assert parser.reasoning_end is None and parser.in_reasoning
    parser.feed("ink>cd")
    assert parser.reasoning_end == len("<think>ab</think>") and not parser.in_reasoning


def test_prompt_opens_reasoning() -> None:
    cls = REASONING_PARSERS["qwen3"]
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n", cls)
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", cls)
    assert not prompt_opens_reasoning("<|im_start|>assistant\n", cls)


def test_markers() -> None:
    assert safe_length("abc</th", ["</think>"]) == 3
    assert safe_length("abc", ["</think>"]) == 3
    assert find_marker("a</think>b", ["</think>"]) == (1, "</think>")
    # A longer marker that may still complete at the same place wins the wait.
    assert find_marker("x<a", ["<a", "<ab"]) == (1, None)
    assert find_marker("x<a", ["<a", "<ab"], final=True) == (1, "<a")


# ---- reasoning, then tool calls, with reasoning tokens counted -----------------------------------


@pytest.mark.parametrize("step", [1, 2, 3, 5])
def test_output_parser_counts_reasoning_tokens(step: int) -> None:
    from tokenwire.parsers.output import OutputSpec

    tok = real_tokenizer("qwen3")
    thinking = "<think>\n考虑 🤔 <tool_call>{}</tool_call>\n</think>"
    text = thinking + "\n\n" + TOOL_CASES["hermes"][0][0]
    ids = tok.encode(text, add_special_tokens=False)
    spec = OutputSpec(REASONING_PARSERS["qwen3"], False, TOOL_CALL_PARSERS["hermes"], _ids)
    parser = spec.new(lambda t: [len(tok.decode([i], False)) for i in t])
    stream = DecodeStream(tok, [], skip_special_tokens=False)
    reasoning = content = ""
    calls = []
    for k in range(0, len(ids), step):
        chunk = ids[k : k + step]
        d = parser.feed("".join(stream.push_token(i) for i in chunk), chunk)
        reasoning, content, calls = (
            reasoning + d.reasoning,
            content + d.content,
            calls + d.tool_calls,
        )
    d = parser.finish()
    reasoning, content = reasoning + d.reasoning, content + d.content
    assert parser.reasoning_tokens == len(tok.encode(thinking, add_special_tokens=False))
    assert reasoning == "\n考虑 🤔 <tool_call>{}</tool_call>\n"
    assert content == "\n\n" + TOOL_CASES["hermes"][0][1]
    assert [(c.name, c.arguments) for c in merge_tool_deltas(calls + d.tool_calls)] == [
        (n, a) for n, a in TOOL_CASES["hermes"][0][2]
    ]
    assert parser.called


# ---- the families' shared parsers ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        ("3", {"type": "integer"}, 3),
        ("3.0", {"type": "number"}, 3),
        ("0.5", {"type": "number"}, 0.5),
        ("1e999", {"type": "number"}, "1e999"),
        ("True", {"type": "boolean"}, True),
        ("null", {"type": ["string", "null"]}, None),
        ("none", {"type": ["string", "null"]}, "none"),
        ('{"a": [1]}', {"type": "object"}, {"a": [1]}),
        ("[1, 2", {"type": "array"}, "[1, 2"),
        ("c", {"enum": ["c", "f"]}, "c"),
        ("7", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, 7),
        ("7", {"type": "int64"}, 7),
        ("7", None, "7"),
        ("7", {"type": "string"}, "7"),
    ],
)
def test_bare_values_are_typed_by_their_schema(text, schema, value) -> None:
    from tokenwire.parsers.tools.values import coerce

    assert coerce(text, schema) == value


def test_xml_string_parameter_streams_as_written() -> None:
    """A string parameter's text goes out as it comes (a file a model writes streams); the
    other parameters when they close, typed by the schema."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "write",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "n": {"type": "integer"}},
                },
            },
        }
    ]
    parser = TOOL_CALL_PARSERS["qwen3_coder"](make_id=_ids, tools=tools)
    head = parser.feed("Writing.\n<tool_call>\n<function=write>\n<parameter=n>\n4")
    assert head.content == "Writing.\n" and [(c.name, c.arguments) for c in head.calls] == [
        ("write", "")
    ]
    assert parser.feed("2\n</parameter>\n<parameter=path>\nline one\n").calls[0].arguments == (
        '{"n": 42, "path": "line one'
    )
    assert parser.feed("line <two> é\n</parameter>\n").calls[0].arguments == '\\nline <two> é"'
    tail = parser.feed("</function>\n</tool_call>\nDone.")
    tail.extend(parser.finish())
    assert (tail.content, "".join(c.arguments for c in tail.calls)) == ("Done.", "}")


def test_kimi_calls_keep_their_ids() -> None:
    text = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:3"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        "<|tool_calls_section_end|>"
    )
    _, calls = TOOL_CALL_PARSERS["kimi_k2"](make_id=_ids).parse(text)
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("functions.get_weather:3", "get_weather", '{"city": "Paris"}')
    ]


def test_a_call_opener_ends_unclosed_thinking() -> None:
    """GLM's ``<tool_call>`` (a special token) ends thinking the model did not close; the call
    is the answer's, and the thinking's tokens are counted up to it."""
    parser = REASONING_PARSERS["glm45"]()
    out = parser.parse("<think>Let me call.<tool_call>get_weather</tool_call>")
    assert out == ReasoningDelta("Let me call.", "<tool_call>get_weather</tool_call>")
    assert parser.reasoning_end == len("<think>Let me call.")
    # Qwen3's <tool_call> is ordinary text in its thinking.
    assert REASONING_PARSERS["qwen3"]().parse("<think>a <tool_call> b</think>c") == (
        ReasoningDelta("a <tool_call> b", "c")
    )


@pytest.mark.parametrize(
    ("name", "text", "reasoning", "content"),
    [
        (
            "hunyuan_a13b",
            "<think>\nhm\n</think>\n<answer>\nIt is.\n</answer>",
            "\nhm\n",
            "\nIt is.\n",
        ),
        ("hunyuan_a13b", "<think>hm</think> no tags", "hm", " no tags"),
        ("ernie45", "hm\n</think>\n\n<response>\nIt is.\n</response>\n", "hm\n", "\nIt is.\n\n"),
        ("granite", "Here's my thought process: a\nHere's my response: b", " a\n", " b"),
        ("granite", "Here is the answer.", "", "Here is the answer."),
        ("mistral", "[THINK]a[/THINK]b", "a", "b"),
        ("seed_oss", "<seed:think>a</seed:think>b", "a", "b"),
        ("minimax_m2", "a</think>b", "a", "b"),
    ],
)
def test_reasoning_formats(name: str, text: str, reasoning: str, content: str) -> None:
    assert REASONING_PARSERS[name]().parse(text) == ReasoningDelta(reasoning, content)
    assert _stream_reasoning(name, False, list(text)) == (reasoning, content)
