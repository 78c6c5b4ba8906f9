"""XML-style tool calls: a call's name and its parameters written as tags around bare text, the
shape Qwen3-Coder, Seed-OSS, GLM-4.5/4.7, MiniMax-M2, Step-3 and DeepSeek-V3.2 share::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

One incremental parser reads them all; what differs between families is data (``XmlMarkup``):
which tags open and close a block of calls, a call, its name, a parameter's key and value.
Values are bare text typed by the request's tool schemas (``values.coerce``): a string
parameter streams as it comes, any other is converted when its closing tag arrives. The
arguments are built as JSON text (``{"city": "Paris", "days": 3}``), so a call cut short by the
token limit still has arguments a client can read: the parameters written so far.

A block that does not go on as a call (prose that happens to hold the opening tag) stays in the
content as written; space right after a block of calls is dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from tokenwire.parsers.markers import find_marker
from tokenwire.parsers.tools.base import ToolCallParser, ToolDelta
from tokenwire.parsers.tools.values import coerce, is_string_only

__all__ = [
    "DeepSeekV32ToolParser",
    "DeepSeekV41ToolParser",
    "DeepSeekV4ToolParser",
    "DotsToolParser",
    "GigaChat35ToolParser",
    "HYV3ToolParser",
    "HYV4ToolParser",
    "IQuestQ1ToolParser",
    "K2HorizonToolParser",
    "KimiK3ToolParser",
    "Ling3ToolParser",
    "MiMoToolParser",
    "MiniCPM5ToolParser",
    "PoolsideV1ToolParser",
    "Step3p5ToolParser",
    "Step5ToolParser",
    "Glm45ToolParser",
    "Glm47ToolParser",
    "MinimaxM2ToolParser",
    "Qwen3CoderToolParser",
    "Qwen3XmlToolParser",
    "SeedOssToolParser",
    "Step3ToolParser",
    "XmlMarkup",
    "XmlToolParser",
]


@dataclass(frozen=True)
class XmlMarkup:
    """The tags of one family's XML-style calls."""

    #: Opens a block of one or more calls.
    block_open: str
    #: Closes the block (None: a call's own closing tag ends its block).
    block_close: str | None
    #: Opens a call; its name follows (None: the name follows ``block_open`` directly).
    call_open: str | None
    #: Ends the name (None: the name ends where the first parameter or the call's close begins).
    name_end: str | None
    #: Closes a call.
    call_close: str
    #: Opens a parameter; its key follows.
    param_open: str
    #: Ends the key.
    key_end: str
    #: Ends the value.
    value_close: str
    #: Opens the value, after the key and any space (GLM's ``<arg_value>``).
    value_open: str = ""
    #: Attributes between the key and the value end with this (DeepSeek-V3.2's
    #: ``string="true">``): ``string="true"`` makes the value a string, ``"false"`` JSON.
    attrs_end: str | None = None
    #: The attribute that types the value (``string``, Kimi K3's ``type``) and its value that
    #: makes it a string (``true``, ``string``); any other is JSON.
    type_attr: str = "string"
    string_type: str = "true"
    #: A tag pair between the key and the value that names the value's type (K2 Horizon's
    #: ``<ifm|arg_type>string</ifm|arg_type>``), optional: without it the schema types it.
    type_tag: tuple[str, str] | None = None
    #: Other spellings of ``block_open`` (DeepSeek-V4's ``<｜DSML｜toolcalls>``).
    block_opens: tuple[str, ...] = ()
    #: Markup around the content, dropped from it (Kimi K3's response channel).
    drop: tuple[str, ...] = ()
    #: Names and keys are written XML-escaped (``&quot;``, ``&amp;``).
    escaped: bool = False
    #: Markup between a block's calls that carries nothing (Step-3's call wrappers).
    filler: tuple[str, ...] = ()
    #: How much of a value's surrounding space is markup: "newline" (one newline on each
    #: side, as Qwen3-Coder's template writes), "strip" (all of it), "" (none).
    trim: str = ""


_CONTENT, _BLOCK, _NAME, _CALL, _KEY, _ATTRS, _VALUE_OPEN, _VALUE_START, _VALUE, _AFTER = range(10)
_MAX_NAME = 256


def _unescape(text: str) -> str:
    return text.replace("&quot;", '"').replace("&amp;", "&")


def _finite(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, RecursionError):
        return False
    return True


class XmlToolParser(ToolCallParser):
    """XML-style calls as ``markup`` describes them (subclasses set it)."""

    markup: ClassVar[XmlMarkup]

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        m = self.markup
        self._state = _CONTENT
        self._raw = ""  # markup taken since the block opened, while it made no call
        self._block_calls = 0
        self._index = -1
        self._fname = ""
        self._params = 0  # parameters written into the current call's arguments
        self._key = ""
        self._attr: str | None = None  # the value's string="..." attribute
        self._string = False  # the current value streams as a JSON string
        self._value = ""  # a non-string value's text so far
        self._held = ""  # a string value's text held back (space that may be markup)
        self._started = False  # the string value's first character is seen
        self._opened = False  # the string value's key is written
        self._name_ends = (m.name_end,) if m.name_end else (m.param_open, m.call_close)
        self._block_marks = tuple(
            x for x in (m.call_open, m.block_close, *m.filler) if x is not None
        )
        self._opens = (m.block_open, *m.block_opens, *m.drop)
        self._type_re = re.compile(re.escape(m.type_attr) + r'\s*=\s*"([^"]*)"')

    # ---- arguments -------------------------------------------------------------------------------

    def _open_param(self, out: ToolDelta, value_json: str = "") -> None:
        sep = "{" if self._params == 0 else ", "
        self._params += 1
        self._add_args(out, self._index, f"{sep}{json.dumps(self._key, ensure_ascii=False)}: ")
        if value_json:
            self._add_args(out, self._index, value_json)

    def _close_call(self, out: ToolDelta) -> None:
        self._add_args(out, self._index, "}" if self._params else "{}")
        self._index = -1
        self._block_calls += 1

    def _schema(self) -> Any:
        return self.schemas.parameter(self._fname, self._key)

    def _typed(self, text: str) -> Any:
        """A whole non-string value's JSON value."""
        text = self._trim(text, lead=True, tail=True)
        if self.markup.type_tag is not None and self._attr is not None:
            kind = self._attr.split("[", 1)[0].strip().lower()
            return coerce(text, {"type": kind} if kind else self._schema())
        if self.markup.attrs_end is not None:  # string="false" (or no attribute): JSON
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                value = text
            if not isinstance(value, str) and _finite(value):
                return value
            text = value if isinstance(value, str) else text
        return coerce(text, self._schema())

    def _trim(self, text: str, *, lead: bool, tail: bool) -> str:
        trim = self.markup.trim
        if trim == "strip":
            text = text.lstrip() if lead else text
            return text.rstrip() if tail else text
        if trim == "newline":
            if lead and text.startswith("\n"):
                text = text[1:]
            if tail and text.endswith("\n"):
                text = text[:-1]
        return text

    def _emit_string(self, out: ToolDelta, text: str) -> None:
        if text:
            if not self._opened:  # the key goes out with the value's first character
                self._opened = True
                self._open_param(out, '"')
            self._add_args(out, self._index, json.dumps(text, ensure_ascii=False)[1:-1])

    def _string_piece(self, out: ToolDelta, text: str, *, end: bool) -> None:
        """More of a string value (``end``: its last piece). Space that the trim may take is
        held back until what follows it is known."""
        text = self._held + text
        self._held = ""
        trim = self.markup.trim
        if not self._started:
            if trim == "strip":
                text = text.lstrip()
            if trim and not text and not end:
                return  # nothing but space yet: whether it is markup is not known
            if trim == "newline" and text.startswith("\n"):
                text = text[1:]
            self._started = True
        if end:
            self._emit_string(out, self._trim(text, lead=False, tail=True))
            return
        keep = 0
        if trim == "strip":
            keep = len(text) - len(text.rstrip())
        elif trim == "newline" and text.endswith("\n"):
            keep = 1
        self._held = text[len(text) - keep :]
        self._emit_string(out, text[: len(text) - keep])

    # ---- the state machine -----------------------------------------------------------------------

    def _to_content(self, out: ToolDelta, text: str) -> None:
        """The block was no call after all: its markup and ``text`` are content."""
        out.content += self._raw
        self._raw = ""
        self._buf = text
        self._state = _CONTENT

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
                at, marker = find_marker(buf, self._opens, final=final)
                out.content += buf[:at]
                self._buf = buf[at:]
                if marker is None:
                    return
                self._buf = buf[at + len(marker) :]
                if marker in m.drop:
                    continue
                self._raw = marker
                self._block_calls = 0
                self._state = _BLOCK if m.call_open is not None else _NAME
            elif state == _BLOCK:
                s = buf.lstrip()
                self._raw += buf[: len(buf) - len(s)]
                mark = next((x for x in self._block_marks if s.startswith(x)), None)
                if mark is None:
                    if not final and (not s or any(x.startswith(s) for x in self._block_marks)):
                        self._buf = s
                        return
                    if self._block_calls:
                        self._raw = ""  # after calls: the markup so far stays taken
                    self._to_content(out, s)
                    continue
                self._raw += mark
                self._buf = s[len(mark) :]
                if mark == m.block_close:
                    self._raw = ""
                    self._state = _AFTER
                elif mark == m.call_open:
                    self._state = _NAME
            elif state == _NAME:
                at, marker = find_marker(buf, self._name_ends, final=final)
                name = buf[:at].strip()
                if (
                    any(c.isspace() for c in name)
                    or len(name) > _MAX_NAME
                    or (marker is not None and not name)
                    or (marker is None and final)
                ):
                    self._to_content(out, buf)  # no call: prose that holds the opening tag
                    continue
                if marker is None:
                    return
                keep = m.name_end is None  # the marker begins the call's body: read it there
                self._buf = buf[at:] if keep else buf[at + len(marker) :]
                self._raw = ""
                name = _unescape(name) if m.escaped else name
                self._fname = name
                self._index = self._new_call(out, name)
                self._params = 0
                self._state = _CALL
            elif state == _CALL:
                at, marker = find_marker(buf, (m.param_open, m.call_close), final=final)
                self._buf = buf[at:]  # text between parameters carries nothing
                if marker is None:
                    if final:
                        self._close_call(out)
                        self._buf = ""
                    return
                self._buf = buf[at + len(marker) :]
                if marker == m.call_close:
                    self._close_call(out)
                    self._state = _BLOCK if m.block_close is not None else _AFTER
                else:
                    self._key = ""
                    self._attr = None
                    self._state = _KEY
            elif state in (_KEY, _ATTRS):
                end = m.key_end if state == _KEY else m.attrs_end
                assert end is not None
                at, marker = find_marker(buf, (end,), final=final)
                if marker is None:
                    if final:
                        self._close_call(out)
                        self._buf = ""
                    return
                if state == _KEY:
                    self._key = buf[:at].strip()
                    self._key = _unescape(self._key) if m.escaped else self._key
                else:
                    found = self._type_re.search(buf[:at])
                    self._attr = found.group(1) if found else None
                self._buf = buf[at + len(marker) :]
                if state == _KEY and m.attrs_end is not None:
                    self._state = _ATTRS
                else:
                    self._state = _VALUE_OPEN if m.value_open else _VALUE_START
            elif state == _VALUE_OPEN:
                s = buf.lstrip()
                tag = m.type_tag
                if tag is not None and self._attr is None and s.startswith(tag[0]):
                    at, marker = find_marker(s, (tag[1],), final=final)
                    if marker is None:
                        if final:
                            self._close_call(out)
                            self._buf = ""
                        else:
                            self._buf = s
                        return
                    self._attr = s[len(tag[0]) : at].strip()
                    self._buf = s[at + len(marker) :]
                    continue
                if tag is not None and self._attr is None and not final and tag[0].startswith(s):
                    self._buf = s
                    return
                if s.startswith(m.value_open):
                    self._buf = s[len(m.value_open) :]
                    self._state = _VALUE_START
                elif not final and m.value_open.startswith(s):
                    return
                else:
                    self._state = _VALUE_START
            elif state == _VALUE_START:
                if m.attrs_end is not None:
                    self._string = self._attr == m.string_type
                elif m.type_tag is not None and self._attr is not None:
                    self._string = self._attr.strip().lower() == "string"
                else:
                    self._string = is_string_only(self._schema())
                self._value = self._held = ""
                self._started = self._opened = False
                self._state = _VALUE
            else:  # _VALUE
                at, marker = find_marker(buf, (m.value_close,), final=final)
                piece = buf[:at]
                ended = marker is not None
                if self._string:
                    self._string_piece(out, piece, end=ended or final)
                    if ended and not self._opened:  # an empty string
                        self._opened = True
                        self._open_param(out, '"')
                    if (ended or final) and self._opened:
                        self._add_args(out, self._index, '"')
                else:
                    self._value += piece
                    if ended:
                        value = self._typed(self._value)
                        self._open_param(out, json.dumps(value, ensure_ascii=False))
                if not ended:
                    self._buf = buf[at:]
                    if final:
                        self._buf = ""
                        self._close_call(out)
                    return
                self._buf = buf[at + len(marker) :]
                self._state = _CALL


_QWEN3 = XmlMarkup(
    block_open="<tool_call>",
    block_close="</tool_call>",
    call_open="<function=",
    name_end=">",
    call_close="</function>",
    param_open="<parameter=",
    key_end=">",
    value_close="</parameter>",
    trim="newline",
)


class Qwen3CoderToolParser(XmlToolParser):
    """``qwen3_coder``: Qwen3-Coder (and Qwen3.5) calls, ``<tool_call><function=NAME>`` with
    ``<parameter=KEY>`` values inside."""

    name = "qwen3_coder"
    markup = _QWEN3


class Qwen3XmlToolParser(Qwen3CoderToolParser):
    """``qwen3_xml``: the same format under vLLM's other name for it."""

    name = "qwen3_xml"


class SeedOssToolParser(XmlToolParser):
    """``seed_oss``: Seed-OSS calls, Qwen3-Coder's format inside ``<seed:tool_call>``."""

    name = "seed_oss"
    needs_special_tokens = True
    markup = replace(_QWEN3, block_open="<seed:tool_call>", block_close="</seed:tool_call>")


class Glm45ToolParser(XmlToolParser):
    """``glm45``: GLM-4.5/4.6 calls, ``<tool_call>NAME`` then ``<arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>`` pairs, ``</tool_call>``."""

    name = "glm45"
    needs_special_tokens = True
    markup = XmlMarkup(
        block_open="<tool_call>",
        block_close=None,
        call_open=None,
        name_end=None,
        call_close="</tool_call>",
        param_open="<arg_key>",
        key_end="</arg_key>",
        value_open="<arg_value>",
        value_close="</arg_value>",
    )


class Glm47ToolParser(Glm45ToolParser):
    """``glm47``: GLM-4.7, the same format without newlines between the tags."""

    name = "glm47"


class MinimaxM2ToolParser(XmlToolParser):
    """``minimax_m2``: MiniMax-M2 calls, ``<invoke name="NAME">`` with ``<parameter
    name="KEY">`` values inside one ``<minimax:tool_call>`` block."""

    name = "minimax_m2"
    needs_special_tokens = True
    markup = XmlMarkup(
        block_open="<minimax:tool_call>",
        block_close="</minimax:tool_call>",
        call_open='<invoke name="',
        name_end='">',
        call_close="</invoke>",
        param_open='<parameter name="',
        key_end='">',
        value_close="</parameter>",
    )


class Step3ToolParser(XmlToolParser):
    """``step3``: Step-3 calls, ``<steptml:invoke name="NAME">`` with ``<steptml:parameter
    name="KEY">`` values, each wrapped in ``<｜tool_call_begin｜>function<｜tool_sep｜>`` ...
    ``<｜tool_call_end｜>`` inside ``<｜tool_calls_begin｜>``."""

    name = "step3"
    needs_special_tokens = True
    markup = XmlMarkup(
        block_open="<｜tool_calls_begin｜>",
        block_close="<｜tool_calls_end｜>",
        call_open='<steptml:invoke name="',
        name_end='">',
        call_close="</steptml:invoke>",
        param_open='<steptml:parameter name="',
        key_end='">',
        value_close="</steptml:parameter>",
        filler=("<｜tool_call_begin｜>", "function<｜tool_sep｜>", "<｜tool_call_end｜>"),
        trim="strip",
    )


_DSML = "｜DSML｜"


class DeepSeekV32ToolParser(XmlToolParser):
    """``deepseek_v32``: DeepSeek-V3.2's DSML calls, ``<｜DSML｜invoke name="NAME">`` with
    ``<｜DSML｜parameter name="KEY" string="true|false">`` values (``false``: JSON) inside
    ``<｜DSML｜function_calls>``."""

    name = "deepseek_v32"
    markup = XmlMarkup(
        block_open=f"<{_DSML}function_calls>",
        block_close=f"</{_DSML}function_calls>",
        call_open=f'<{_DSML}invoke name="',
        name_end='">',
        call_close=f"</{_DSML}invoke>",
        param_open=f'<{_DSML}parameter name="',
        key_end='"',
        attrs_end=">",
        value_close=f"</{_DSML}parameter>",
    )


# ---- families on Qwen3-Coder's markup -------------------------------------------------------


class Step3p5ToolParser(Qwen3CoderToolParser):
    """``step3p5``: Step-3.5 / Step-3.7 calls, Qwen3-Coder's format."""

    name = "step3p5"


class Step5ToolParser(Qwen3CoderToolParser):
    """``step5``: Step-5 calls, Qwen3-Coder's format."""

    name = "step5"


class MiMoToolParser(XmlToolParser):
    """``mimo``: MiMo calls, Qwen3-Coder's tags with the values verbatim (no newline around
    them is markup)."""

    name = "mimo"
    markup = replace(_QWEN3, trim="")


# ---- families on GLM's markup --------------------------------------------------------------


class IQuestQ1ToolParser(XmlToolParser):
    """``iquest_q1``: IQuest Q1 calls, GLM-4.7's format in ``<iquest_tool_call>`` tags."""

    name = "iquest_q1"
    needs_special_tokens = True
    markup = replace(
        Glm47ToolParser.markup,
        block_open="<iquest_tool_call>",
        call_close="</iquest_tool_call>",
    )


class Ling3ToolParser(Glm47ToolParser):
    """``ling3``: Ling 3 calls, GLM-4.7's format."""

    name = "ling3"


class PoolsideV1ToolParser(Glm45ToolParser):
    """``poolside_v1``: Poolside calls, GLM-4.5's format (``<tool_call>NAME`` then
    ``<arg_key>``/``<arg_value>`` pairs)."""

    name = "poolside_v1"


_GLM = Glm45ToolParser.markup


class HYV3ToolParser(XmlToolParser):
    """``hy_v3``: Hunyuan (HY) v3 calls, ``<tool_call>NAME<tool_sep>`` then GLM's
    ``<arg_key>``/``<arg_value>`` pairs, in ``<tool_calls>``."""

    name = "hy_v3"
    needs_special_tokens = True
    markup = replace(
        _GLM,
        block_open="<tool_calls>",
        block_close="</tool_calls>",
        call_open="<tool_call>",
        name_end="<tool_sep>",
    )


class HYV4ToolParser(XmlToolParser):
    """``hy_v4``: Hunyuan (HY) v4 calls, ``<tool_call>NAME`` then GLM's pairs, in
    ``<tool_calls>``."""

    name = "hy_v4"
    needs_special_tokens = True
    markup = replace(
        _GLM, block_open="<tool_calls>", block_close="</tool_calls>", call_open="<tool_call>"
    )


class K2HorizonToolParser(XmlToolParser):
    """``k2_horizon``: K2 Horizon's IFM calls, ``<ifm|tool_call>NAME`` then
    ``<ifm|arg_key>KEY</ifm|arg_key>``, an optional ``<ifm|arg_type>TYPE</ifm|arg_type>`` and
    ``<ifm|arg_value>VALUE</ifm|arg_value>``, in ``<ifm|tool_calls>``."""

    name = "k2_horizon"
    needs_special_tokens = True
    markup = XmlMarkup(
        block_open="<ifm|tool_calls>",
        block_close="</ifm|tool_calls>",
        call_open="<ifm|tool_call>",
        name_end=None,
        call_close="</ifm|tool_call>",
        param_open="<ifm|arg_key>",
        key_end="</ifm|arg_key>",
        value_open="<ifm|arg_value>",
        value_close="</ifm|arg_value>",
        type_tag=("<ifm|arg_type>", "</ifm|arg_type>"),
    )


# ---- families on MiniMax-M2's markup -------------------------------------------------------


class DotsToolParser(XmlToolParser):
    """``dots``: dots calls, MiniMax-M2's ``<invoke name="NAME">`` with ``<parameter
    name="KEY">`` values, in ``<dots_function_call>``."""

    name = "dots"
    markup = replace(
        MinimaxM2ToolParser.markup,
        block_open="<dots_function_call>",
        block_close="</dots_function_call>",
    )


class MiniCPM5ToolParser(XmlToolParser):
    """``minicpm5``: MiniCPM 5 calls, ``<function name="NAME">`` with ``<param
    name="KEY">VALUE</param>`` values."""

    name = "minicpm5"
    markup = XmlMarkup(
        block_open='<function name="',
        block_close=None,
        call_open=None,
        name_end='">',
        call_close="</function>",
        param_open='<param name="',
        key_end='">',
        value_close="</param>",
    )


# ---- DSML ----------------------------------------------------------------------------------


def _dsml(tag: str, block: str, spaced: bool = False) -> XmlMarkup:
    sp = " " if spaced else ""
    return XmlMarkup(
        block_open=f"<{tag}{sp}{block}>",
        block_close=f"</{tag}{sp}{block}>",
        call_open=f'<{tag}{sp}invoke name="',
        name_end='">',
        call_close=f"</{tag}{sp}invoke>",
        param_open=f'<{tag}{sp}parameter name="',
        key_end='"',
        attrs_end=">",
        value_close=f"</{tag}{sp}parameter>",
    )


class DeepSeekV4ToolParser(XmlToolParser):
    """``deepseek_v4``: DeepSeek-V4's DSML calls, DeepSeek-V3.2's in
    ``<｜DSML｜tool_calls>`` (or its other spellings ``toolcalls``, ``tool``)."""

    name = "deepseek_v4"
    markup = replace(
        _dsml(_DSML, "tool_calls"), block_opens=(f"<{_DSML}toolcalls>", f"<{_DSML}tool>")
    )


class DeepSeekV41ToolParser(XmlToolParser):
    """``deepseek_v41``: DeepSeek-V4.1's spaced DSML, ``<｜DSML｜ invoke name="NAME">`` in
    ``<｜DSML｜ calls>``."""

    name = "deepseek_v41"
    markup = _dsml(_DSML, "calls", spaced=True)


class GigaChat35ToolParser(XmlToolParser):
    """``gigachat35``: GigaChat 3.5's GCML calls, DSML's shape with ``｜GCML｜`` tags."""

    name = "gigachat35"
    markup = _dsml("｜GCML｜", "tool_calls")


# ---- Kimi K3 ---------------------------------------------------------------------------------


class KimiK3ToolParser(XmlToolParser):
    """``kimi_k3``: Kimi K3's XTML tools channel, ``<|open|>call tool="NAME" index="N"<|sep|>``
    with ``<|open|>argument key="KEY" type="TYPE"<|sep|>VALUE<|close|>argument<|sep|>`` values
    (``type="string"`` verbatim, any other JSON) in ``<|open|>tools<|sep|>``; the response
    channel's markup is dropped from the content."""

    name = "kimi_k3"
    needs_special_tokens = True
    markup = XmlMarkup(
        block_open="<|open|>tools<|sep|>",
        block_close="<|close|>tools<|sep|>",
        call_open='<|open|>call tool="',
        name_end='"',
        call_close="<|close|>call<|sep|>",
        param_open='<|open|>argument key="',
        key_end='"',
        attrs_end="<|sep|>",
        type_attr="type",
        string_type="string",
        value_close="<|close|>argument<|sep|>",
        drop=(
            "<|open|>response<|sep|>",
            "<|close|>response<|sep|>",
            "<|close|>message<|sep|>",
        ),
        escaped=True,
    )
