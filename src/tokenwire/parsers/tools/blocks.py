"""Calls written as a block between two tags and read whole when the block closes: OLMo 3's
Python calls and FunctionGemma's own notation. ``BlockToolParser`` finds the block (its closing
tag counts only outside the format's string literals, so a tag inside an argument does not end
it) and hands its text to the format's ``read_calls``. A block that is no calls, or that the output
never closes (cut short by the token limit), stays in the content as written; space right after
a block of calls is dropped."""

from __future__ import annotations

import ast
import json
import re
from typing import Any, ClassVar

from tokenwire.parsers.markers import find_marker
from tokenwire.parsers.tools.base import ToolCallParser, ToolDelta
from tokenwire.parsers.tools.values import coerce, is_string_only, schema_types

__all__ = [
    "BlockToolParser",
    "FunctionGemmaToolParser",
    "Gemma4ToolParser",
    "Lfm2ToolParser",
    "MinimaxM3ToolParser",
    "Olmo3ToolParser",
]

_CONTENT, _BLOCK, _AFTER = range(3)


class BlockToolParser(ToolCallParser):
    """Calls in ``open_tag`` ... ``close_tag`` blocks (subclasses give the tags, how strings are
    quoted, and ``read_calls``)."""

    open_tag: ClassVar[str]
    close_tag: ClassVar[str]
    #: The marks that open and close string literals (a close tag inside one is text).
    string_marks: ClassVar[tuple[str, ...]] = ()
    #: Whether a backslash in a string escapes the next character.
    backslash_escapes: ClassVar[bool] = False

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._state = _CONTENT
        self._parts: list[str] = []  # the block's text scanned so far
        self._quote = ""  # the string literal the scan is in
        self._esc = False  # the scan is just past a backslash in a string

    def read_calls(self, body: str) -> list[tuple[str, str]] | None:
        """``(name, JSON arguments)`` of each call in a block's text, or None if it is none."""
        raise NotImplementedError

    def _find_close(self, text: str, final: bool) -> tuple[int, int]:
        """The scan goes on over ``text`` (the block's text after what is in ``_parts``):
        ``(where the close tag starts outside strings or -1, how far the scan got)``; the scan
        stops early where a mark may begin, split across pieces."""
        i, n, tag = 0, len(text), self.close_tag
        while i < n:
            if self._esc:
                self._esc = False
                i += 1
                continue
            marks = (self._quote,) if self._quote else (tag, *self.string_marks)
            if not final and any(len(m) > n - i and m.startswith(text[i:]) for m in marks):
                break  # a mark may begin here, split across pieces: wait for more
            if not self._quote and text.startswith(tag, i):
                return i, i
            mark = next((m for m in marks[not self._quote :] if text.startswith(m, i)), None)
            if mark is not None:
                self._quote = "" if self._quote else mark
                i += len(mark)
            elif self._quote and self.backslash_escapes and text[i] == "\\":
                self._esc = True
                i += 1
            else:
                i += 1
        return -1, i

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        while True:
            buf = self._buf
            if self._state == _AFTER:
                rest = buf.lstrip()
                if not rest and not final:
                    self._buf = ""
                    return
                self._buf = rest
                self._state = _CONTENT
            elif self._state == _CONTENT:
                at, marker = find_marker(buf, (self.open_tag,), final=final)
                out.content += buf[:at]
                self._buf = buf[at:]
                if marker is None:
                    return
                self._buf = buf[at + len(marker) :]
                self._parts = []
                self._quote = ""
                self._esc = False
                self._state = _BLOCK
            else:
                end, scanned = self._find_close(buf, final)
                if end < 0:
                    self._parts.append(buf[:scanned])
                    self._buf = buf[scanned:]
                    if final:  # never closed: the block as written
                        out.content += self.open_tag + "".join(self._parts) + self._buf
                        self._buf = ""
                    return
                body = "".join(self._parts) + buf[:end]
                self._parts = []
                calls = self.read_calls(body)
                rest = buf[end + len(self.close_tag) :]
                if calls is None:
                    out.content += self.open_tag + body + self.close_tag
                    self._buf = rest
                    self._state = _CONTENT
                    continue
                for name, arguments in calls:
                    self._whole_call(out, name, arguments)
                self._buf = rest
                self._state = _AFTER


# ---- OLMo 3 ------------------------------------------------------------------------------------

_LITERAL_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False}
_LITERAL_NAMES["None"] = None


class _NotLiteral(Exception):
    pass


def _literal(node: ast.expr) -> Any:
    """A Python/JSON literal's value (``true``, ``false`` and ``null`` read as JSON's)."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, (bytes, complex)):
        if node.value is Ellipsis:
            raise _NotLiteral
        return node.value
    if isinstance(node, ast.Name) and node.id in _LITERAL_NAMES:
        return _LITERAL_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _NotLiteral
        return {_key(k): _literal(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _NotLiteral
        return -value if isinstance(node.op, ast.USub) else value
    raise _NotLiteral


def _key(node: ast.expr) -> str:
    value = _literal(node)
    if not isinstance(value, str):
        raise _NotLiteral
    return value


def python_calls(source: str) -> list[tuple[str, str]] | None:
    """``(name, JSON arguments)`` of each call in Python source that is only calls with keyword
    arguments of literal values (one statement or list item each), or None."""
    try:
        tree = ast.parse(source.strip(), mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    nodes: list[ast.expr] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            return None
        value = stmt.value
        nodes.extend(value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value])
    if not nodes:
        return None
    out = []
    for node in nodes:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        try:
            args = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg is not None}
            if len(args) != len(node.keywords):
                return None
            out.append((node.func.id, json.dumps(args, ensure_ascii=False, allow_nan=False)))
        except (_NotLiteral, ValueError, TypeError, RecursionError):
            return None
    return out


class Olmo3ToolParser(BlockToolParser):
    """``olmo3``: OLMo 3 calls, one Python call a line (``null``/``true``/``false`` literals)
    in ``<function_calls>`` ... ``</function_calls>``."""

    name = "olmo3"
    open_tag = "<function_calls>"
    close_tag = "</function_calls>"

    string_marks = ('"', "'")
    backslash_escapes = True

    def read_calls(self, body: str) -> list[tuple[str, str]] | None:
        return python_calls(body)


# ---- FunctionGemma -----------------------------------------------------------------------------

_ESCAPE = "<escape>"


class _Reader:
    """FunctionGemma's value notation: ``<escape>``-quoted strings, ``{key:value,...}``,
    ``[value,...]`` and bare values."""

    def __init__(self, text: str, escape: str = _ESCAPE) -> None:
        self.text = text
        self.i = 0
        self.escape = escape

    def value(self, depth: int = 0) -> Any:
        if depth > 100:
            raise ValueError("nested too deeply")
        t, escape = self.text, self.escape
        if t.startswith(escape, self.i):
            end = t.find(escape, self.i + len(escape))
            if end < 0:
                raise ValueError("unclosed string")
            value = t[self.i + len(escape) : end]
            self.i = end + len(escape)
            return value
        if self.i < len(t) and t[self.i] == "{":
            return self.mapping(depth)
        if self.i < len(t) and t[self.i] == "[":
            self.i += 1
            items: list[Any] = []
            while not self.take("]"):
                if items and not self.take(","):
                    raise ValueError("expected ,")
                items.append(self.value(depth + 1))
            return items
        start = self.i
        while self.i < len(t) and t[self.i] not in ",}]":
            self.i += 1
        bare = t[start : self.i].strip()
        if not bare:
            raise ValueError("empty value")
        return _Bare(bare)

    def mapping(self, depth: int = 0) -> dict[str, Any]:
        if not self.take("{"):
            raise ValueError("expected {")
        out: dict[str, Any] = {}
        while not self.take("}"):
            if out and not self.take(","):
                raise ValueError("expected ,")
            colon = self.text.find(":", self.i)
            if colon < 0:
                raise ValueError("expected key:")
            key = self.text[self.i : colon].strip()
            if not key or any(c in key for c in "{}[],<>"):
                raise ValueError("bad key")
            self.i = colon + 1
            out[key] = self.value(depth + 1)
        return out

    def take(self, c: str) -> bool:
        if self.text.startswith(c, self.i):
            self.i += len(c)
            return True
        if self.i >= len(self.text):
            raise ValueError("ended early")
        return False


class _Bare(str):
    """A value written without ``<escape>`` quotes (a number, a literal, or a word)."""


def _untyped(value: Any) -> Any:
    """A value with its bare parts read as JSON where they are JSON."""
    if isinstance(value, _Bare):
        try:
            parsed = json.loads(value, parse_constant=_reject)
        except (ValueError, RecursionError):
            return str(value)
        return parsed if not isinstance(parsed, (dict, list)) else str(value)
    if isinstance(value, dict):
        return {k: _untyped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untyped(v) for v in value]
    return value


def _reject(name: str) -> Any:
    raise ValueError(name)


class FunctionGemmaToolParser(BlockToolParser):
    """``functiongemma``: FunctionGemma calls, ``<start_function_call>call:NAME{key:value,...}
    <end_function_call>``, strings between ``<escape>`` tokens; bare values are typed by the
    tool's schema."""

    name = "functiongemma"
    needs_special_tokens = True
    open_tag = "<start_function_call>"
    close_tag = "<end_function_call>"

    def read_calls(self, body: str) -> list[tuple[str, str]] | None:
        body = body.strip()
        if not body.startswith("call:"):
            return None
        brace = body.find("{")
        name = body[len("call:") : brace].strip() if brace > 0 else ""
        if not name or any(c.isspace() for c in name):
            return None
        reader = _Reader(body[brace:], self.string_marks[0])
        try:
            args = reader.mapping()
        except (ValueError, RecursionError):
            return None
        if body[brace + reader.i :].strip():
            return None
        for key, value in args.items():
            schema = self.schemas.parameter(name, key)
            bare = isinstance(value, _Bare) and schema is not None
            args[key] = coerce(str(value), schema) if bare else _untyped(value)
        try:
            return [(name, json.dumps(args, ensure_ascii=False, allow_nan=False))]
        except (ValueError, RecursionError):
            return None

    string_marks = (_ESCAPE,)


class Gemma4ToolParser(FunctionGemmaToolParser):
    """``gemma4``: Gemma 4 calls, FunctionGemma's notation in ``<|tool_call>call:NAME{...}
    <tool_call|>``, strings between ``<|"|>`` marks."""

    name = "gemma4"
    open_tag = "<|tool_call>"
    close_tag = "<tool_call|>"
    string_marks = ('<|"|>',)


class Lfm2ToolParser(BlockToolParser):
    """``lfm2``: LFM2 / LFM2.5 calls, a Python list of calls in ``<|tool_call_start|>`` ...
    ``<|tool_call_end|>``."""

    name = "lfm2"
    needs_special_tokens = True
    open_tag = "<|tool_call_start|>"
    close_tag = "<|tool_call_end|>"
    string_marks = ('"', "'")
    backslash_escapes = True

    def read_calls(self, body: str) -> list[tuple[str, str]] | None:
        return python_calls(body)


# ---- MiniMax-M3 --------------------------------------------------------------------------------

_M3 = "]<]minimax[>["
_M3_INVOKE = re.compile(re.escape(_M3) + r"""<invoke name=(?:"([^"]*)"|'([^']*)'|([^>\s]*))>""")


class MinimaxM3ToolParser(BlockToolParser):
    """``minimax_m3``: MiniMax-M3 calls, every tag prefixed with ``]<]minimax[>[``: ``<invoke
    name="NAME">`` holding one element per argument, named after it, in ``<tool_call>``.
    An element holding elements is an object, or a list when its schema says array (the
    template writes items as ``<item>``); a leaf is typed by its schema."""

    name = "minimax_m3"
    needs_special_tokens = True
    open_tag = f"{_M3}<tool_call>"
    close_tag = f"{_M3}</tool_call>"

    def read_calls(self, body: str) -> list[tuple[str, str]] | None:
        out = []
        pos = 0
        while True:
            m = _M3_INVOKE.search(body, pos)
            if m is None:
                break
            if body[pos : m.start()].strip():
                return None
            name = next(g for g in m.groups() if g is not None)
            end = body.find(f"{_M3}</invoke>", m.end())
            if end < 0 or not name:
                return None
            props = self.schemas.parameter_schemas(name)
            inner = body[m.end() : end]
            try:
                args = _M3Reader(inner).elements({"properties": props}) if inner.strip() else {}
            except ValueError:
                return None
            if not isinstance(args, dict):
                return None
            try:
                out.append((name, json.dumps(args, ensure_ascii=False, allow_nan=False)))
            except (ValueError, RecursionError):
                return None
            pos = end + len(f"{_M3}</invoke>")
        if not out or body[pos:].strip():
            return None
        return out


class _M3Reader:
    """MiniMax-M3's argument elements: ``]<]minimax[>[<key>`` ... ``]<]minimax[>[</key>``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0

    def elements(self, schema: Any, depth: int = 0) -> Any:
        """The elements from here to the enclosing close tag (or the end): a dict, or a list
        when the schema says array; a leaf's text when there are none."""
        if depth > 128:
            raise ValueError("nested too deeply")
        t = self.text
        start = self.i
        items: list[tuple[str, Any]] = []
        while True:
            at = t.find(_M3 + "<", self.i)
            if at < 0 or t.startswith(_M3 + "</", at):
                break
            if items == [] and t[start:at].strip():
                break  # text before an element: this is a leaf
            close = t.find(">", at + len(_M3) + 1)
            if close < 0:
                raise ValueError("unclosed tag")
            key = t[at + len(_M3) + 1 : close].strip()
            if not key or any(c.isspace() for c in key):
                raise ValueError("bad element name")
            self.i = close + 1
            child = _child(schema, key)
            value = self.elements(child, depth + 1)
            end_tag = f"{_M3}</{key}>"
            if not t.startswith(end_tag, self.i):
                raise ValueError(f"element {key} not closed")
            self.i += len(end_tag)
            between = t.find(_M3 + "<", self.i)
            if (
                between >= 0
                and t[self.i : between].strip()
                and not t.startswith(_M3 + "</", between)
            ):
                raise ValueError("text between elements")
            items.append((key, value))
        if not items:
            at = t.find(_M3 + "</", start)
            at = len(t) if at < 0 else at
            self.i = at
            text = t[start:at]
            return coerce(text.strip() if not is_string_only(schema) else text, schema)
        stop = t.find(_M3 + "</", self.i)
        if stop >= 0 and t[self.i : stop].strip():
            raise ValueError("text after elements")
        self.i = stop if stop >= 0 else len(t)
        if "array" in schema_types(schema) and "object" not in schema_types(schema):
            return [v for _, v in items]
        return dict(items)


def _child(schema: Any, key: str) -> Any:
    """The schema of an element's child ``key`` (an array's items, an object's property)."""
    if not isinstance(schema, dict):
        return None
    if "array" in schema_types(schema) and "object" not in schema_types(schema):
        return schema.get("items")
    props = schema.get("properties")
    return props.get(key) if isinstance(props, dict) else None
