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
    "NAMED",
    "JsonCallStreamer",
    "JsonShape",
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

    @classmethod
    def strict_call(cls, name: str) -> tuple[str, str, str] | None:
        """How one call of ``name`` is written around its arguments' JSON, as a structural tag
        constrains it (``--tool-strict-level``): ``(trigger, begin, end)``, or None when the
        format's arguments are not one JSON value after a fixed head."""
        return None


# ---- JSON, streamed ------------------------------------------------------------------------------


class JsonValueStreamer:
    """One JSON value's raw text, piece by piece: ``push`` returns the value text that is certain
    so far (leading space dropped; a bare number or literal only once it is over) and stops at
    the value's end (``end``: characters of pushed text it took, leading space included).

    Each character is scanned once and no text is kept but the pieces given back, so a value
    the output never closes costs time linear in its length, whatever the number of pushes."""

    def __init__(self) -> None:
        self._taken = 0  # characters of pushed text taken (leading space included)
        self._started = False
        self._bare = False  # a number or literal (given whole at its end)
        self._parts: list[str] = []  # the value's text so far
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
        return self._started

    def push(self, text: str, *, final: bool = False) -> str:
        """Take more text; ``final``: no more comes (a bare value ends with it)."""
        if self.complete:
            self.rest = text
            return ""
        if not self._started:
            s = text.lstrip()
            self._taken += len(text) - len(s)
            if not s:
                return ""
            self._started = True
            self._bare = s[0] not in '{["'
            text = s
        if self._bare:
            m = _BARE_END.search(text)
            if m is None and not final:
                self._parts.append(text)
                self._taken += len(text)
                return ""
            i = len(text) if m is None else m.start()
            self._parts.append(text[:i])
            value = "".join(self._parts)
            self._parts = [value]
            return self._stop(text, i, value)
        i = self._scan(text)
        piece = text[:i]
        self._parts.append(piece)
        if self._depth == 0 and not self._in_str:  # the value closed at i
            return self._stop(text, i, piece)
        self._taken += i
        return piece

    def _stop(self, text: str, i: int, piece: str) -> str:
        self._taken += i
        self.end = self._taken
        self.rest = text[i:]
        return piece

    def _scan(self, text: str) -> int:
        """Scan ``text`` on from the state so far; where the value ends in it (just past its
        last character), or ``len(text)``."""
        depth, in_str, esc = self._depth, self._in_str, self._esc
        i, n = 0, len(text)
        while i < n:
            if esc:
                esc = False
                i += 1
                continue
            m = (_IN_STRING if in_str else _OUTSIDE).search(text, i)
            if m is None:
                i = n
                break
            c = m.group()
            i = m.end()
            if in_str:
                if c == "\\":
                    esc = True
                else:
                    in_str = False
                    if depth == 0:
                        break
            elif c == '"':
                in_str = True
            elif c in "{[":
                depth += 1
            else:
                depth -= 1
                if depth <= 0:
                    depth = 0
                    break
        self._depth, self._in_str, self._esc = depth, in_str, esc
        return i

    def value_text(self) -> str:
        """The value's text so far."""
        return "".join(self._parts)


_IN_STRING = re.compile(r'["\\]')
_OUTSIDE = re.compile(r'["{}\[\]]')
_BARE_END = re.compile(r"[,}\] \t\r\n;]")


@dataclass(frozen=True)
class JsonShape:
    """How a family writes one call as a JSON object: ``{"name": NAME, "arguments": ARGS}``
    under its keys for the two, or ``{NAME: ARGS}`` (``keyed``, Apertus)."""

    #: Keys of the name, the first the one a call may stream after.
    names: tuple[str, ...] = ("name",)
    #: Keys of the arguments.
    arguments: tuple[str, ...] = ("arguments", "parameters")
    #: The object's one key is the name, its value the arguments.
    keyed: bool = False
    #: Keys of string values the family writes before the name (Cohere's ``tool_call_id``).
    lead: tuple[str, ...] = ()

    def head(self) -> tuple[str | tuple[str, ...] | None, ...]:
        """The tokens of the head a call streams after (see ``_HeadScanner``)."""
        if self.keyed:
            return ("{", '"', None, ":")
        keys = tuple(json.dumps(k) for k in self.arguments)
        lead: tuple[str | None, ...] = ()
        for key in self.lead:
            lead += (json.dumps(key), ":", '"', _SKIP, ",")
        return ("{", *lead, json.dumps(self.names[0]), ":", '"', None, ",", keys, ":")

    def call(self, obj: Any) -> tuple[str, Any] | None:
        """``(name, arguments)`` of a whole call object, or None when it is none."""
        if not isinstance(obj, dict):
            return None
        if self.keyed:
            if len(obj) != 1:
                return None
            ((name, args),) = obj.items()
            return (name, args) if isinstance(args, dict) else None
        name = next((obj[k] for k in self.names if isinstance(obj.get(k), str)), None)
        if name is None:
            return None
        return name, next((obj[k] for k in self.arguments if k in obj), {})


#: Hermes' shape, most families'.
NAMED = JsonShape()
#: A head token: a string value that is not the name (its opening quote already matched).
_SKIP = ""


class _HeadScanner:
    """A call's head (``{"name": "...", "arguments":``, as its shape writes it) at an object's
    start, matched as the text comes, each character once: ``feed`` returns where the head ends
    in the piece once it is complete; ``dead`` once the object cannot start so."""

    def __init__(self, shape: JsonShape = NAMED) -> None:
        #: The head's tokens, space allowed before each: literals, the name string (None), and
        #: the arguments key (a tuple of the keys it may be).
        self._tokens = shape.head()
        self._token = 0
        self._matched = ""  # of the current literal token
        self._name: list[str] = []
        self._esc = False
        self.dead = False
        self.name: str | None = None

    def feed(self, text: str) -> int | None:
        tokens = self._tokens
        i, n = 0, len(text)
        while i < n and not self.dead:
            want = tokens[self._token]
            if want is None or want == _SKIP:  # in the name string, or a string skipped
                if self._esc:
                    self._esc = False
                    self._name.append(text[i])
                    i += 1
                    continue
                m = _IN_STRING.search(text, i)
                stop = n if m is None else m.start()
                self._name.append(text[i:stop])
                if m is None:
                    return None
                i = m.end()
                if m.group() == "\\":
                    self._name.append("\\")
                    self._esc = True
                    continue
                if want == _SKIP:
                    self._name = []
                    self._token += 1
                    continue
                raw = "".join(self._name)
                try:
                    self.name = json.loads('"' + raw + '"')
                except json.JSONDecodeError:
                    self.name = raw
                self._token += 1
                continue
            c = text[i]
            if not self._matched and c.isspace():
                i += 1
                continue
            options = want if isinstance(want, tuple) else (want,)
            so_far = self._matched + c
            if not any(o.startswith(so_far) for o in options):
                self.dead = True
                return None
            i += 1
            if so_far in options:
                self._matched = ""
                self._token += 1
                if self._token == len(tokens):
                    return i
            else:
                self._matched = so_far
        return None


class JsonCallStreamer:
    """One ``{"name": ..., "arguments": ...}`` object, piece by piece: the name as soon as it is
    complete, then the arguments' raw JSON text as it comes; ``complete`` once the object's
    closing brace is seen (``end``: characters of pushed text it took, leading space included).
    An object that does not start with its name is parsed whole by ``close``. Linear in the
    object's length, however it is pushed."""

    def __init__(self, shape: JsonShape = NAMED) -> None:
        self.shape = shape
        self._parts: list[str] = []
        self.name: str | None = None
        self._object = JsonValueStreamer()
        self._head = _HeadScanner(shape)
        self._args: JsonValueStreamer | None = None
        #: The text of the last ``push`` past the object's end.
        self.rest = ""

    @property
    def text(self) -> str:
        """The object's text so far."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

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
        self._object.push(text, final=final)
        self.rest = self._object.rest
        new = text[: len(text) - len(self.rest)]
        self._parts.append(new)
        name = None
        if self.name is None and self._args is None and not self._head.dead:
            at = self._head.feed(new)
            if at is not None:
                name = self.name = self._head.name
                self._args = JsonValueStreamer()
                new = new[at:]
        if self._args is None:
            return name, ""
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
        call = self.shape.call(obj)
        if call is None:
            return None
        self.name, args = call
        return self.name, (args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
