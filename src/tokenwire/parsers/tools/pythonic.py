"""``pythonic``: calls written as a Python list, ``[get_weather(city="Paris"), now()]`` (Llama
3.2 / Llama 4 style, optionally inside ``<|python_start|>``/``<|python_end|>``). An answer that
starts (after space) with ``[`` is held until its list closes, then parsed (keyword arguments
with literal values, as JSON); a list that is no list of calls stays content as written."""

from __future__ import annotations

import ast
import json
from typing import Any

from tokenwire.parsers.tools.base import ToolCallParser, ToolDelta

__all__ = ["PythonicToolParser"]

_START, _LIST, _TAIL, _CONTENT = 0, 1, 2, 3
_OPEN = "<|python_start|>"
_CLOSE = "<|python_end|>"


def _calls(source: str) -> list[tuple[str, str]] | None:
    """``(name, JSON arguments)`` of each call in a Python list literal, or None."""
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # MemoryError: CPython's parser says so of a too deeply nested expression
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    out = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        args: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                return None
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, SyntaxError, TypeError, RecursionError):
                return None
        try:  # arguments are JSON: no NaN nor Infinity (1e999 is a float literal)
            out.append((node.func.id, json.dumps(args, ensure_ascii=False, allow_nan=False)))
        except (TypeError, ValueError, RecursionError):
            return None
    return out


class PythonicToolParser(ToolCallParser):
    """Python-list calls."""

    name = "pythonic"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._state = _START
        self._pos = 0  # where the list starts in the buffer
        self._scan_at = 0
        self._depth = 0
        self._quote = ""
        self._esc = False

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        while True:
            buf = self._buf
            if self._state == _CONTENT:
                out.content += buf
                self._buf = ""
                return
            if self._state in (_START, _TAIL):
                tag = _OPEN if self._state == _START else _CLOSE
                s = buf.lstrip()
                if s.startswith(tag):
                    s = s[len(tag) :].lstrip()
                if self._state == _START and s.startswith("["):
                    self._state = _LIST
                    self._pos = self._scan_at = len(buf) - len(s)
                    continue
                if not final and (not s or tag.startswith(s)):
                    return
                if self._state == _TAIL:
                    self._buf = s if buf.lstrip().startswith(tag) else buf
                self._state = _CONTENT
                continue
            end = self._scan(buf)
            if end < 0 and not final:
                return
            source = buf[:end] if end >= 0 else buf
            calls = _calls(source[self._pos :]) if end >= 0 else None
            if calls is None:
                out.content += source
                self._state = _CONTENT
            else:
                for name, arguments in calls:
                    self._whole_call(out, name, arguments)
                self._state = _TAIL
            self._buf = buf[len(source) :]

    def _scan(self, buf: str) -> int:
        """Where the list starting at ``self._pos`` ends (past its ``]``), or -1 (not yet)."""
        depth, quote, esc = self._depth, self._quote, self._esc
        i = self._scan_at
        n = len(buf)
        while i < n:
            c = buf[i]
            i += 1
            if quote:
                if esc:
                    esc = False
                elif c == "\\":
                    esc = True
                elif c == quote:
                    quote = ""
            elif c in "\"'":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
                if depth == 0:
                    return i
        self._depth, self._quote, self._esc = depth, quote, esc
        self._scan_at = i
        return -1
