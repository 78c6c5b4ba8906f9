"""``deepseek_v3``: DeepSeek-V3 / R1 tool calls between ``<｜tool▁calls▁begin｜>`` and
``<｜tool▁calls▁end｜>``: each ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` and the arguments
in a fenced ``json`` block, ``<｜tool▁call▁end｜>``; also the V3.1 form without the type and the
fence, ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``."""

from __future__ import annotations

from typing import Any

from tokenwire.parsers.markers import find_marker
from tokenwire.parsers.tools.base import ToolCallParser, ToolDelta

__all__ = ["DeepSeekV3ToolParser"]

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
_FENCE = "```json"

_CONTENT, _CALLS, _HEAD, _NAME, _FENCED, _ARGS, _SKIP = range(7)


class DeepSeekV3ToolParser(ToolCallParser):
    """DeepSeek-V3 tool-call markup."""

    name = "deepseek_v3"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._state = _CONTENT
        self._index = -1
        self._ends: tuple[str, ...] = (CALL_END,)

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        while True:
            buf = self._buf
            state = self._state
            if state == _CONTENT:
                at, marker = find_marker(buf, (CALLS_BEGIN,), final=final)
                out.content += buf[:at]
                self._buf = buf[at:]
                if marker is None:
                    return
                self._buf = buf[at + len(marker) :]
                self._state = _CALLS
            elif state == _CALLS:
                s = buf.lstrip()
                if s.startswith(CALL_BEGIN):
                    self._buf = s[len(CALL_BEGIN) :]
                    self._state = _HEAD
                elif s.startswith(CALLS_END):
                    self._buf = s[len(CALLS_END) :]
                    self._state = _CONTENT
                elif not final and (not s or CALL_BEGIN.startswith(s) or CALLS_END.startswith(s)):
                    return
                else:
                    self._state = _CONTENT  # stray text: content
                    self._buf = s
            elif state == _HEAD:
                at, marker = find_marker(buf, (SEP,), final=final)
                if marker is None:
                    if final:
                        self._buf = ""
                    return
                kind = buf[:at].strip()
                self._buf = buf[at + len(marker) :]
                if kind == "function":
                    self._state = _NAME
                else:
                    self._index = self._new_call(out, kind)
                    self._ends = (CALL_END,)
                    self._state = _ARGS
            elif state == _NAME:
                at = buf.find("\n")
                if at < 0 and not final:
                    return
                at = len(buf) if at < 0 else at
                self._index = self._new_call(out, buf[:at].strip())
                self._buf = buf[at + 1 :]
                self._state = _FENCED
            elif state == _FENCED:
                if not final and len(buf) < len(_FENCE) and _FENCE.startswith(buf):
                    return
                if buf.startswith(_FENCE):
                    rest = buf[len(_FENCE) :]
                    if not rest and not final:
                        return
                    buf = rest[1:] if rest.startswith("\n") else rest
                    self._ends = ("\n```", "```", CALL_END)
                else:
                    self._ends = (CALL_END,)
                self._buf = buf
                self._state = _ARGS
            elif state == _ARGS:
                at, marker = find_marker(buf, self._ends, final=final)
                self._add_args(out, self._index, buf[:at])
                self._buf = buf[at:]
                if marker is None:
                    if final:
                        self._buf = ""
                    return
                self._buf = buf[at + len(marker) :]
                self._state = _CALLS if marker == CALL_END else _SKIP
            else:  # _SKIP: to the end of the call
                at, marker = find_marker(buf, (CALL_END,), final=final)
                if marker is None:
                    self._buf = "" if final else buf[at:]
                    return
                self._buf = buf[at + len(marker) :]
                self._state = _CALLS
