"""``hermes``: Hermes-2-Pro / Qwen2.5 / Qwen3 tool calls,
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, any number of them, with
content before and between them (space right after a call is dropped). A block that is no call
(not JSON, no name) stays in the content as written."""

from __future__ import annotations

from typing import Any

from tokenwire.parsers.markers import find_marker
from tokenwire.parsers.tools.base import JsonCallStreamer, ToolCallParser, ToolDelta

__all__ = ["HermesToolParser"]

_CONTENT, _CALL, _AFTER = 0, 1, 2


class HermesToolParser(ToolCallParser):
    """Hermes-style ``<tool_call>`` JSON blocks."""

    name = "hermes"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._state = _CONTENT
        self._call = JsonCallStreamer()
        self._raw = ""  # the current block's body as written
        self._index = -1

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        while True:
            buf = self._buf
            if self._state == _AFTER:
                rest = buf.lstrip()
                if not rest and not final:
                    self._buf = ""
                    return
                self._buf = buf = rest
                self._state = _CONTENT
            if self._state == _CONTENT:
                at, marker = find_marker(buf, (self.open_tag,), final=final)
                out.content += buf[:at]
                self._buf = buf[at:]
                if marker is None:
                    return
                self._buf = buf[at + len(marker) :]
                self._state = _CALL
                self._call = JsonCallStreamer()
                self._raw = ""
                self._index = -1
                continue
            at, marker = find_marker(buf, (self.close_tag,), final=final)
            body = buf[:at]
            self._raw += body
            ended = marker is not None or final
            name, args = self._call.push(body, final=ended)
            if name is not None:
                self._index = self._new_call(out, name)
            self._add_args(out, self._index, args)
            if not ended:
                self._buf = buf[at:]
                return
            self._buf = buf[at + len(marker) :] if marker is not None else ""
            if self._index < 0:
                whole = self._call.close()
                if whole is None:  # no call after all: the block as written
                    out.content += self.open_tag + self._raw + (marker or "")
                else:
                    self._whole_call(out, *whole)
            self._state = _AFTER
