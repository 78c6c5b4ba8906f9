"""The tool-call parser interface and the pieces every format shares.

A ``ToolCallParser`` reads a model's answer text piece by piece (``feed``; ``finish`` at the end)
and says what each piece adds: plain ``content`` and ``ToolCallDelta``s in OpenAI's streaming
shape (a call's ``id`` and ``name`` first, then fragments of its ``arguments``). Whatever the
split of the text, the pieces concatenated equal the result of one ``parse`` of the whole text:
markup is held back until it is certain, never passed on as content.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tokenwire.parsers.tools.values import ToolSchemas

__all__ = [
    "JsonCallStreamer",
    "JsonValueStreamer",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolDelta",
    "merge_tool_deltas",
    "mistral_call_id",
    "random_call_id",
    "strict_json",
]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is past a double's range")
    return value


def strict_json(text: str) -> Any:
    """The JSON value of a model's text, or ``ValueError`` for anything that is no JSON a client
    can read back: NaN, Infinity, a number past a double's range, an integer too long to
    convert, nesting deeper than the parser takes."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("the JSON nests too deeply") from None


@dataclass
class ToolCallDelta:
    """A piece of one call: ``id`` and ``name`` on its first delta, ``arguments`` fragments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's ``delta.tool_calls[]`` entry."""
        out: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        if self.name is not None:
            function["name"] = self.name
        function["arguments"] = self.arguments
        out["function"] = function
        return out


@dataclass
class ToolCall:
    """A whole call."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's ``message.tool_calls[]`` entry."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class ToolDelta:
    """What a piece of answer text adds."""

    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)

    def extend(self, other: ToolDelta) -> None:
        self.content += other.content
        self.calls.extend(other.calls)


def merge_tool_deltas(deltas: Iterable[ToolCallDelta]) -> list[ToolCall]:
    """Whole calls from their deltas, in index order."""
    calls: dict[int, ToolCall] = {}
    for d in deltas:
        call = calls.get(d.index)
        if call is None:
            call = calls[d.index] = ToolCall(d.id or "", d.name or "", "")
        if d.id is not None:
            call.id = d.id
        if d.name is not None:
            call.name = d.name
        call.arguments += d.arguments
    return [calls[k] for k in sorted(calls)]


def random_call_id(index: int) -> str:
    """vLLM's style of call id."""
    return f"chatcmpl-tool-{secrets.token_hex(16)}"


_ALNUM = string.ascii_letters + string.digits


def mistral_call_id(index: int) -> str:
    """Mistral's call ids: nine letters and digits."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


class ToolCallParser:
    """Base of the formats: content and call deltas, incrementally (see the module docstring)."""

    name: ClassVar[str] = ""
    #: The format's markup consists of special tokens: the text must keep them.
    needs_special_tokens: ClassVar[bool] = False
    default_id: ClassVar[Callable[[int], str]] = staticmethod(random_call_id)

    def __init__(
        self,
        *,
        make_id: Callable[[int], str] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self._make_id = make_id or type(self).default_id
        #: The request's tools' parameter schemas (formats whose values are bare text type them).
        self.schemas = ToolSchemas(tools)
        self._buf = ""
        self._calls = 0
        self._done = False

    def feed(self, text: str) -> ToolDelta:
        """The next piece of answer text."""
        self._buf += text
        out = ToolDelta()
        self._step(out, final=False)
        return out

    def finish(self) -> ToolDelta:
        """The answer is over: whatever was held back."""
        out = ToolDelta()
        if not self._done:
            self._done = True
            self._step(out, final=True)
        return out

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """A whole answer: its content and its calls."""
        out = self.feed(text)
        out.extend(self.finish())
        return out.content, merge_tool_deltas(out.calls)

    @property
    def calls(self) -> int:
        """Calls begun so far."""
        return self._calls

    def _new_call(self, out: ToolDelta, name: str, call_id: str | None = None) -> int:
        index = self._calls
        self._calls += 1
        out.calls.append(ToolCallDelta(index, call_id or self._make_id(index), name, ""))
        return index

    def _add_args(self, out: ToolDelta, index: int, text: str) -> None:
        if not text:
            return
        last = out.calls[-1] if out.calls else None
        if last is not None and last.index == index:
            last.arguments += text
        else:
            out.calls.append(ToolCallDelta(index, arguments=text))

    def _whole_call(self, out: ToolDelta, name: str, arguments: str) -> None:
        self._add_args(out, self._new_call(out, name), arguments)

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        """Consume ``self._buf`` as far as is certain, adding to ``out``."""
        raise NotImplementedError


# ---- JSON, streamed ------------------------------------------------------------------------------


class JsonValueStreamer:
    """One JSON value's raw text, piece by piece: ``push`` returns the value text that is certain
    so far (leading space dropped; a bare number or literal only once it is over) and stops at
    the value's end (``end``: characters of pushed text it took, leading space included)."""

    def __init__(self) -> None:
        self._text = ""
        self._start = -1  # where the value starts in _text
        self._pos = 0
        self._sent = 0
        self._depth = 0
        self._in_str = False
        self._esc = False
        self.end = -1
        #: The text of the last ``push`` past the value's end.
        self.rest = ""

    @property
    def complete(self) -> bool:
        return self.end >= 0

    @property
    def started(self) -> bool:
        return self._start >= 0

    def push(self, text: str, *, final: bool = False) -> str:
        """Take more text; ``final``: no more comes (a bare value ends with it)."""
        if self.complete:
            self.rest = text
            return ""
        piece = self._push(text, final)
        if self.complete:
            self.rest = self._text[self.end :]
            self._text = self._text[: self.end]
        return piece

    def _push(self, text: str, final: bool) -> str:
        self._text += text
        t = self._text
        if self._start < 0:
            stripped = len(t) - len(t.lstrip())
            if stripped == len(t):
                return ""
            self._start = self._pos = stripped
        first = t[self._start]
        i = self._pos
        n = len(t)
        if first in '{["':
            depth, in_str, esc = self._depth, self._in_str, self._esc
            while i < n:
                c = t[i]
                i += 1
                if in_str:
                    if esc:
                        esc = False
                    elif c == "\\":
                        esc = True
                    elif c == '"':
                        in_str = False
                        if depth == 0:
                            self.end = i
                            break
                elif c == '"':
                    in_str = True
                elif c in "{[":
                    depth += 1
                elif c in "}]":
                    depth -= 1
                    if depth == 0:
                        self.end = i
                        break
            self._depth, self._in_str, self._esc = depth, in_str, esc
            self._pos = i
            piece = t[self._start + self._sent : i]
            self._sent += len(piece)
            return piece
        while i < n and t[i] not in ",}] \t\r\n;":
            i += 1
        self._pos = i
        if i < n or final:
            self.end = i
            return t[self._start : i]
        return ""

    def value_text(self) -> str:
        """The value's text so far."""
        if self._start < 0:
            return ""
        stop = self.end if self.complete else len(self._text)
        return self._text[self._start : stop]


# ``{"name": "...", "arguments": `` (or "parameters"): the name comes first.
_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:',
    re.DOTALL,
)


class JsonCallStreamer:
    """One ``{"name": ..., "arguments": ...}`` object, piece by piece: the name as soon as it is
    complete, then the arguments' raw JSON text as it comes; ``complete`` once the object's
    closing brace is seen (``end``: characters of pushed text it took, leading space included).
    An object that does not start with its name is parsed whole by ``close``."""

    def __init__(self) -> None:
        self.text = ""
        self.name: str | None = None
        self._object = JsonValueStreamer()
        self._args: JsonValueStreamer | None = None
        self._args_from = 0  # where the arguments value text starts in self.text
        #: The text of the last ``push`` past the object's end.
        self.rest = ""

    @property
    def complete(self) -> bool:
        return self._object.complete

    @property
    def end(self) -> int:
        return self._object.end

    @property
    def started(self) -> bool:
        return self._object.started

    def push(self, text: str, *, final: bool = False) -> tuple[str | None, str]:
        """Take more text (none past the object's end). Returns the name if it just became known,
        and the new argument text."""
        if self.complete:
            self.rest = text
            return None, ""
        before = len(self.text)
        self._object.push(text, final=final)
        self.rest = self._object.rest
        self.text += text[: len(text) - len(self.rest)]
        name = None
        if self.name is None and self._args is None:
            m = _HEAD.match(self.text)
            if m is not None:
                try:
                    name = json.loads('"' + m.group(1) + '"')
                except json.JSONDecodeError:
                    name = m.group(1)
                self.name = name
                self._args = JsonValueStreamer()
                self._args_from = m.end()
                before = m.end()
        if self._args is None:
            return name, ""
        new = self.text[max(before, self._args_from) :]
        return name, self._args.push(new, final=final or self.complete)

    def close(self) -> tuple[str, str] | None:
        """At the object's end (or the output's) for an object that did not show its name first:
        ``(name, arguments)`` from a whole parse, or None when it is no call."""
        if self.name is not None:
            return None
        try:
            obj = strict_json(self.text)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        self.name = obj["name"]
        return obj["name"], (
            args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        )
