"""``pythonic``: calls written as a Python list, ``[get_weather(city="Paris"), now()]`` (Llama
3.2 / Llama 4 style, optionally inside ``<|python_start|>``/``<|python_end|>``). An answer that
starts (after space) with ``[`` is held until its list closes, then parsed (keyword arguments
with literal values, as JSON); a list that is no list of calls stays content as written."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from tokenwire.parsers.tools.base import ToolCallParser, ToolDelta

__all__ = ["Llama4PythonicToolParser", "PythonicToolParser"]

_START, _LIST, _TAIL, _CONTENT = 0, 1, 2, 3
_OPEN = "<|python_start|>"
_BARE = re.compile(r"[\"'()\[\]{}]")
_QUOTED = {'"': re.compile(r'["\\]'), "'": re.compile(r"['\\]")}
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
        self._lead = ""  # the space and tag before the list
        self._parts: list[str] = []  # the list's text scanned so far
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
                    self._lead = buf[: len(buf) - len(s)]
                    self._buf = s
                    self._parts = []
                    continue
                if not final and (not s or tag.startswith(s)):
                    return
                if self._state == _TAIL:
                    self._buf = s if buf.lstrip().startswith(tag) else buf
                self._state = _CONTENT
                continue
            # _LIST: the list's text so far is in _parts, the text not yet scanned in _buf
            end = self._scan(buf)
            self._parts.append(buf if end < 0 else buf[:end])
            self._buf = "" if end < 0 else buf[end:]
            if end < 0 and not final:
                return
            source = "".join(self._parts)
            self._parts = []
            calls = _calls(source) if end >= 0 else None
            if calls is None:
                out.content += self._lead + source
                self._state = _CONTENT
            else:
                for name, arguments in calls:
                    self._whole_call(out, name, arguments)
                self._state = _TAIL

    def _scan(self, buf: str) -> int:
        """Where the list ends in ``buf`` (past its ``]``), the scan going on from the text
        before it, or -1 (not yet)."""
        depth, quote, esc = self._depth, self._quote, self._esc
        i, n = 0, len(buf)
        while i < n:
            if esc:
                esc = False
                i += 1
                continue
            m = (_QUOTED[quote] if quote else _BARE).search(buf, i)
            if m is None:
                break
            c = m.group()
            i = m.end()
            if quote:
                if c == "\\":
                    esc = True
                else:
                    quote = ""
            elif c in "\"'":
                quote = c
            elif c in "([{":
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    self._depth, self._quote, self._esc = 0, "", False
                    return i
        self._depth, self._quote, self._esc = depth, quote, esc
        return -1


class Llama4PythonicToolParser(PythonicToolParser):
    """``llama4_pythonic``: Llama 4's Python-list calls, optionally in ``<|python_start|>``
    ... ``<|python_end|>``."""

    name = "llama4_pythonic"
