"""JSON tool calls after a marker: ``{"name": ..., "arguments": {...}}`` objects, one per marker or
a JSON list of them, the shape Hermes, Granite, Jamba, InternLM, Phi-4-mini, xLAM, Hunyuan,
LongCat and GigaChat share::

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>
    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", ...}]

One incremental parser reads them all; what differs between families is data (``JsonMarkup``):
the markers that open calls and the closing tag each has, whether a list, one object or either
follows. The JSON is read as JSON, so a closing tag inside a string argument does not end the
call; a call's name goes out as soon as it is complete and its arguments as they come. The
arguments key may be ``arguments`` or ``parameters``.

Markup that does not go on as calls (prose that mentions the marker, a list that holds no call)
stays in the content as written; space right after calls is dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tokenwire.parsers.markers import find_marker
from tokenwire.parsers.tools.base import (
    NAMED,
    JsonCallStreamer,
    JsonShape,
    ToolCallParser,
    ToolDelta,
)

__all__ = [
    "ApertusToolParser",
    "CohereCommand3ToolParser",
    "CohereCommand4ToolParser",
    "Ernie45ToolParser",
    "GigaChat3ToolParser",
    "Granite4ToolParser",
    "InklingToolParser",
    "Qwen3JsonToolParser",
    "Granite20bFCToolParser",
    "GraniteToolParser",
    "HermesToolParser",
    "HunyuanA13BToolParser",
    "InternLMToolParser",
    "JambaToolParser",
    "JsonMarkup",
    "JsonToolParser",
    "LongcatToolParser",
    "Phi4MiniJsonToolParser",
    "XLAMToolParser",
]


@dataclass(frozen=True)
class JsonMarkup:
    """Where one family's JSON calls are."""

    #: Each marker that opens calls, and the closing tag after them (None: none).
    openers: Mapping[str, str | None]
    #: What follows a marker: "list" (a JSON list of calls), "object" (one call), "any".
    body: str = "any"
    #: An output that opens (after space) with a JSON list is calls, with no marker (xLAM).
    bare_list: bool = False
    #: Markup that ends the text before a call, dropped when a call follows it (GigaChat's
    #: ``<|message_sep|>``).
    content_end: str | None = None
    #: How one call is written.
    shape: JsonShape = NAMED
    #: Markup around the content, dropped from it (Cohere's ``<|START_RESPONSE|>``).
    drop: tuple[str, ...] = ()
    #: ``(trigger, before, after)``: one call as its template writes it, ``before`` +
    #: ``{"name": NAME, "arguments": ARGS}`` + ``after`` (``strict_call``; None: not so).
    strict: tuple[str, str, str] | None = None
    marks: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        marks = tuple(self.openers) + ((self.content_end,) if self.content_end else ())
        object.__setattr__(self, "marks", marks + self.drop)


_CONTENT, _PRE, _BODY, _ITEM, _OBJECT, _SEP, _CLOSER, _AFTER = range(8)


class JsonToolParser(ToolCallParser):
    """JSON calls as ``markup`` describes them (subclasses set it)."""

    markup: ClassVar[JsonMarkup]

    @classmethod
    def strict_call(cls, name: str) -> tuple[str, str, str] | None:
        m = cls.markup
        if m.strict is None or m.shape.keyed or m.shape.lead:
            return None
        trigger, before, after = m.strict
        head = f"{{{json.dumps(m.shape.names[0])}: {json.dumps(name, ensure_ascii=False)}, "
        return trigger, f"{before}{head}{json.dumps(m.shape.arguments[0])}: ", "}" + after

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._state = _CONTENT
        self._raw = ""  # markup taken since the marker, while no call came of it
        self._held = ""  # content_end and the space after it, until a call follows or not
        self._closer: str | None = None
        self._in_list = False
        self._body_calls = 0
        self._call = JsonCallStreamer(self.markup.shape)
        self._index = -1
        self._at_start = True  # nothing but space so far (a bare list may still open it)

    def _fail(self, out: ToolDelta, text: str) -> None:
        """The markup did not go on as calls: content from here (``text`` is still to read),
        the markup too if no call came of it."""
        if not self._body_calls:
            out.content += self._raw
        self._raw = ""
        self._buf = text
        self._state = _CONTENT

    def _open(self, marker: str, raw: str) -> None:
        self._raw = raw
        self._closer = self.markup.openers[marker]
        self._body_calls = 0
        self._state = _BODY

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        m = self.markup
        while True:
            buf = self._buf
            state = self._state
            if state == _AFTER:
                rest = buf.lstrip()
                if not rest and not final:
                    self._buf = ""
                    return
                self._buf = rest
                self._state = _CONTENT
            elif state == _CONTENT:
                if self._at_start and m.bare_list:
                    s = buf.lstrip()
                    marker_ahead = any(o.startswith(s) or s.startswith(o) for o in m.openers)
                    if (not s or (s.startswith("[") and marker_ahead)) and not final:
                        return  # a bare list or a marker's "[": not known yet
                    if s.startswith("[") and not any(s.startswith(o) for o in m.openers):
                        self._raw = buf[: len(buf) - len(s)]
                        self._buf = s
                        self._closer = None
                        self._body_calls = 0
                        self._at_start = False
                        self._state = _BODY
                        continue
                at, marker = find_marker(buf, m.marks, final=final)
                if at and buf[:at].strip():
                    self._at_start = False
                out.content += buf[:at]
                self._buf = buf[at:]
                if marker is None:
                    return
                self._buf = buf[at + len(marker) :]
                if marker in m.drop:
                    continue
                self._at_start = False
                if marker == m.content_end:
                    self._held = marker
                    self._state = _PRE
                else:
                    self._open(marker, marker)
            elif state == _PRE:
                s = buf.lstrip()
                self._held += buf[: len(buf) - len(s)]
                self._buf = s
                opener = next((o for o in m.openers if s.startswith(o)), None)
                if (
                    opener is None
                    and not final
                    and (not s or any(o.startswith(s) for o in m.openers))
                ):
                    return
                if opener is None:
                    out.content += self._held
                    self._state = _CONTENT
                else:  # the markup goes with the call (and comes back if it is none)
                    self._buf = s[len(opener) :]
                    self._open(opener, self._held + opener)
                self._held = ""
            elif state in (_BODY, _ITEM, _SEP):
                s = buf.lstrip()
                self._raw += buf[: len(buf) - len(s)]
                self._buf = s
                if not s:
                    if final:
                        self._fail(out, "")
                        continue
                    return
                c = s[0]
                if state == _BODY and c == "[" and m.body != "object":
                    self._raw += c
                    self._buf = s[1:]
                    self._in_list = True
                    self._state = _ITEM
                elif c == "{" and (state == _ITEM or (state == _BODY and m.body != "list")):
                    if state == _BODY:
                        self._in_list = False
                    self._call = JsonCallStreamer(m.shape)
                    self._index = -1
                    self._state = _OBJECT
                elif c == "]" and state in (_ITEM, _SEP):
                    self._buf = s[1:]
                    self._raw = ""
                    self._state = _CLOSER
                elif c == "," and state == _SEP:
                    self._raw += c
                    self._buf = s[1:]
                    self._state = _ITEM
                else:
                    self._fail(out, s)
            elif state == _OBJECT:
                name, args = self._call.push(buf, final=final)
                if name is not None:
                    self._index = self._new_call(out, name)
                    self._body_calls += 1
                    self._raw = ""
                self._add_args(out, self._index, args)
                self._buf = self._call.rest
                if not self._call.complete and not final:
                    return
                if self._index < 0:
                    whole = self._call.close()
                    if whole is None:  # no call: the object as written
                        self._raw += self._call.text
                        self._fail(out, self._call.rest)
                        continue
                    self._whole_call(out, *whole)
                    self._body_calls += 1
                    self._raw = ""
                self._state = _SEP if self._in_list else _CLOSER
                if final and not self._buf:
                    return
            else:  # _CLOSER
                closer = self._closer
                s = buf.lstrip()
                if closer is None or s.startswith(closer):
                    self._buf = s[len(closer) :] if closer else buf
                    self._state = _AFTER
                elif not final and (not s or closer.startswith(s)):
                    return
                else:
                    self._buf = buf
                    self._state = _CONTENT


class HermesToolParser(JsonToolParser):
    """``hermes``: Hermes-2-Pro / Qwen2.5 / Qwen3 calls, ``<tool_call>{"name": ...,
    "arguments": {...}}</tool_call>``, any number of them, with content before and between."""

    name = "hermes"
    markup = JsonMarkup(
        {"<tool_call>": "</tool_call>"},
        body="object",
        strict=("<tool_call>", "<tool_call>\n", "\n</tool_call>"),
    )


class LongcatToolParser(JsonToolParser):
    """``longcat``: LongCat-Flash calls, Hermes' format in ``<longcat_tool_call>`` tags."""

    name = "longcat"
    needs_special_tokens = True
    markup = JsonMarkup(
        {"<longcat_tool_call>": "</longcat_tool_call>"},
        body="object",
        strict=("<longcat_tool_call>", "<longcat_tool_call>\n", "\n</longcat_tool_call>"),
    )


class InternLMToolParser(JsonToolParser):
    """``internlm``: InternLM2/3 calls, ``<|action_start|><|plugin|>{"name": ...,
    "parameters": {...}}<|action_end|>`` (Intern-S1 writes a space between the two tokens)."""

    name = "internlm"
    needs_special_tokens = True
    markup = JsonMarkup(
        {
            "<|action_start|><|plugin|>": "<|action_end|>",
            "<|action_start|> <|plugin|>": "<|action_end|>",
        },
        body="object",
        shape=JsonShape(arguments=("parameters", "arguments")),
        strict=("<|action_start|>", "<|action_start|><|plugin|>\n", "<|action_end|>"),
    )


class GraniteToolParser(JsonToolParser):
    """``granite``: Granite 3.x calls, a JSON list after ``<|tool_call|>`` (3.0) or
    ``<tool_call>`` (3.1), no closing tag."""

    name = "granite"
    needs_special_tokens = True
    markup = JsonMarkup({"<|tool_call|>": None, "<tool_call>": None})


class Granite20bFCToolParser(JsonToolParser):
    """``granite-20b-fc``: granite-20b-functioncalling, ``<function_call> {...}`` per call."""

    name = "granite-20b-fc"
    markup = JsonMarkup({"<function_call>": None}, body="object")


class JambaToolParser(JsonToolParser):
    """``jamba``: Jamba 1.5+ calls, a JSON list in ``<tool_calls>`` ... ``</tool_calls>``."""

    name = "jamba"
    needs_special_tokens = True
    markup = JsonMarkup({"<tool_calls>": "</tool_calls>"}, body="list")


class HunyuanA13BToolParser(JsonToolParser):
    """``hunyuan_a13b``: Hunyuan-A13B calls, a JSON list in ``<tool_calls>`` tags."""

    name = "hunyuan_a13b"
    markup = JsonMarkup({"<tool_calls>": "</tool_calls>"}, body="list")


class Phi4MiniJsonToolParser(JsonToolParser):
    """``phi4_mini_json``: Phi-4-mini calls, ``functools[{...}, ...]``."""

    name = "phi4_mini_json"
    markup = JsonMarkup({"functools": None}, body="list")


class XLAMToolParser(JsonToolParser):
    """``xlam``: xLAM calls, a JSON list of calls as the whole answer, or in a ```` ```json ````
    fence, ``<tool_call>`` tags or after ``[TOOL_CALLS]``."""

    name = "xlam"
    markup = JsonMarkup(
        {"```json": "```", "<tool_call>": "</tool_call>", "[TOOL_CALLS]": None},
        body="list",
        bare_list=True,
    )


class GigaChat3ToolParser(JsonToolParser):
    """``gigachat3``: GigaChat 3 calls, ``function call<|role_sep|>`` then the call's JSON
    (the text before it ends with ``<|message_sep|>``, dropped)."""

    name = "gigachat3"
    needs_special_tokens = True
    markup = JsonMarkup(
        {"function call<|role_sep|>": None, "<|function_call|>": None},
        body="object",
        content_end="<|message_sep|>",
        strict=("function call<|role_sep|>", "function call<|role_sep|>\n", ""),
    )


class Qwen3JsonToolParser(HermesToolParser):
    """``qwen3_json``: Qwen2.5 / QwQ / Qwen3 JSON calls, Hermes' format (vLLM's name)."""

    name = "qwen3_json"


class Granite4ToolParser(JsonToolParser):
    """``granite4``: Granite 4 calls, Hermes' ``<tool_call>{...}</tool_call>``."""

    name = "granite4"
    needs_special_tokens = True
    markup = HermesToolParser.markup


class Ernie45ToolParser(JsonToolParser):
    """``ernie45``: ERNIE-4.5 calls, Hermes' ``<tool_call>{...}</tool_call>``."""

    name = "ernie45"
    markup = HermesToolParser.markup


class ApertusToolParser(JsonToolParser):
    """``apertus``: Apertus calls, a JSON list of ``{"NAME": {ARGS}}`` objects between
    ``<|tools_prefix|>`` and ``<|tools_suffix|>``."""

    name = "apertus"
    needs_special_tokens = True
    markup = JsonMarkup(
        {"<|tools_prefix|>": "<|tools_suffix|>"}, body="list", shape=JsonShape(keyed=True)
    )


class CohereCommand3ToolParser(JsonToolParser):
    """``cohere_command3``: Command A calls, a JSON list of ``{"tool_call_id", "tool_name",
    "parameters"}`` between ``<|START_ACTION|>`` and ``<|END_ACTION|>``; the response's
    ``<|START_RESPONSE|>``/``<|START_TEXT|>`` markup is dropped from the content."""

    name = "cohere_command3"
    needs_special_tokens = True
    markup = JsonMarkup(
        {"<|START_ACTION|>": "<|END_ACTION|>"},
        body="list",
        shape=JsonShape(
            names=("tool_name", "name"),
            arguments=("parameters", "arguments"),
            lead=("tool_call_id",),
        ),
        drop=("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>"),
    )


class CohereCommand4ToolParser(CohereCommand3ToolParser):
    """``cohere_command4``: Command A 4's calls, the same markup."""

    name = "cohere_command4"


class InklingToolParser(JsonToolParser):
    """``inkling``: Inkling's tool blocks, ``<|message_model|><|content_invoke_tool_json|>
    {"name": ..., "args": {...}}<|end_message|>``; the markup of its text blocks is dropped
    from the content."""

    name = "inkling"
    needs_special_tokens = True
    markup = JsonMarkup(
        {"<|message_model|><|content_invoke_tool_json|>": "<|end_message|>"},
        body="object",
        shape=JsonShape(arguments=("args", "arguments")),
        drop=(
            "<|message_model|><|content_text|>",
            "<|end_message|>",
            "<|content_model_end_sampling|>",
        ),
    )
