"""``llama3_json``: Llama 3.1/3.2 JSON tool calls. An answer that starts (after space) with a JSON
object, or with ``<|python_tag|>``, is calls: ``{"name": ..., "parameters": {...}}`` objects
separated by ``;``. Anything else is content; so is an object that is no call, and what follows
the calls."""

from __future__ import annotations

import json
from typing import Any

from tokenwire.parsers.tools.base import JsonCallStreamer, ToolCallParser, ToolDelta

__all__ = ["Llama3JsonToolParser", "Llama4JsonToolParser"]

_START, _CALL, _SEP, _CONTENT = 0, 1, 2, 3
_PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolCallParser):
    """Llama 3 JSON calls."""

    name = "llama3_json"

    @classmethod
    def strict_call(cls, name: str) -> tuple[str, str, str] | None:
        head = f'{_PYTHON_TAG}{{"name": {json.dumps(name, ensure_ascii=False)}, "parameters": '
        return _PYTHON_TAG, head, "}"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._state = _START
        self._call = JsonCallStreamer()
        self._index = -1
        self._lead = ""  # what came before the object (space, the python tag, a separator)

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        while True:
            buf = self._buf
            if self._state == _CONTENT:
                out.content += buf
                self._buf = ""
                return
            if self._state in (_START, _SEP):
                s = buf.lstrip()
                if self._state == _SEP:
                    s = s.lstrip(";").lstrip() if s.startswith(";") else s
                elif s.startswith(_PYTHON_TAG):
                    s = s[len(_PYTHON_TAG) :].lstrip()
                if s.startswith("{"):
                    self._lead = buf[: len(buf) - len(s)]
                    self._buf = s
                    self._state = _CALL
                    self._call = JsonCallStreamer()
                    self._index = -1
                    continue
                undecided = not s or (self._state == _START and _PYTHON_TAG.startswith(s))
                if undecided and not final:
                    return  # keep buf as it is
                self._state = _CONTENT
                continue
            name, args = self._call.push(buf, final=final)
            if name is not None:
                self._index = self._new_call(out, name)
            self._add_args(out, self._index, args)
            self._buf = self._call.rest
            if not self._call.complete and not final:
                return
            if self._index < 0:
                whole = self._call.close()
                if whole is None:
                    out.content += self._lead + self._call.text
                    self._state = _CONTENT
                    continue
                self._whole_call(out, *whole)
            self._state = _SEP
            if final and not self._buf.strip():
                self._buf = ""
                return


class Llama4JsonToolParser(Llama3JsonToolParser):
    """``llama4_json``: Llama 4's JSON calls, Llama 3's format (vLLM's name)."""

    name = "llama4_json"
