"""``mistral``: Mistral tool calls after the ``[TOOL_CALLS]`` token, in either of its formats: a
JSON array of ``{"name", "arguments"}`` objects (older models), or ``name[ARGS]{...}`` per call
(tokenizer v11 and later, optionally ``name[CALL_ID]id[ARGS]{...}``). The markup tokens are
special tokens: the text must keep them. Call ids are nine letters and digits, as Mistral's."""

from __future__ import annotations

from typing import Any

from tokenwire.parsers.markers import find_marker
from tokenwire.parsers.tools.base import (
    JsonCallStreamer,
    JsonValueStreamer,
    ToolCallParser,
    ToolDelta,
    mistral_call_id,
)

__all__ = ["MistralToolParser"]

_CONTENT, _OPENED, _ITEM, _CALL, _SEP, _NAME, _CALL_ID, _ARGS, _AFTER = range(9)
_TOOL_CALLS = "[TOOL_CALLS]"
_ARGS_TAG = "[ARGS]"
_CALL_ID_TAG = "[CALL_ID]"


class MistralToolParser(ToolCallParser):
    """Mistral ``[TOOL_CALLS]``."""

    name = "mistral"
    needs_special_tokens = True
    default_id = staticmethod(mistral_call_id)

    @classmethod
    def strict_call(cls, name: str) -> tuple[str, str, str] | None:
        return _TOOL_CALLS, f"{_TOOL_CALLS}{name}{_ARGS_TAG}", ""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._state = _CONTENT
        self._call = JsonCallStreamer()
        self._value = JsonValueStreamer()
        self._index = -1
        self._fname = ""
        self._raw = ""  # markup taken while it is not yet known to be a call

    def _to_content(self, out: ToolDelta, text: str) -> None:
        out.content += self._raw + text
        self._raw = ""
        self._buf = ""
        self._state = _CONTENT

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        while True:
            buf = self._buf
            state = self._state
            if state == _AFTER:
                rest = buf.lstrip()
                if not rest and not final:
                    self._buf = ""
                    return
                self._buf = buf = rest
                self._state = state = _CONTENT
            if state == _CONTENT:
                at, marker = find_marker(buf, (_TOOL_CALLS,), final=final)
                out.content += buf[:at]
                self._buf = buf[at:]
                if marker is None:
                    return
                self._buf = buf[at + len(marker) :]
                self._raw = marker
                self._state = _OPENED
            elif state in (_OPENED, _ITEM, _SEP):
                s = buf.lstrip()
                if not s:
                    if final:
                        self._to_content(out, buf)
                    return
                self._raw += buf[: len(buf) - len(s)]
                c = s[0]
                if state == _OPENED and c == "[":
                    self._raw += c
                    self._buf = s[1:]
                    self._state = _ITEM
                elif state == _OPENED:
                    self._buf = s
                    self._state = _NAME
                elif state == _ITEM and c == "{":
                    self._buf = s
                    self._call = JsonCallStreamer()
                    self._index = -1
                    self._state = _CALL
                elif c == "]" or (state == _SEP and c == ","):
                    self._raw += c
                    self._buf = s[1:]
                    self._state = _ITEM if c == "," else _AFTER
                    if c == "]":
                        self._raw = ""
                else:
                    self._to_content(out, s)
            elif state == _CALL:
                name, args = self._call.push(buf, final=final)
                if name is not None:
                    self._index = self._new_call(out, name)
                    self._raw = ""
                self._add_args(out, self._index, args)
                self._buf = self._call.rest
                if not self._call.complete and not final:
                    return
                if self._index < 0:
                    whole = self._call.close()
                    if whole is None:
                        self._to_content(out, self._call.text + self._call.rest)
                        continue
                    self._whole_call(out, *whole)
                    self._raw = ""
                self._state = _SEP
            elif state in (_NAME, _CALL_ID):
                markers = (_ARGS_TAG, _CALL_ID_TAG) if state == _NAME else (_ARGS_TAG,)
                at, marker = find_marker(buf, markers, final=final)
                if marker is None:
                    if final:
                        self._to_content(out, buf)
                    return
                if state == _NAME:
                    self._fname = buf[:at].strip()
                    call_id = None
                else:
                    call_id = buf[:at].strip() or None
                self._buf = buf[at + len(marker) :]
                if marker == _CALL_ID_TAG:
                    self._state = _CALL_ID
                    continue
                self._index = self._new_call(out, self._fname, call_id)
                self._raw = ""
                self._value = JsonValueStreamer()
                self._state = _ARGS
            else:  # _ARGS
                self._add_args(out, self._index, self._value.push(buf, final=final))
                self._buf = self._value.rest
                if not self._value.complete:
                    return
                self._state = _AFTER
