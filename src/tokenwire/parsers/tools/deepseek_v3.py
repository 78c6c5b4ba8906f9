"""Calls as a section of delimited calls, each a head, a separator and raw JSON arguments.

``deepseek_v3``: DeepSeek-V3 / R1 tool calls between ``<｜tool▁calls▁begin｜>`` and
``<｜tool▁calls▁end｜>``: each ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` and the arguments
in a fenced ``json`` block, ``<｜tool▁call▁end｜>``; also the V3.1 form without the type and the
fence, ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`` (``deepseek_v31``).

``kimi_k2``: the same shape with Kimi's markers, the head being the call's id
(``functions.NAME:INDEX``), which Kimi's chat template wants back as the call's id."""

from __future__ import annotations

from typing import Any

from tokenwire.parsers.markers import find_marker
from tokenwire.parsers.tools.base import JsonValueStreamer, ToolCallParser, ToolDelta

__all__ = [
    "DeepSeekV31ToolParser",
    "DeepSeekV3ToolParser",
    "KimiK2ToolParser",
    "Plamo3ToolParser",
]

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
_FENCE = "```json"

_CONTENT, _CALLS, _HEAD, _NAME, _FENCED, _ARGS, _SKIP, _ARGS_OPEN = range(8)


class DeepSeekV3ToolParser(ToolCallParser):
    """DeepSeek-V3 tool-call markup."""

    name = "deepseek_v3"
    calls_begin = CALLS_BEGIN
    calls_end = CALLS_END
    call_begin = CALL_BEGIN
    call_end = CALL_END
    sep = SEP
    #: Markup between the separator and the arguments (PLaMo 3's JSON constraint), skipped.
    args_open = ""

    def _head(self, head: str) -> tuple[str, str | None]:
        """A call's name and id from the head before the separator (not ``function``)."""
        return head, None

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._state = _CONTENT
        self._index = -1
        self._value = JsonValueStreamer()

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        while True:
            buf = self._buf
            state = self._state
            if state == _CONTENT:
                at, marker = find_marker(buf, (self.calls_begin,), final=final)
                out.content += buf[:at]
                self._buf = buf[at:]
                if marker is None:
                    return
                self._buf = buf[at + len(marker) :]
                self._state = _CALLS
            elif state == _CALLS:
                s = buf.lstrip()
                if s.startswith(self.call_begin):
                    self._buf = s[len(self.call_begin) :]
                    self._state = _HEAD
                elif s.startswith(self.calls_end):
                    self._buf = s[len(self.calls_end) :]
                    self._state = _CONTENT
                elif not final and (
                    not s or self.call_begin.startswith(s) or self.calls_end.startswith(s)
                ):
                    return
                else:
                    self._state = _CONTENT  # stray text: content
                    self._buf = s
            elif state == _HEAD:
                at, marker = find_marker(buf, (self.sep,), final=final)
                if marker is None:
                    if final:
                        self._buf = ""
                    return
                kind = buf[:at].strip()
                self._buf = buf[at + len(marker) :]
                if kind == "function" and not self.args_open:
                    self._state = _NAME
                else:
                    self._index = self._new_call(out, *self._head(kind))
                    self._value = JsonValueStreamer()
                    self._state = _ARGS_OPEN if self.args_open else _ARGS
            elif state == _NAME:
                at = buf.find("\n")
                if at < 0 and not final:
                    return
                at = len(buf) if at < 0 else at
                self._index = self._new_call(out, buf[:at].strip())
                self._buf = buf[at + 1 :]
                self._state = _FENCED
            elif state == _FENCED:
                if not final and len(buf) < len(_FENCE) + 1 and (_FENCE + "\n").startswith(buf):
                    return
                if buf.startswith(_FENCE):
                    buf = buf[len(_FENCE) :]
                self._buf = buf
                self._value = JsonValueStreamer()
                self._state = _ARGS
            elif state == _ARGS_OPEN:
                s = buf.lstrip()
                if s.startswith(self.args_open):
                    self._buf = s[len(self.args_open) :]
                elif not final and self.args_open.startswith(s):
                    return
                self._state = _ARGS
            elif state == _ARGS:
                if not self._value.started:
                    s = buf.lstrip()
                    if s.startswith(self.call_end):  # no arguments
                        self._add_args(out, self._index, "{}")
                        self._buf = s
                        self._state = _SKIP
                        continue
                    if not final and (not s or self.call_end.startswith(s)):
                        return
                self._add_args(out, self._index, self._value.push(buf, final=final))
                self._buf = self._value.rest if self._value.complete else ""
                if not self._value.complete:
                    return
                self._state = _SKIP
            else:  # _SKIP: what is left of the call (a fence's end) carries nothing
                at, marker = find_marker(buf, (self.call_end,), final=final)
                if marker is None:
                    self._buf = "" if final else buf[at:]
                    return
                self._buf = buf[at + len(marker) :]
                self._state = _CALLS


class DeepSeekV31ToolParser(DeepSeekV3ToolParser):
    """``deepseek_v31``: DeepSeek-V3.1's calls (the V3 parser reads both forms)."""

    name = "deepseek_v31"

    @classmethod
    def strict_call(cls, name: str) -> tuple[str, str, str] | None:
        return CALL_BEGIN, f"{CALL_BEGIN}{name}{SEP}", CALL_END


class KimiK2ToolParser(DeepSeekV3ToolParser):
    """``kimi_k2``: Kimi K2 calls, ``<|tool_call_begin|>functions.NAME:INDEX
    <|tool_call_argument_begin|>{...}<|tool_call_end|>`` in a ``<|tool_calls_section_begin|>``
    section; the head is the call's id."""

    name = "kimi_k2"
    needs_special_tokens = True
    calls_begin = "<|tool_calls_section_begin|>"
    calls_end = "<|tool_calls_section_end|>"
    call_begin = "<|tool_call_begin|>"
    call_end = "<|tool_call_end|>"
    sep = "<|tool_call_argument_begin|>"

    def _head(self, head: str) -> tuple[str, str | None]:
        name = head.rsplit(":", 1)[0] if ":" in head else head
        return name.removeprefix("functions."), head

    @classmethod
    def strict_call(cls, name: str) -> tuple[str, str, str] | None:
        begin = f"{cls.calls_begin}{cls.call_begin}functions.{name}:0{cls.sep}"
        return cls.calls_begin, begin, f"{cls.call_end}{cls.calls_end}"


class Plamo3ToolParser(DeepSeekV3ToolParser):
    """``plamo3``: PLaMo 3 calls, ``<|plamo:begin_tool_request:plamo|><|plamo:begin_tool_name:
    plamo|>NAME<|plamo:end_tool_name:plamo|><|plamo:begin_tool_arguments:plamo|><|plamo:
    constrain|>json<|plamo:msg|>{...}<|plamo:end_tool_arguments:plamo|><|plamo:end_tool_request:
    plamo|>`` in a ``<|plamo:begin_tool_requests:plamo|>`` section."""

    name = "plamo3"
    calls_begin = "<|plamo:begin_tool_requests:plamo|>"
    calls_end = "<|plamo:end_tool_requests:plamo|>"
    call_begin = "<|plamo:begin_tool_request:plamo|><|plamo:begin_tool_name:plamo|>"
    call_end = "<|plamo:end_tool_request:plamo|>"
    sep = "<|plamo:end_tool_name:plamo|>"
    args_open = "<|plamo:begin_tool_arguments:plamo|><|plamo:constrain|>json<|plamo:msg|>"
