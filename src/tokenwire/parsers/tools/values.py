"""Argument values that a model writes as bare text (XML-style parameters, FunctionGemma's bare
values): their JSON value, from the tool's parameter schema.

Formats like Qwen3-Coder's ``<parameter=days>3</parameter>`` give no type with the value: the
request's ``tools`` say that ``days`` is an integer. ``coerce`` follows vLLM's rules, so both
servers give a client the same arguments: the schema's types are tried in the order null,
integer, number, boolean, object, array, string; a value that fits none stays a string; without
a schema a value is a string.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ToolSchemas", "coerce", "is_string_only", "schema_types"]

_ALIASES = {
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "enum": "string",
    "int": "integer",
    "int32": "integer",
    "int64": "integer",
    "uint": "integer",
    "uint32": "integer",
    "uint64": "integer",
    "long": "integer",
    "short": "integer",
    "unsigned": "integer",
    "float": "number",
    "float32": "number",
    "float64": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "arr": "array",
    "list": "array",
    "sequence": "array",
}
_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")


def schema_types(schema: Any) -> set[str]:
    """The JSON types a parameter schema allows (``type``, ``enum`` values, ``anyOf``/``oneOf``/
    ``allOf`` branches); ``{"string"}`` when it says none."""
    if not isinstance(schema, Mapping):
        return {"string"}
    types: set[str] = set()
    t = schema.get("type")
    for name in [t] if isinstance(t, str) else t if isinstance(t, list) else []:
        if isinstance(name, str):
            name = name.strip().lower()
            types.add(_ALIASES.get(name, name))
    enum = schema.get("enum")
    if isinstance(enum, list):
        for v in enum:
            types.add(_json_type(v))
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for branch in branches:
                types |= schema_types(branch)
    return types or {"string"}


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "string"


def is_string_only(schema: Any) -> bool:
    """Whether a value under this schema is always a string (so its text can stream as a JSON
    string before it ends). A parameter the schema does not describe is a string."""
    return schema is None or schema_types(schema) == {"string"}


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _loads(text: str) -> Any:
    value = json.loads(text)
    if not _finite(value):
        raise ValueError("not a finite JSON value")
    return value


def coerce(text: str, schema: Any) -> Any:
    """The JSON value of a bare-text argument under its parameter schema (None: no schema, the
    text is a string)."""
    if schema is None:
        return text
    types = schema_types(schema)
    for kind in _ORDER:
        if kind not in types:
            continue
        if kind == "string":
            return text
        if kind == "null":
            if text.lower() == "null":
                return None
        elif kind == "integer":
            try:
                return int(text)
            except ValueError:
                pass
        elif kind == "number":
            try:
                number = float(text)
            except ValueError:
                continue
            if math.isfinite(number):
                return int(number) if number == int(number) else number
        elif kind == "boolean":
            word = text.strip().lower()
            if word in ("true", "1"):
                return True
            if word in ("false", "0"):
                return False
        else:  # object, array
            try:
                value = _loads(text)
            except (ValueError, RecursionError):
                continue
            return value
    try:  # types none of which fits (a custom one): JSON if it is, else the text
        return _loads(text)
    except (ValueError, RecursionError):
        return text


class ToolSchemas:
    """The parameter schemas of a request's ``tools``, by function name."""

    def __init__(self, tools: Iterable[Mapping[str, Any]] | None = None) -> None:
        self._params: dict[str, dict[str, Any]] = {}
        for tool in tools or ():
            fn = tool.get("function") if isinstance(tool, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                continue
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, Mapping) else None
            self._params[fn["name"]] = dict(props) if isinstance(props, Mapping) else {}

    def __bool__(self) -> bool:
        return bool(self._params)

    def parameter_schemas(self, function: str) -> dict[str, Any]:
        """The parameter schemas of one function, by name (empty when the tools do not
        describe it)."""
        return dict(self._params.get(function) or {})

    def parameter(self, function: str, name: str) -> Any:
        """The schema of one parameter, or None when the tools do not describe it."""
        props = self._params.get(function)
        return None if props is None else props.get(name)
