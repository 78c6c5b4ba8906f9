"""Model outputs for the parser tests, per format: what each model family writes, rendered from
the calls it makes, so every case knows its answer.

Each ``Case`` is one output for one pair of parsers (a tool-call parser, a reasoning parser, or
both), with what tokenwire must make of it: the reasoning, the content and the calls (names and
arguments as JSON values). Per tool-call format: several calls after some text, nested JSON
arguments, unicode, calls after reasoning, markup inside string arguments, a call cut short by
the token limit (``length`` finish), text that looks almost like a call, and a plain answer. Per
reasoning format: thinking then answer, thinking opened by the prompt, thinking cut short, no
thinking, and thinking markup in the text.

The calls' arguments are written as each family's chat template writes them (JSON, XML-like
parameters, Python calls, FunctionGemma's ``<escape>`` strings), and the tests give the parsers
``TOOLS``, whose schemas say which parameters are not strings.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CASES", "MARKERS", "TOOLS", "Case", "prompt_text"]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the notes.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "filters": {
                        "type": "object",
                        "properties": {
                            "lang": {"type": "string"},
                            "since": {"type": "integer"},
                            "tags": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                    "limit": {"type": "integer"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "now",
            "description": "The time.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "set_flags",
            "description": "Set flags.",
            "parameters": {
                "type": "object",
                "properties": {
                    "enabled": {"type": "boolean"},
                    "ratio": {"type": "number"},
                    "note": {"type": ["string", "null"]},
                },
            },
        },
    },
]

Call = tuple[str, dict[str, Any]]

WEATHER: Call = ("get_weather", {"city": "巴黎 🌧", "days": 3, "unit": "c"})
NOW: Call = ("now", {})
SEARCH: Call = (
    "search",
    {
        "query": 'tokenwire "parsers" — 速い',
        "filters": {"lang": "fr", "since": 2024, "tags": ["a", "b c"]},
        "limit": 5,
    },
)
FLAGS: Call = ("set_flags", {"enabled": True, "ratio": 0.5, "note": None})


@dataclass
class Case:
    """One model output and what tokenwire makes of it."""

    id: str
    tool: str | None
    reasoning: str | None
    text: str
    #: The expected thinking text, answer text (both compared without surrounding space) and
    #: calls (name, arguments as a JSON value; None: a truncated call, arguments unchecked).
    reasoning_out: str = ""
    content_out: str = ""
    calls_out: list[tuple[str, Any]] = field(default_factory=list)
    #: The prompt ends inside an opened thinking block (the template opened it).
    prompt_opens: bool = False
    #: chat_template_kwargs of the request (vLLM's parsers read some of them).
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: Which tokenizer the output is written with (see ``MARKERS``).
    tokenizer: str = "markers"


# ---- how each family writes its calls --------------------------------------------------------


def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _raw(value: Any) -> str:
    """A parameter value as XML-style templates write it: strings as they are, the rest JSON."""
    return value if isinstance(value, str) else _j(value)


def _hermes(tag: str, key: str = "arguments") -> Callable[[list[Call]], str]:
    def render(calls: list[Call]) -> str:
        return "\n".join(f"<{tag}>\n{_j({'name': n, key: a})}\n</{tag}>" for n, a in calls)

    return render


def _qwen3_xml(open_tag: str, close_tag: str, newlines: bool) -> Callable[[list[Call]], str]:
    nl = "\n" if newlines else ""

    def render(calls: list[Call]) -> str:
        out = []
        for n, a in calls:
            params = "".join(
                f"<parameter={k}>{nl}{_raw(v)}{nl}</parameter>\n" for k, v in a.items()
            )
            out.append(f"{open_tag}\n<function={n}>\n{params}</function>\n{close_tag}")
        return "\n".join(out)

    return render


def _glm(newlines: bool) -> Callable[[list[Call]], str]:
    nl = "\n" if newlines else ""

    def render(calls: list[Call]) -> str:
        out = []
        for n, a in calls:
            params = "".join(
                f"{nl}<arg_key>{k}</arg_key>{nl}<arg_value>{_raw(v)}</arg_value>"
                for k, v in a.items()
            )
            out.append(f"<tool_call>{n}{params}{nl}</tool_call>")
        return "\n".join(out)

    return render


def _minimax(calls: list[Call]) -> str:
    invokes = "".join(
        f'<invoke name="{n}">\n'
        + "".join(f'<parameter name="{k}">{_raw(v)}</parameter>\n' for k, v in a.items())
        + "</invoke>\n"
        for n, a in calls
    )
    return f"<minimax:tool_call>\n{invokes}</minimax:tool_call>"


def _kimi(calls: list[Call]) -> str:
    body = "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{_j(a)}<|tool_call_end|>"
        for i, (n, a) in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


def _deepseek_v3(calls: list[Call]) -> str:
    body = "\n".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{_j(a)}\n```<｜tool▁call▁end｜>"
        for n, a in calls
    )
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def _deepseek_v31(calls: list[Call]) -> str:
    body = "".join(
        f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{_j(a)}<｜tool▁call▁end｜>" for n, a in calls
    )
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def _dsml(calls: list[Call]) -> str:
    d = "｜DSML｜"
    invokes = "".join(
        f'<{d}invoke name="{n}">\n'
        + "".join(
            f'<{d}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
            f"{_raw(v)}</{d}parameter>\n"
            for k, v in a.items()
        )
        + f"</{d}invoke>\n"
        for n, a in calls
    )
    return f"<{d}function_calls>\n{invokes}</{d}function_calls>"


def _step3(calls: list[Call]) -> str:
    body = "".join(
        f'<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="{n}">'
        + "".join(
            f'<steptml:parameter name="{k}">{_raw(v)}</steptml:parameter>' for k, v in a.items()
        )
        + "</steptml:invoke><｜tool_call_end｜>"
        for n, a in calls
    )
    return f"<｜tool_calls_begin｜>{body}<｜tool_calls_end｜>"


def _json_list(prefix: str, suffix: str = "") -> Callable[[list[Call]], str]:
    def render(calls: list[Call]) -> str:
        return prefix + _j([{"name": n, "arguments": a} for n, a in calls]) + suffix

    return render


def _granite_20b(calls: list[Call]) -> str:
    return "\n".join(f"<function_call> {_j({'name': n, 'arguments': a})}" for n, a in calls)


def _internlm(calls: list[Call]) -> str:
    return "".join(
        f"<|action_start|><|plugin|>\n{_j({'name': n, 'parameters': a})}<|action_end|>"
        for n, a in calls
    )


def _gigachat(calls: list[Call]) -> str:
    return "".join(
        f"function call<|role_sep|>\n{_j({'name': n, 'arguments': a})}" for n, a in calls
    )


def _gemma_value(v: Any) -> str:
    if isinstance(v, str):
        return f"<escape>{v}<escape>"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_gemma_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_gemma_value(x) for x in v) + "]"
    return _j(v)


def _functiongemma(calls: list[Call]) -> str:
    return "".join(
        f"<start_function_call>call:{n}{_gemma_value(a)}<end_function_call>" for n, a in calls
    )


def _py(v: Any, literals: dict[Any, str]) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_j(k)}: {_py(x, literals)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_py(x, literals) for x in v) + "]"
    if v is None or isinstance(v, bool):
        return literals[v]
    return _j(v)


_PY_LITERALS = {None: "None", True: "True", False: "False"}
_JSON_LITERALS = {None: "null", True: "true", False: "false"}


def _call_py(n: str, a: dict[str, Any], literals: dict[Any, str]) -> str:
    return f"{n}(" + ", ".join(f"{k}={_py(v, literals)}" for k, v in a.items()) + ")"


def _pythonic(calls: list[Call]) -> str:
    return "[" + ", ".join(_call_py(n, a, _PY_LITERALS) for n, a in calls) + "]"


def _olmo3(calls: list[Call]) -> str:
    lines = "\n".join(_call_py(n, a, _JSON_LITERALS) for n, a in calls)
    return f"<function_calls>\n{lines}\n</function_calls>"


def _llama3(calls: list[Call]) -> str:
    return "; ".join(_j({"name": n, "parameters": a}) for n, a in calls)


def _mistral(calls: list[Call]) -> str:
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{_j(a)}" for n, a in calls)


def _harmony(calls: list[Call]) -> str:
    return "".join(
        f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json"
        f"<|message|>{_j(a)}<|call|>"
        for n, a in calls
    )


@dataclass
class ToolFormat:
    """How one family writes calls, and what the corpus pairs it with."""

    render: Callable[[list[Call]], str]
    #: The markup a ``write_file`` content argument mentions (markup inside a string).
    markup: str
    #: A near-miss: text that looks almost like a call.
    near_miss: str
    #: The reasoning parser for the "calls after reasoning" case, and its thinking markup.
    reasoning: str = "deepseek_r1"
    #: Whether content may come before the calls (formats whose calls open the output: no).
    content_first: bool = True
    #: Calls per output the format allows (1: one call only).
    max_calls: int = 9
    tokenizer: str = "markers"
    #: Text the model writes before the calls when it has said something, and the content
    #: that is (None: the same text).
    lead: str = "Let me check that for you 🔍.\n\n"
    lead_out: str | None = None
    #: Markup the output does not open with (harmony's message start: the prompt wrote it).
    no_open: str = ""
    #: The calls are read when their block closes: a call cut short stays content as written.
    held: bool = False


TOOL_FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat(
        _hermes("tool_call"),
        '<tool_call>{"name": "x"}</tool_call>',
        'The <tool_call tag wraps {"name": "get_weather"} objects; see </tool_call> and <tool_',
        reasoning="qwen3",
    ),
    "longcat": ToolFormat(
        _hermes("longcat_tool_call"),
        "<longcat_tool_call>{}</longcat_tool_call>",
        'Write <longcat_tool> with {"name": "f"}; then </longcat_tool_call> <longcat_',
    ),
    "qwen3_coder": ToolFormat(
        _qwen3_xml("<tool_call>", "</tool_call>", True),
        '<div class="a">x</div>\n<tool_call>\n<function=f>',
        "Use <function_call> and <parameter name=x> tags, or <tool_ to call",
        reasoning="qwen3",
    ),
    "qwen3_xml": ToolFormat(
        _qwen3_xml("<tool_call>", "</tool_call>", True),
        "<p>a &lt; b</p> <tool_call>",
        "Tags like <parameters> and <functions> are not calls; <tool_",
        reasoning="qwen3",
    ),
    "seed_oss": ToolFormat(
        _qwen3_xml("<seed:tool_call>", "</seed:tool_call>", False),
        '<div id="x">y</div> <seed:tool_call>',
        "The <seed:tool_ tag and <function name> are markup words; <seed:",
        reasoning="seed_oss",
    ),
    "glm45": ToolFormat(
        _glm(True),
        "<b>bold</b> and <tool_call>",
        "The <arg_key> and <arg_value> tags go inside <tool_; that is all",
        reasoning="glm45",
    ),
    "glm47": ToolFormat(
        _glm(False),
        "<i>x</i> <tool_call>",
        "Write <arg_key>city</arg_key> inside a call, not here; <tool_",
        reasoning="glm45",
    ),
    "minimax_m2": ToolFormat(
        _minimax,
        '<invoke> is a word; <div class="c">z</div>',
        "The <minimax:tool_ call and <invoke name> syntax; <minimax:",
        reasoning="minimax_m2",
    ),
    "kimi_k2": ToolFormat(
        _kimi,
        "<|tool_call_begin|> in a string",
        'functions.get_weather:0 is an id, {"city": "x"} its arguments',
        reasoning="kimi_k2",
    ),
    "deepseek_v3": ToolFormat(
        _deepseek_v3,
        "```json\n{}\n``` and <｜tool▁call▁end｜>",
        'Answer: use function get_weather with ```json {"city": "x"}```',
        reasoning="deepseek_v3",
    ),
    "deepseek_v31": ToolFormat(
        _deepseek_v31,
        "<｜tool▁call▁end｜> and <｜tool▁sep｜>",
        'get_weather {"city": "x"} is how the call looks, roughly',
        reasoning="deepseek_v3",
    ),
    "deepseek_v32": ToolFormat(
        _dsml,
        "<｜DSML｜invoke> text",
        'The <｜DSML｜invoke name="x"> tag needs a function_calls block around it',
        reasoning="deepseek_v3",
    ),
    "step3": ToolFormat(
        _step3,
        "a &lt;b&gt; c",
        'Step calls look like <steptml:invoke name="x"> but this is prose',
        reasoning="step3",
    ),
    "granite": ToolFormat(
        _json_list("<|tool_call|>"),
        '<|tool_call|>[{"name": "x"}]',
        'The list [{"name": "get_weather"}] is how I would call it; <|tool_',
        reasoning="granite",
    ),
    "granite-20b-fc": ToolFormat(
        _granite_20b,
        '<function_call> {"name": "x"}',
        'A <function_cal> tag and {"name": "f"}; nothing else',
        reasoning="granite",
    ),
    "internlm": ToolFormat(
        _internlm,
        "<|action_end|> inside",
        '<|action_start|> starts an action, {"name": "f"} is one',
        max_calls=1,
    ),
    "jamba": ToolFormat(
        _json_list("<tool_calls>", "</tool_calls>"),
        "</tool_calls> and <tool_calls>",
        'Lists like [{"name": "f", "arguments": {}}] go in <tool_calls tags',
    ),
    "hunyuan_a13b": ToolFormat(
        _json_list("<tool_calls>", "</tool_calls>"),
        "</tool_calls> ]",
        'The <tool_calls> block holds [{"name": ...}] but not here',
        reasoning="hunyuan_a13b",
    ),
    "phi4_mini_json": ToolFormat(
        _json_list("functools"),
        'functools[{"name": "x"}]',
        'Python\'s functools module has partial [{"name": "x"}]',
        content_first=False,
    ),
    "xlam": ToolFormat(
        _json_list(""),
        '[{"name": "x", "arguments": {}}]',
        'A list: [1, 2, {"name": "x"}] of things',
        content_first=False,
    ),
    "gigachat3": ToolFormat(
        _gigachat,
        "function call<|role_sep|> in text",
        'A function call needs a name and {"arguments": {}}',
        max_calls=1,
        lead="Сейчас проверю 🔍.<|message_sep|>\n\n",
        lead_out="Сейчас проверю 🔍.",
    ),
    "functiongemma": ToolFormat(
        _functiongemma,
        "<end_function_call> a {b} c",
        "Call it as call:get_weather{city:Paris} later",
        held=True,
    ),
    "olmo3": ToolFormat(
        _olmo3,
        "</function_calls> and f(x=1)",
        'Use get_weather(city="x") in <function_calls tags',
        reasoning="olmo3",
        held=True,
    ),
    "llama3_json": ToolFormat(
        _llama3,
        '{"name": "x", "parameters": {}}',
        'Here is JSON: {"name": "get_weather"} for you',
        content_first=False,
    ),
    "pythonic": ToolFormat(
        _pythonic,
        "[f(x=1)] and )]",
        "[1] see note [get_weather] for details",
        content_first=False,
        held=True,
    ),
    "mistral": ToolFormat(
        _mistral,
        "[TOOL_CALLS] and [ARGS]",
        "Mistral writes [TOOL_CALL] then a name, like get_weather{...}",
        reasoning="mistral",
    ),
    "openai": ToolFormat(
        _harmony,
        'to=functions.x and {"a": 1}',
        "",
        reasoning="gpt_oss",
        tokenizer="gptoss",
        lead="<|channel|>commentary<|message|>Let me check that for you 🔍.<|end|>",
        lead_out="Let me check that for you 🔍.",
        no_open="<|start|>assistant",
    ),
}


# ---- reasoning formats -----------------------------------------------------------------------


@dataclass
class ThinkFormat:
    """How one family writes its thinking."""

    start: str
    end: str
    #: Thinking runs from the start of the output even without ``start`` (the template opened
    #: it).
    implicit: bool = False
    #: chat_template_kwargs that turn thinking on and off for vLLM's parser.
    on: dict[str, Any] = field(default_factory=dict)
    off: dict[str, Any] = field(default_factory=dict)
    #: What comes between the end of the thinking and the answer text, and after the answer.
    between: str = "\n\n"
    after: str = ""
    tokenizer: str = "markers"
    #: Whether the family's template may open the thinking in the prompt.
    prompt_opens: bool = True


THINK_FORMATS: dict[str, ThinkFormat] = {
    "qwen3": ThinkFormat("<think>", "</think>", off={"enable_thinking": False}),
    "deepseek_r1": ThinkFormat("<think>", "</think>", implicit=True),
    "deepseek_v3": ThinkFormat(
        "<think>", "</think>", on={"thinking": True}, off={"thinking": False}
    ),
    "glm45": ThinkFormat("<think>", "</think>", off={"enable_thinking": False}),
    "granite": ThinkFormat(
        "Here is my thought process:\n",
        "\nHere is my response:",
        between="\n",
        prompt_opens=False,
    ),
    "hunyuan_a13b": ThinkFormat(
        "<think>\n",
        "\n</think>",
        between="\n<answer>\n",
        after="\n</answer>",
        prompt_opens=False,
    ),
    "mistral": ThinkFormat("[THINK]", "[/THINK]", prompt_opens=False),
    "step3": ThinkFormat("<think>", "</think>", implicit=True),
    "seed_oss": ThinkFormat("<seed:think>", "</seed:think>", off={"enable_thinking": False}),
    "minimax_m2": ThinkFormat("<think>", "</think>", implicit=True),
    "kimi_k2": ThinkFormat("<think>", "</think>", off={"thinking": False}),
    "ernie45": ThinkFormat(
        "<think>", "</think>", implicit=True, between="\n\n<response>\n", after="\n</response>\n"
    ),
    "olmo3": ThinkFormat("<think>", "</think>", implicit=True),
    "gpt_oss": ThinkFormat(
        "<|channel|>analysis<|message|>",
        "<|end|><|start|>assistant<|channel|>final<|message|>",
        between="",
        after="<|return|>",
        tokenizer="gptoss",
    ),
}

THOUGHT = "The user wants the weather 🌧 in 巴黎.\nI should call the tool, not guess."
ANSWER = "It is 18 °C and raining in 巴黎 ☔."

#: Marker strings that are single (special) tokens in their family's tokenizer, added as such to
#: the corpus tokenizer (the bundled Qwen3 one: see ``tests/test_parser_diff.py``).
MARKERS: list[str] = [
    "<|python_tag|>",
    "<|python_start|>",
    "<|python_end|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "[THINK]",
    "[/THINK]",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_end|>",
    "<|tool_call_argument_begin|>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<minimax:tool_call>",
    "</minimax:tool_call>",
    "<|tool_call|>",
    "<|action_start|>",
    "<|action_end|>",
    "<|plugin|>",
    "<tool_calls>",
    "</tool_calls>",
    "<seed:tool_call>",
    "</seed:tool_call>",
    "<seed:think>",
    "</seed:think>",
    "<｜tool_calls_begin｜>",
    "<｜tool_calls_end｜>",
    "<｜tool_call_begin｜>",
    "<｜tool_call_end｜>",
    "<｜tool_sep｜>",
    "<longcat_tool_call>",
    "</longcat_tool_call>",
    "<|role_sep|>",
    "<|message_sep|>",
    "<|function_call|>",
    "<start_function_call>",
    "<end_function_call>",
    "<escape>",
    "<response>",
    "</response>",
]
#: A Mistral tokenizer before v11 has no ``[ARGS]`` (its calls are a JSON list).
MISTRAL_V3_MARKERS = [m for m in MARKERS if m not in ("[ARGS]", "[CALL_ID]")]


def prompt_text(case: Case) -> str:
    """The end of the rendered prompt the case's output follows."""
    if case.tokenizer == "gptoss":
        return "<|start|>user<|message|>hi<|end|><|start|>assistant"
    head = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    if case.reasoning is None:
        return head
    fmt = THINK_FORMATS[case.reasoning]
    if case.prompt_opens:
        return head + fmt.start + "\n"
    if fmt.off and case.kwargs == fmt.off:
        return head + fmt.start + "\n\n" + fmt.end + "\n\n"
    return head


def _cut(text: str, fraction: float = 0.6) -> str:
    return text[: int(len(text) * fraction)]


def _tool_cases(name: str, fmt: ToolFormat) -> list[Case]:
    cases: list[Case] = []
    lead = fmt.lead if fmt.content_first else ""
    lead_out = (fmt.lead if fmt.lead_out is None else fmt.lead_out) if fmt.content_first else ""
    two = [WEATHER, NOW] if fmt.max_calls > 1 else [WEATHER]
    calls_out = [(n, a) for n, a in two]

    def add(kind: str, text: str, content: str, calls: list, **kw: Any) -> None:
        if fmt.no_open and text.startswith(fmt.no_open):
            text = text[len(fmt.no_open) :]
        cases.append(
            Case(
                f"tool/{name}/{kind}",
                name,
                kw.pop("reasoning", None),
                text,
                content_out=content,
                calls_out=calls,
                tokenizer=kw.pop("tokenizer", fmt.tokenizer),
                **kw,
            )
        )

    add("several-calls", lead + fmt.render(two), lead_out, calls_out)
    add("nested-unicode", lead + fmt.render([SEARCH]), lead_out, [SEARCH])
    markup = ("write_file", {"path": "notes/é.md", "content": f"See {fmt.markup} — done"})
    add("markup-in-string", fmt.render([markup, FLAGS])[:None], "", [markup, FLAGS])
    cut = lead + _cut(fmt.render([WEATHER]), 0.75)
    if fmt.held:
        add("truncated", cut, cut, [])
    else:
        add("truncated", cut, lead_out, [("get_weather", None)])
    if fmt.near_miss:
        add("near-miss", fmt.near_miss, fmt.near_miss, [])
    add("plain", ANSWER, ANSWER, [])
    think = THINK_FORMATS[fmt.reasoning]
    if fmt.reasoning == "gpt_oss":
        text = f"<|channel|>analysis<|message|>{THOUGHT}<|end|>" + fmt.render([WEATHER])
        add("after-reasoning", text, "", [WEATHER], reasoning="gpt_oss", reasoning_out=THOUGHT)
    else:
        open_tag = "" if think.implicit else think.start
        text = f"{open_tag}{THOUGHT}{think.end}{think.between}{lead}{fmt.render([WEATHER])}"
        text += think.after
        add(
            "after-reasoning",
            text,
            lead_out,
            [WEATHER],
            reasoning=fmt.reasoning,
            reasoning_out=THOUGHT,
            kwargs=dict(think.on),
        )
    return cases


def _reasoning_cases(name: str, fmt: ThinkFormat) -> list[Case]:
    cases: list[Case] = []

    def add(kind: str, text: str, reasoning: str, content: str, **kw: Any) -> None:
        cases.append(
            Case(
                f"reasoning/{name}/{kind}",
                None,
                name,
                text,
                reasoning_out=reasoning,
                content_out=content,
                tokenizer=fmt.tokenizer,
                **kw,
            )
        )

    body = fmt.between + ANSWER + fmt.after
    add("think-answer", fmt.start + THOUGHT + fmt.end + body, THOUGHT, ANSWER, kwargs=fmt.on)
    if fmt.tokenizer == "gptoss":
        add(
            "truncated",
            fmt.start + THOUGHT[:30],
            THOUGHT[:30],
            "",
        )
        add(
            "answer-only",
            "<|channel|>final<|message|>" + ANSWER + "<|return|>",
            "",
            ANSWER,
        )
        add(
            "markup-in-text",
            fmt.start
            + "I could write <|channel|> here? No."
            + fmt.end
            + "Use <think>."
            + "<|return|>",
            "I could write <|channel|> here? No.",
            "Use <think>.",
        )
        return cases
    if fmt.prompt_opens:
        add(
            "prompt-opened",
            THOUGHT + fmt.end + body,
            THOUGHT,
            ANSWER,
            prompt_opens=True,
            kwargs=fmt.on,
        )
    add("truncated", fmt.start + THOUGHT[:40], THOUGHT[:40], "", kwargs=fmt.on)
    if fmt.implicit:
        add("no-start-tag", THOUGHT + fmt.end + body, THOUGHT, ANSWER, kwargs=fmt.on)
    else:
        add("no-thinking", ANSWER, "", ANSWER, kwargs=fmt.off)
    mention = f"I wrote {fmt.end.strip()[:-1]} by mistake, and {fmt.start.strip()[:4]}."
    add(
        "markup-in-text",
        fmt.start + mention + fmt.end + body,
        mention,
        ANSWER,
        kwargs=fmt.on,
    )
    return cases


def _mistral_v3_cases() -> list[Case]:
    calls = _json_list("[TOOL_CALLS]")
    return [
        Case(
            "tool/mistral/v3-json-list",
            "mistral",
            None,
            "Sure. " + calls([WEATHER, NOW]),
            content_out="Sure.",
            calls_out=[WEATHER, NOW],
            tokenizer="mistral_v3",
        ),
        Case(
            "tool/mistral/v3-nested",
            "mistral",
            None,
            calls([SEARCH]),
            calls_out=[SEARCH],
            tokenizer="mistral_v3",
        ),
    ]


def _xlam_extra() -> list[Case]:
    fenced = "I'll search.\n```json\n" + _j([{"name": n, "arguments": a} for n, a in [SEARCH]])
    tagged = "[TOOL_CALLS]" + _j([{"name": n, "arguments": a} for n, a in [WEATHER, NOW]])
    return [
        Case("tool/xlam/tool-calls-tag", "xlam", None, tagged, calls_out=[WEATHER, NOW]),
        Case(
            "tool/xlam/fenced",
            "xlam",
            None,
            fenced + "\n```",
            content_out="I'll search.",
            calls_out=[SEARCH],
        ),
    ]


CASES: list[Case] = [
    *(c for name, fmt in TOOL_FORMATS.items() for c in _tool_cases(name, fmt)),
    *(c for name, fmt in THINK_FORMATS.items() for c in _reasoning_cases(name, fmt)),
    *_mistral_v3_cases(),
    *_xlam_extra(),
]
