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
from dataclasses import dataclass, field, replace
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
    #: What goes between the thinking and the calls, and after them, in the calls-after-reasoning
    #: case (None: the thinking format's own markup around an answer).
    reasoning_between: str | None = None
    reasoning_after: str | None = None


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


# ---- the families vLLM 0.32 / 0.33 added (and SGLang's own) -----------------------------------
# Each renders calls as the family's chat template writes them (or, where the template was not at
# hand, as the parser's own documentation in vLLM or SGLang shows them); SOURCES says which.


def _keyed_list(prefix: str, suffix: str) -> Callable[[list[Call]], str]:
    def render(calls: list[Call]) -> str:
        return prefix + _j([{n: a} for n, a in calls]) + suffix

    return render


def _cohere(calls: list[Call]) -> str:
    items = [
        {"tool_call_id": str(i), "tool_name": n, "parameters": a} for i, (n, a) in enumerate(calls)
    ]
    return "<|START_ACTION|>" + _j(items) + "<|END_ACTION|>"


def _inkling(calls: list[Call]) -> str:
    return "".join(
        f"<|message_model|><|content_invoke_tool_json|>{_j({'name': n, 'args': a})}<|end_message|>"
        for n, a in calls
    )


def _hy(sep: str, nl: str) -> Callable[[list[Call]], str]:
    def render(calls: list[Call]) -> str:
        body = "".join(
            f"<tool_call>{n}{sep}\n"
            + "".join(
                f"<arg_key>{k}</arg_key>{nl}<arg_value>{_raw(v)}</arg_value>\n"
                for k, v in a.items()
            )
            + "</tool_call>\n"
            for n, a in calls
        )
        return f"<tool_calls>\n{body}</tool_calls>"

    return render


def _schema_type(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if v is None:
        return "null"
    return {dict: "object", list: "array"}.get(type(v), "string")


def _k2_horizon(calls: list[Call], typed: bool = False) -> str:
    """K2 Horizon's ``xml`` tool format (``xml_typed``: each value's type tagged too)."""

    def arg(k: str, v: Any) -> str:
        kind = f"<ifm|arg_type>{_schema_type(v)}</ifm|arg_type>" if typed else ""
        return f"<ifm|arg_key>{k}</ifm|arg_key>{kind}<ifm|arg_value>{_raw(v)}</ifm|arg_value>"

    body = "".join(
        f"<ifm|tool_call>{n}" + "".join(arg(k, v) for k, v in a.items()) + "</ifm|tool_call>"
        for n, a in calls
    )
    return f"<ifm|tool_calls>{body}</ifm|tool_calls>"


def _invokes(tag: str, block: str, calls: list[Call]) -> str:
    invokes = "".join(
        f'<invoke name="{n}">\n'
        + "".join(f'<parameter name="{k}">{_raw(v)}</parameter>\n' for k, v in a.items())
        + "</invoke>\n"
        for n, a in calls
    )
    return f"<{block}>\n{invokes}</{block}>"


def _minicpm5(calls: list[Call]) -> str:
    return "\n".join(
        f'<function name="{n}">\n'
        + "".join(f'<param name="{k}">{_raw(v)}</param>\n' for k, v in a.items())
        + "</function>"
        for n, a in calls
    )


def _is_str(v: Any) -> str:
    return "true" if isinstance(v, str) else "false"


def _dsml_like(tag: str, block: str, spaced: bool = False) -> Callable[[list[Call]], str]:
    sp = " " if spaced else ""

    def render(calls: list[Call]) -> str:
        invokes = "".join(
            f'<{tag}{sp}invoke name="{n}">\n'
            + "".join(
                f'<{tag}{sp}parameter name="{k}" string="{_is_str(v)}">'
                f"{_raw(v)}</{tag}{sp}parameter>\n"
                for k, v in a.items()
            )
            + f"</{tag}{sp}invoke>\n"
            for n, a in calls
        )
        return f"<{tag}{sp}{block}>\n{invokes}</{tag}{sp}{block}>"

    return render


def _kimi_k3(calls: list[Call]) -> str:
    body = "".join(
        f'<|open|>call tool="{n}" index="{i}"<|sep|>'
        + "".join(
            f'<|open|>argument key="{k}" type="{_schema_type(v)}"<|sep|>{_raw(v)}'
            "<|close|>argument<|sep|>"
            for k, v in a.items()
        )
        + "<|close|>call<|sep|>"
        for i, (n, a) in enumerate(calls)
    )
    return f"<|open|>tools<|sep|>{body}<|close|>tools<|sep|>"


def _gemma4_value(v: Any) -> str:
    if isinstance(v, str):
        return f'<|"|>{v}<|"|>'
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_gemma4_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_gemma4_value(x) for x in v) + "]"
    return _j(v)


def _gemma4(calls: list[Call]) -> str:
    return "".join(f"<|tool_call>call:{n}{_gemma4_value(a)}<tool_call|>" for n, a in calls)


def _lfm2(calls: list[Call]) -> str:
    return "<|tool_call_start|>" + _pythonic(calls) + "<|tool_call_end|>"


_M3 = "]<]minimax[>["


def _m3_value(k: str, v: Any) -> str:
    if isinstance(v, dict):
        inner = "".join(_m3_value(kk, vv) for kk, vv in v.items())
        return f"{_M3}<{k}>{inner}{_M3}</{k}>"
    if isinstance(v, list):
        inner = "".join(_m3_value("item", x) for x in v)
        return f"{_M3}<{k}>{inner}{_M3}</{k}>"
    return f"{_M3}<{k}>{_raw(v)}{_M3}</{k}>"


def _minimax_m3(calls: list[Call]) -> str:
    invokes = "".join(
        f'{_M3}<invoke name="{n}">\n'
        + "".join(_m3_value(k, v) + "\n" for k, v in a.items())
        + f"{_M3}</invoke>\n"
        for n, a in calls
    )
    return f"{_M3}<tool_call>\n{invokes}{_M3}</tool_call>"


def _plamo3(calls: list[Call]) -> str:
    body = "".join(
        "<|plamo:begin_tool_request:plamo|><|plamo:begin_tool_name:plamo|>"
        f"{n}<|plamo:end_tool_name:plamo|><|plamo:begin_tool_arguments:plamo|>"
        f"<|plamo:constrain|>json<|plamo:msg|>{_j(a)}<|plamo:end_tool_arguments:plamo|>"
        "<|plamo:end_tool_request:plamo|>"
        for n, a in calls
    )
    return f"<|plamo:begin_tool_requests:plamo|>{body}<|plamo:end_tool_requests:plamo|>"


#: The corpus tokenizer's ``response_template`` (a Qwen3-style checkpoint's, as Hugging Face's
#: response-parsing metadata writes it), which the generic ``hf`` parsers read.
HF_TEMPLATE: dict[str, Any] = {
    "version": 1,
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "thinking": {"open": "<think>", "close": "</think>"},
        "content": {},
        "tool_calls": {
            "open": "<tool_call>",
            "close": "</tool_call>",
            "content": "json",
            "repeats": True,
            "transform": {
                "type": "function",
                "function": {"name": "{content.name}", "arguments": "{content.arguments}"},
            },
        },
    },
}


def _muse(calls: list[Call]) -> str:
    return "".join(
        f"<|start|>assistant to={n}<|message|>"
        + _invokes("", "atem:function_calls", [(n, a)])
        .replace("<invoke", "<atem:invoke")
        .replace("</invoke>", "</atem:invoke>")
        .replace("<parameter", "<atem:parameter")
        .replace("</parameter>", "</atem:parameter>")
        + "<|eom|>"
        for n, a in calls
    )


TOOL_FORMATS.update(
    {
        "muse_glimmer": ToolFormat(
            _muse,
            "<atem:invoke> and to=user",
            'Write <atem:invoke name="x"> in the answer, not a call',
            reasoning="muse_glimmer",
            lead="<|start|>assistant to=commentary<|message|>Let me check that for you 🔍.<|eom|>",
            lead_out="Let me check that for you 🔍.",
            no_open="<|start|>assistant",
            reasoning_between="",
            reasoning_after="",
        ),
        "hf": replace(
            TOOL_FORMATS["hermes"], markup='<think> and {"a": 1}', reasoning="hf", held=True
        ),
        "qwen3_json": replace(TOOL_FORMATS["hermes"]),
        "granite4": replace(TOOL_FORMATS["hermes"], reasoning="granite_thinking_parser"),
        "ernie45": replace(TOOL_FORMATS["hermes"], reasoning="ernie45"),
        "iquest_q1": ToolFormat(
            lambda calls: (
                _glm(False)(calls)
                .replace("<tool_call>", "<iquest_tool_call>")
                .replace("</tool_call>", "</iquest_tool_call>")
            ),
            "<b>x</b> <iquest_tool_call>",
            "Write <arg_key>city</arg_key> inside an <iquest_ call",
        ),
        "llama4_json": replace(TOOL_FORMATS["llama3_json"]),
        "llama4_pythonic": replace(TOOL_FORMATS["pythonic"]),
        "apertus": ToolFormat(
            _keyed_list("<|tools_prefix|>", "<|tools_suffix|>"),
            '<|tools_prefix|>[{"f": {}}]',
            'A list like [{"get_weather": {"city": "x"}}] goes in the tools prefix',
            reasoning="apertus",
        ),
        "cohere_command3": ToolFormat(
            _cohere,
            '<|START_ACTION|>[{"tool_name": "x"}]',
            'Actions look like [{"tool_name": "x", "parameters": {}}] in <|START_ACTION|',
            reasoning="cohere_command3",
            lead="<|START_RESPONSE|>Let me check that for you 🔍.<|END_RESPONSE|>",
            lead_out="Let me check that for you 🔍.",
        ),
        "cohere_command4": ToolFormat(
            _cohere,
            "<|END_ACTION|> and [1]",
            'Write [{"tool_name": "f"}] inside an action block',
            reasoning="cohere_command4",
            lead="<|START_RESPONSE|>Let me check that for you 🔍.<|END_RESPONSE|>",
            lead_out="Let me check that for you 🔍.",
        ),
        "inkling": ToolFormat(
            _inkling,
            '<|end_message|> {"args": 1}',
            'A call is {"name": "f", "args": {}} in a tool block',
            reasoning="inkling",
            lead="<|message_model|><|content_text|>Let me check that for you 🔍.<|end_message|>",
            lead_out="Let me check that for you 🔍.",
        ),
        "step3p5": replace(TOOL_FORMATS["qwen3_coder"], reasoning="step3p5"),
        "step5": replace(TOOL_FORMATS["qwen3_coder"], reasoning="step5"),
        "mimo": ToolFormat(
            _qwen3_xml("<tool_call>", "</tool_call>", False),
            "<tool_call> and <function=x>",
            "Use <function=f> with <parameter=x> in a <tool_ block",
            reasoning="mimo",
        ),
        "ling3": replace(TOOL_FORMATS["glm47"], reasoning="ling3"),
        "poolside_v1": replace(TOOL_FORMATS["glm45"], reasoning="poolside_v1"),
        "hy_v3": ToolFormat(
            _hy("<tool_sep>", "\n"),
            "</tool_calls> <tool_sep>",
            "The <tool_calls> block and <arg_key> tags are markup; <tool_",
            reasoning="hy_v3",
        ),
        "hy_v4": ToolFormat(
            _hy("", ""),
            "</arg_key> and <tool_call>",
            "Write <arg_key>city</arg_key> in a <tool_calls block",
            reasoning="hy_v4",
        ),
        "k2_horizon": ToolFormat(
            _k2_horizon,
            "</ifm|arg_key> <ifm|tool_call>",
            "The <ifm|arg_type> tag types a value; <ifm|",
            reasoning="k2_horizon",
        ),
        "dots": ToolFormat(
            lambda calls: _invokes("", "dots_function_call", calls),
            '<invoke name="x"> in text',
            "The <dots_function_call block and <invoke name> are markup; <dots_",
            reasoning="qwen3",
        ),
        "minicpm5": ToolFormat(
            _minicpm5,
            '<param name="x"> and </function>',
            "A <function> tag with <param name> children; <function",
            reasoning="qwen3",
        ),
        "deepseek_v4": ToolFormat(
            _dsml_like("｜DSML｜", "tool_calls"),
            "<｜DSML｜invoke> text",
            'The <｜DSML｜invoke name="x"> tag needs a tool_calls block around it',
            reasoning="deepseek_v4",
        ),
        "deepseek_v41": ToolFormat(
            _dsml_like("｜DSML｜", "calls", spaced=True),
            "<｜DSML｜ invoke> text",
            'The <｜DSML｜ invoke name="x"> tag needs a calls block around it',
            reasoning="deepseek_v41",
        ),
        "gigachat35": ToolFormat(
            _dsml_like("｜GCML｜", "tool_calls"),
            "<｜GCML｜invoke> text",
            'The <｜GCML｜invoke name="x"> tag needs a tool_calls block around it',
        ),
        "kimi_k3": ToolFormat(
            _kimi_k3,
            '<|open|>call tool="x"<|sep|> in a string',
            'A call has a tool="get_weather" attribute and typed arguments',
            reasoning="kimi_k3",
            lead="<|open|>response<|sep|>Let me check that for you 🔍.<|close|>response<|sep|>",
            lead_out="Let me check that for you 🔍.",
        ),
        "gemma4": ToolFormat(
            _gemma4,
            "<tool_call|> a {b} c",
            "Call it as call:get_weather{city:Paris} later",
            reasoning="gemma4",
            held=True,
        ),
        "lfm2": ToolFormat(
            _lfm2,
            "<|tool_call_end|> and [f(x=1)]",
            "Write [get_weather(city='x')] between the tool call tokens",
            held=True,
        ),
        "minimax_m3": ToolFormat(
            _minimax_m3,
            "]<]minimax[>[<b> inside",
            "The ]<]minimax[>[ prefix marks M3's tags, <invoke name> too",
            reasoning="minimax_m3",
            held=True,
        ),
        "plamo3": ToolFormat(
            _plamo3,
            "<|plamo:end_tool_request:plamo|> text",
            "PLaMo writes <|plamo:begin_tool_name:plamo| tags around names",
            reasoning="plamo3",
        ),
    }
)

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

THINK_FORMATS.update(
    {
        "hf": THINK_FORMATS["qwen3"],
        "muse_glimmer": ThinkFormat(
            " to=self<|message|>",
            "<|eom|>",
            between="<|start|>assistant to=user<|message|>",
            after="<|eot|>",
            prompt_opens=False,
        ),
        "glm47": THINK_FORMATS["glm45"],
        "ling3": THINK_FORMATS["glm45"],
        "nemotron_v3": THINK_FORMATS["qwen3"],
        "granite_thinking_parser": THINK_FORMATS["qwen3"],
        "mimo": THINK_FORMATS["qwen3"],
        "qwen3_thinking": ThinkFormat("<think>", "</think>", implicit=True),
        "hy_v3": ThinkFormat(
            "<think>", "</think>", on={"reasoning_effort": "high"}, prompt_opens=False
        ),
        "hy_v4": ThinkFormat("<think>", "</think>", prompt_opens=False),
        "deepseek_v4": THINK_FORMATS["deepseek_v3"],
        "deepseek_v41": THINK_FORMATS["deepseek_v3"],
        "holo2": THINK_FORMATS["deepseek_v3"],
        "poolside_v1": THINK_FORMATS["deepseek_v3"],
        "step3p5": ThinkFormat("<think>", "</think>", implicit=True),
        "step5": ThinkFormat("<think>", "</think>", implicit=True),
        "kimi_k3": ThinkFormat(
            "<|open|>think<|sep|>",
            "<|close|>think<|sep|>",
            off={"thinking": False},
            between="<|open|>response<|sep|>",
            after="<|close|>response<|sep|>",
        ),
        "gemma4": ThinkFormat(
            "<|channel>thought\n",
            "<channel|>",
            on={"enable_thinking": True},
            prompt_opens=False,
            between="",
        ),
        "minimax_m3": ThinkFormat("<mm:think>", "</mm:think>", prompt_opens=False),
        "cohere_command3": ThinkFormat(
            "<|START_THINKING|>",
            "<|END_THINKING|>",
            between="<|START_RESPONSE|>",
            after="<|END_RESPONSE|>",
            prompt_opens=False,
        ),
        "cohere_command4": ThinkFormat(
            "<|START_THINKING|>",
            "<|END_THINKING|>",
            between="<|START_RESPONSE|>",
            after="<|END_RESPONSE|>",
            prompt_opens=False,
        ),
        "inkling": ThinkFormat(
            "<|message_model|><|content_thinking|>",
            "<|end_message|>",
            between="<|message_model|><|content_text|>",
            after="<|end_message|>",
            prompt_opens=False,
        ),
        "k2_horizon": ThinkFormat("<ifm|think>", "</ifm|think>", implicit=True),
        "plamo3": ThinkFormat(
            "<|plamo:begin_think:plamo|>", "<|plamo:end_think:plamo|>", prompt_opens=False
        ),
        "apertus": ThinkFormat("<|inner_prefix|>", "<|inner_suffix|>", prompt_opens=False),
        "kimi": ThinkFormat("◁think▷", "◁/think▷", prompt_opens=False),
    }
)

#: Where each new family's output shape comes from (the model's chat template where it was at
#: hand, else the format its parser documents in vLLM 0.33's or SGLang 0.5.23's source).
SOURCES: dict[str, str] = {
    "muse_glimmer": "Muse's ATEM messages as vLLM's muse parser documents them",
    "hf": "a Qwen3-style response_template (Hugging Face's response-parsing metadata)",
    "qwen3_json": "Qwen2.5/Qwen3 chat template (hermes-style <tool_call> JSON)",
    "granite4": "Granite 4 chat template: <tool_call> JSON, as vLLM's granite4 parser reads",
    "ernie45": "ERNIE-4.5 parser docs in vLLM (<tool_call> JSON after </think>)",
    "iquest_q1": "SGLang's iquest_q1 detector (GLM-4.7 XML in <iquest_tool_call>)",
    "llama4_json": "Llama 3.1/4 JSON tool format (vLLM maps llama4_json to llama3_json)",
    "llama4_pythonic": "Llama 4 chat template (pythonic list, optional <|python_start|>)",
    "apertus": "vLLM's apertus parser docstring (<|tools_prefix|>[{name: args}]<|tools_suffix|>)",
    "cohere_command3": "Command A template as SGLang's cohere_command4 detector documents it",
    "cohere_command4": "Command A template as SGLang's cohere_command4 detector documents it",
    "inkling": "vLLM's inkling parser docstring (typed content blocks)",
    "step3p5": "Step-3.5 template: Qwen3-Coder XML (vLLM's step3p5 parser)",
    "step5": "Step-5: Qwen3-Coder XML (vLLM's step5 parser)",
    "mimo": "MiMo: Qwen3-Coder XML, verbatim values (vLLM's mimo parser)",
    "ling3": "Ling 3: GLM-4.7 XML (vLLM's ling3 parser)",
    "poolside_v1": "Poolside: GLM-4 XML (vLLM's poolside_v1 parser)",
    "hy_v3": "HY v3 format as SGLang's hunyuan detector documents it",
    "hy_v4": "HY v4 format from vLLM's hy_v4 parser (no <tool_sep>)",
    "k2_horizon": "K2 Horizon IFM xml_typed format from vLLM's k2_horizon parser",
    "dots": "dots format as vLLM's and SGLang's dots parsers document it",
    "minicpm5": "MiniCPM 5 <function name><param name> format from vLLM's minicpm5 parser",
    "deepseek_v4": "DeepSeek-V4 DSML as vLLM's deepseek_v4 parser documents it",
    "deepseek_v41": "DeepSeek-V4.1 spaced DSML from vLLM's deepseek_v41 parser",
    "gigachat35": "GigaChat 3.5 GCML from SGLang's gigachat35 detector",
    "kimi_k3": "Kimi K3 XTML channels as vLLM's kimi_k3 parser documents them",
    "gemma4": "Gemma 4 format as vLLM's gemma4 parser documents it",
    "lfm2": "LFM2 format as vLLM's lfm2 parser documents it",
    "minimax_m3": "MiniMax-M3 namespaced XML as vLLM's minimax_m3 parser documents it",
    "plamo3": "PLaMo 3 markers from vLLM's plamo3 parser",
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
    # the newer families' special tokens
    "<|tools_prefix|>",
    "<|tools_suffix|>",
    "<|inner_prefix|>",
    "<|inner_suffix|>",
    "<|START_ACTION|>",
    "<|END_ACTION|>",
    "<|START_RESPONSE|>",
    "<|END_RESPONSE|>",
    "<|START_THINKING|>",
    "<|END_THINKING|>",
    "<|message_model|>",
    "<|content_text|>",
    "<|content_thinking|>",
    "<|content_invoke_tool_json|>",
    "<|end_message|>",
    "<tool_sep>",
    "<ifm|tool_calls>",
    "</ifm|tool_calls>",
    "<ifm|tool_call>",
    "</ifm|tool_call>",
    "<ifm|arg_key>",
    "</ifm|arg_key>",
    "<ifm|arg_type>",
    "</ifm|arg_type>",
    "<ifm|arg_value>",
    "</ifm|arg_value>",
    "<ifm|think>",
    "</ifm|think>",
    "<|open|>",
    "<|close|>",
    "<|sep|>",
    "<|channel>",
    "<channel|>",
    "<|tool_call>",
    "<tool_call|>",
    '<|"|>',
    "<mm:think>",
    "</mm:think>",
    "]<]minimax[>[",
    "<|tool_call_start|>",
    "<|tool_call_end|>",
    "<assistant>",
    "<|start|>",
    "<|message|>",
    "<|eom|>",
    "<|eot|>",
]
#: A Mistral tokenizer before v11 has no ``[ARGS]`` (its calls are a JSON list).
MISTRAL_V3_MARKERS = [m for m in MARKERS if m not in ("[ARGS]", "[CALL_ID]")]


def prompt_text(case: Case) -> str:
    """The end of the rendered prompt the case's output follows."""
    if case.tokenizer == "gptoss":
        return "<|start|>user<|message|>hi<|end|><|start|>assistant"
    head = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    fmt = THINK_FORMATS.get(case.reasoning or "")
    if fmt is None:
        return head
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
        between = think.between if fmt.reasoning_between is None else fmt.reasoning_between
        text = f"{open_tag}{THOUGHT}{think.end}{between}{lead}{fmt.render([WEATHER])}"
        text += think.after if fmt.reasoning_after is None else fmt.reasoning_after
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


def _k2_typed() -> list[Case]:
    kwargs = {"tool_call_format": "xml_typed"}
    return [
        Case(
            "tool/k2_horizon/typed",
            "k2_horizon",
            None,
            "Checking. " + _k2_horizon([WEATHER, FLAGS], typed=True),
            content_out="Checking.",
            calls_out=[WEATHER, FLAGS],
            kwargs=kwargs,
        )
    ]


def _append_think_cases() -> list[Case]:
    """``minimax_m2_append_think`` splits nothing: the output is the answer, ``<think>`` put
    back in front."""
    text = THOUGHT + "</think>\n\n" + ANSWER
    return [
        Case(
            "reasoning/minimax_m2_append_think/think-answer",
            None,
            "minimax_m2_append_think",
            text,
            content_out="<think>" + text,
        )
    ]


CASES: list[Case] = [
    *(c for name, fmt in TOOL_FORMATS.items() for c in _tool_cases(name, fmt)),
    *(c for name, fmt in THINK_FORMATS.items() for c in _reasoning_cases(name, fmt)),
    *_mistral_v3_cases(),
    *_xlam_extra(),
    *_k2_typed(),
    *_append_think_cases(),
]
