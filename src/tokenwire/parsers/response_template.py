"""The generic ``hf`` parsers: a checkpoint's own ``response_template`` (Hugging Face's response
parsing metadata in ``tokenizer_config.json``) says where its thinking, its content and its tool
calls sit, so a model no named parser knows still gets them split. vLLM's ``hf`` parsers and
SGLang's ``response_template`` read the same metadata.

A template names regions (``fields``): ``thinking``, ``content`` and ``tool_calls``, each between
an opening and a closing anchor (one string or a list of alternatives), one of them possibly
without an opening anchor (the region text outside the others goes to), its text read by a
content parser (``text``, ``int``, ``float``, ``bool``, ``json`` with its dialect knobs,
``xml-inline``, ``kv-lines``) and reshaped by an optional ``transform`` (``"{content.name}"``
placeholders). The ``tool_calls`` region's value is a call or a list of them, each
``{"function": {"name", "arguments"}}`` or ``{"name", "arguments"}``; string arguments are typed
by the request's tool schemas.

Anchors here are literal strings (``open``, ``close``, ``start_anchor``); a template that uses
the regex forms (``open_pattern``, ...) is refused at start with the field named. The thinking
region streams as it comes; a tool call goes out when its region closes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tokenwire.parsers.markers import find_marker
from tokenwire.parsers.reasoning import ReasoningParser
from tokenwire.parsers.tools.base import ToolCallParser, ToolDelta
from tokenwire.parsers.tools.values import coerce, is_string_only

__all__ = [
    "ResponseTemplate",
    "ResponseTemplateError",
    "ResponseTemplateReasoningParser",
    "ResponseTemplateToolParser",
    "TemplateField",
    "parse_content",
]

THINKING, CONTENT, TOOLS = "thinking", "content", "tool_calls"
_FIELDS = frozenset({THINKING, CONTENT, TOOLS})
_FIELD_KEYS = frozenset(
    {
        "open",
        "open_pattern",
        "close",
        "close_pattern",
        "content",
        "content_args",
        "repeats",
        "join",
        "optional",
        "transform",
        "transform_each",
    }
)


class ResponseTemplateError(ValueError):
    """A ``response_template`` tokenwire cannot serve (the message says which part)."""


@dataclass(frozen=True)
class TemplateField:
    """One region of the template."""

    name: str
    opens: tuple[str, ...]
    closes: tuple[str, ...]
    content: str = "text"
    args: Mapping[str, Any] | None = None
    repeats: bool = False
    join: str | None = None
    transform: Any = None
    transform_each: bool = False


def _literals(scope: str, spec: Mapping[str, Any], key: str) -> tuple[str, ...]:
    if f"{key}_pattern" in spec:
        raise ResponseTemplateError(
            f"{scope}: '{key}_pattern' (a regex anchor) is not supported; tokenwire's hf parser "
            f"reads literal anchors ('{key}')"
        )
    raw = spec.get(key)
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items or not all(isinstance(s, str) and s for s in items):
        raise ResponseTemplateError(f"{scope}: '{key}' must be a string or a list of strings")
    return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class ResponseTemplate:
    """A checkpoint's ``response_template``, checked."""

    fields: Mapping[str, TemplateField]
    implicit: str | None
    start_anchors: tuple[str, ...]

    @classmethod
    def load(cls, spec: Any) -> ResponseTemplate:
        """The template from its metadata (``ResponseTemplateError`` naming what is wrong)."""
        if not isinstance(spec, Mapping):
            raise ResponseTemplateError("response_template must be an object")
        if spec.get("version", 1) != 1:
            raise ResponseTemplateError(f"response_template version {spec.get('version')!r}")
        raw_fields = spec.get("fields")
        if not isinstance(raw_fields, Mapping) or not raw_fields:
            raise ResponseTemplateError("response_template.fields must be a non-empty object")
        fields: dict[str, TemplateField] = {}
        for name, raw in raw_fields.items():
            scope = f"response_template field {name!r}"
            if name not in _FIELDS:
                raise ResponseTemplateError(
                    f"{scope}: tokenwire routes only {', '.join(sorted(_FIELDS))}"
                )
            if not isinstance(raw, Mapping) or set(raw) - _FIELD_KEYS:
                raise ResponseTemplateError(f"{scope}: unknown keys or not an object")
            content = raw.get("content", "text")
            if content not in _PARSERS:
                raise ResponseTemplateError(f"{scope}: unknown content parser {content!r}")
            fields[name] = TemplateField(
                name,
                _literals(scope, raw, "open"),
                _literals(scope, raw, "close"),
                content,
                dict(raw.get("content_args") or {}),
                bool(raw.get("repeats", False)),
                raw.get("join"),
                raw.get("transform"),
                bool(raw.get("transform_each", False)),
            )
        implicit = [n for n, f in fields.items() if not f.opens]
        if len(implicit) > 1:
            raise ResponseTemplateError(
                f"response_template: at most one field may have no 'open' ({', '.join(implicit)})"
            )
        anchors = _literals("response_template", spec, "start_anchor")
        return cls(fields, implicit[0] if implicit else None, anchors)

    def value(self, name: str, body: str) -> Any:
        """A region's text through its content parser and transform."""
        f = self.fields[name]
        value = parse_content(body, f.content, f.args or {})
        if f.transform is None:
            return value
        if f.transform_each:
            if not isinstance(value, list):
                raise ValueError(f"{name}: transform_each needs a list")
            return [_transform(f.transform, dict(item)) for item in value]
        return _transform(f.transform, {"content": value})


# ---- content parsers -------------------------------------------------------------------------


def _text(text: str, args: Mapping[str, Any]) -> str:
    return text.strip() if args.get("strip", True) else text


def _json(text: str, args: Mapping[str, Any]) -> Any:
    work = text
    strings: list[str] = []
    for pair in args.get("string_delims") or []:
        opener, closer = pair
        pattern = re.escape(opener) + "(.*?)" + re.escape(closer)

        def keep(m: re.Match[str]) -> str:
            strings.append(m.group(1))
            return f"\x01{len(strings) - 1}\x02"

        work = re.sub(pattern, keep, work, flags=re.DOTALL)
    if args.get("unquoted_keys"):
        work = re.sub(r"(?<=[{,])(\w+):", r'"\1":', work)
    for k, value in enumerate(strings):
        work = work.replace(f"\x01{k}\x02", json.dumps(value))
    try:
        return json.loads(work)
    except ValueError:
        if args.get("allow_non_json"):
            return _text(text, args)
        raise


def _sub(raw: str, parser: Any) -> Any:
    if not isinstance(parser, Mapping):
        return raw
    return parse_content(raw, parser.get("name", "text"), parser.get("args") or {})


def _xml_inline(text: str, args: Mapping[str, Any]) -> dict[str, Any]:
    pattern = args.get("tag_pattern")
    if not isinstance(pattern, str):
        raise ValueError("xml-inline needs tag_pattern")
    out: dict[str, Any] = {}
    for m in re.finditer(pattern, text, flags=re.DOTALL):
        key = m.groupdict().get("key")
        if key is None:
            raise ValueError("xml-inline: tag_pattern has no 'key' group")
        value = _sub(m.groupdict().get("value") or "", args.get("value_parser"))
        if key in out and args.get("merge_duplicates"):
            out[key] = (out[key] if isinstance(out[key], list) else [out[key]]) + [value]
        else:
            out[key] = value
    return out


def _kv_lines(text: str, args: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kv = args.get("kv_sep", ":")
    for line in text.split(args.get("line_sep", "\n")):
        line = _text(line, args)
        if line and kv in line:
            k, v = line.split(kv, 1)
            out[_text(k, args)] = _sub(_text(v, args), args.get("value_parser"))
    return out


_PARSERS = {
    "text": _text,
    "int": lambda t, a: int(_text(t, a)),
    "float": lambda t, a: float(_text(t, a)),
    "bool": lambda t, a: _text(t, a).lower() in ("true", "1"),
    "json": _json,
    "xml-inline": _xml_inline,
    "kv-lines": _kv_lines,
}


def parse_content(text: str, kind: str, args: Mapping[str, Any]) -> Any:
    """A region's text read by the named content parser (``ValueError`` when it is not)."""
    return _PARSERS[kind](text, args)


_PLACEHOLDER = re.compile(r"\{(\w+(?:\.\w+)*)\}")


def _transform(template: Any, scope: Mapping[str, Any]) -> Any:
    if isinstance(template, Mapping):
        return {k: _transform(v, scope) for k, v in template.items()}
    if isinstance(template, list):
        return [_transform(v, scope) for v in template]
    if not isinstance(template, str):
        return template
    whole = _PLACEHOLDER.fullmatch(template)
    if whole is None:
        return template
    root, *keys = whole.group(1).split(".")
    value: Any = scope[root]
    for key in keys:
        value = value[key]
    return value


# ---- the parsers -----------------------------------------------------------------------------

#: The parser classes bound to a template, by (parser, the template's id); templates live as
#: long as the server's options.
_BOUND: dict[tuple[type, int], Any] = {}


class ResponseTemplateReasoningParser(ReasoningParser):
    """``hf``: the template's ``thinking`` region is the reasoning (``for_template`` gives the
    parser of one checkpoint's template)."""

    name = "hf"
    needs_template: ClassVar[bool] = True
    template: ClassVar[ResponseTemplate | None] = None

    @classmethod
    def for_template(cls, template: ResponseTemplate) -> type[ResponseTemplateReasoningParser]:
        """The reasoning parser of this template."""
        thinking = template.fields.get(THINKING)
        if thinking is None or not thinking.closes:
            raise ResponseTemplateError(
                "--reasoning-parser hf: the response_template has no thinking field with a close"
            )
        bound = _BOUND.get((cls, id(template)))
        if bound is None:
            attrs = {
                "template": template,
                "start_tags": thinking.opens or ("\0no opening anchor",),
                "end_tags": thinking.closes,
                "implicit_start": template.implicit == THINKING,
            }
            bound = _BOUND[(cls, id(template))] = type(cls.__name__, (cls,), attrs)
        return bound

    def __init__(self, *, prompt_in_reasoning: bool = False) -> None:
        if self.template is None:
            raise ResponseTemplateError("the hf reasoning parser needs a response_template")
        super().__init__(prompt_in_reasoning=prompt_in_reasoning)


_TEXT, _REGION = 0, 1


class ResponseTemplateToolParser(ToolCallParser):
    """``hf``: the template's ``tool_calls`` regions are calls, its ``content`` (and any
    ``thinking`` no reasoning parser took) the content, their anchors dropped."""

    name = "hf"
    needs_template: ClassVar[bool] = True
    template: ClassVar[ResponseTemplate | None] = None

    @classmethod
    def for_template(cls, template: ResponseTemplate) -> type[ResponseTemplateToolParser]:
        """The tool-call parser of this template."""
        if TOOLS not in template.fields or not template.fields[TOOLS].opens:
            raise ResponseTemplateError(
                "--tool-call-parser hf: the response_template has no tool_calls field with an open"
            )
        bound = _BOUND.get((cls, id(template)))
        if bound is None:
            bound = _BOUND[(cls, id(template))] = type(cls.__name__, (cls,), {"template": template})
        return bound

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        t = self.template
        if t is None:
            raise ResponseTemplateError("the hf tool-call parser needs a response_template")
        self._opens = {m: f.name for f in t.fields.values() for m in f.opens}
        implicit = t.fields.get(t.implicit) if t.implicit else None
        self._implicit_closes = implicit.closes if implicit else ()
        self._state = _TEXT
        self._field: str | None = None
        self._marker = ""
        self._parts: list[str] = []

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        t = self.template
        assert t is not None
        while True:
            buf = self._buf
            if self._state == _TEXT:
                marks = (*self._opens, *self._implicit_closes)
                at, marker = find_marker(buf, marks, final=final)
                out.content += buf[:at]
                self._buf = buf[at:]
                if marker is None:
                    return
                self._buf = buf[at + len(marker) :]
                if marker in self._opens:
                    self._field, self._marker = self._opens[marker], marker
                    self._parts = []
                    self._state = _REGION
                continue
            f = t.fields[self._field or ""]
            if f.closes:
                at, marker = find_marker(buf, f.closes, final=final)
            else:  # a region that runs to the end of the output
                at, marker = len(buf), None
            if f.name != TOOLS:  # content (or thinking) streams as it comes
                out.content += buf[:at]
            else:
                self._parts.append(buf[:at])
            self._buf = buf[at:]
            if marker is None and not final:
                return
            if marker is not None:
                self._buf = buf[at + len(marker) :]
            if f.name == TOOLS:
                self._read_calls(out, "".join(self._parts), marker)
            self._state = _TEXT
            if marker is None:
                return

    def _read_calls(self, out: ToolDelta, body: str, close: str | None) -> None:
        assert self.template is not None
        try:
            calls = _tool_calls(self.template.value(TOOLS, body))
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):
            calls = None
        if not calls:  # no call came of it: the region as written
            out.content += self._marker + body + (close or "")
            return
        for name, args in calls:
            if isinstance(args, dict):
                args = {k: self._typed(name, k, v) for k, v in args.items()}
            try:
                text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            except (TypeError, ValueError):
                text = str(args)
            self._whole_call(out, name, text)

    def _typed(self, function: str, key: str, value: Any) -> Any:
        schema = self.schemas.parameter(function, key)
        if isinstance(value, str) and schema is not None and not is_string_only(schema):
            return coerce(value, schema)
        return value


def _tool_calls(value: Any) -> list[tuple[str, Any]] | None:
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if not isinstance(item, Mapping):
            return None
        fn = item.get("function", item)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            return None
        args = fn.get("arguments", fn.get("parameters", {}))
        out.append((fn["name"], {} if args is None else args))
    return out
