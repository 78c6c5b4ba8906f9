"""Structured outputs: the request fields that ask for constrained decoding, validated in the
frontend and turned into ``SamplingParams``' grammar fields (``json_schema``, ``regex``,
``ebnf``, ``structural_tag``) for an engine that constrains decoding. An engine that cannot
makes every one of them a 400 naming the field, never a silently unconstrained answer.

Accepted: OpenAI's ``response_format`` (``json_object``, ``json_schema`` with ``strict``),
vLLM's ``structured_outputs`` (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``)
and older ``guided_json``/``guided_regex``/``guided_choice``/``guided_grammar``, and SGLang's
``json_schema``/``regex``/``ebnf``/``structural_tag`` in ``/generate``'s ``sampling_params``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import msgspec
import re2

from tokenwire.messages.errors import ValidationError

__all__ = [
    "STRUCTURED_FIELDS",
    "MAX_CHOICES",
    "MAX_GRAMMAR_BYTES",
    "MAX_REGEX_BYTES",
    "MAX_SCHEMA_BYTES",
    "check_grammar_params",
    "check_schema",
    "structured_fields",
    "structured_request",
]

#: Largest JSON schema (serialized), grammar, and regex a request may carry.
MAX_SCHEMA_BYTES = 64 * 1024
MAX_GRAMMAR_BYTES = 64 * 1024
MAX_REGEX_BYTES = 4 * 1024
#: Most alternatives of a ``choice``.
MAX_CHOICES = 256
_MAX_DEPTH = 32
#: Deepest nesting of any JSON value in a schema (``enum``, ``const``, ``default``... included):
#: room for ``_MAX_DEPTH`` levels of schemas, each inside ``properties`` or the like.
_MAX_JSON_DEPTH = 4 * _MAX_DEPTH
_JSON_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
#: The OpenAI-route request fields this module reads.
#: SGLang's top-level fields on its OpenAI routes (a JSON schema's text, a regex, an EBNF grammar).
_SGLANG = ("json_schema", "regex", "ebnf")
STRUCTURED_FIELDS = frozenset({"response_format", "structured_outputs", *_GUIDED, *_SGLANG})
_SO_KEYS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def _size(text: str, limit: int, field: str) -> None:
    n = len(text.encode("utf-8"))
    if n > limit:
        raise ValidationError(f"{field} is {n} bytes, more than the limit of {limit}", param=field)


def _check_schema(schema: Any, field: str, depth: int = 0) -> None:
    """A JSON schema's shape: an object (or boolean) whose keywords hold what they must."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ValidationError(f"{field}: a JSON schema must be an object", param=field)
    if depth > _MAX_DEPTH:
        raise ValidationError(f"{field}: the schema nests deeper than {_MAX_DEPTH}", param=field)
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _JSON_TYPES:
            raise ValidationError(f"{field}: unknown schema type {k!r}", param=field)
    for key in ("properties", "patternProperties", "$defs", "definitions"):
        sub = schema.get(key)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise ValidationError(f"{field}: {key} must be an object of schemas", param=field)
        for v in sub.values():
            _check_schema(v, field, depth + 1)
    for key in ("items", "additionalProperties", "not", "contains", "propertyNames"):
        if key in schema:
            sub = schema[key]
            for v in sub if key == "items" and isinstance(sub, list) else [sub]:
                _check_schema(v, field, depth + 1)
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if key in schema:
            if not isinstance(schema[key], list) or not schema[key]:
                raise ValidationError(f"{field}: {key} must be a non-empty list", param=field)
            for v in schema[key]:
                _check_schema(v, field, depth + 1)
    required = schema.get("required")
    if required is not None and (
        not isinstance(required, list) or not all(isinstance(r, str) for r in required)
    ):
        raise ValidationError(f"{field}: required must be a list of names", param=field)
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise ValidationError(f"{field}: enum must be a list", param=field)
    if "$ref" in schema and not isinstance(schema["$ref"], str):
        raise ValidationError(f"{field}: $ref must be a string", param=field)
    if "pattern" in schema:
        _check_regex(schema["pattern"], field)


def _json_depth(value: Any) -> int:
    """How deep ``value`` nests (a scalar: 0), without recursion."""
    deepest = 0
    todo = [(value, 1)]
    while todo:
        v, depth = todo.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            todo.extend((c, depth + 1) for c in children)
    return deepest


def _check_json_depth(value: Any, field: str) -> None:
    if _json_depth(value) > _MAX_JSON_DEPTH:
        raise ValidationError(f"{field} nests deeper than {_MAX_JSON_DEPTH} levels", param=field)


def check_schema(schema: Any, field: str) -> None:
    """A JSON schema (decoded) an engine will constrain output to: its shape and its nesting
    checked, ``ValidationError`` naming ``field`` otherwise."""
    _check_json_depth(schema, field)
    _check_schema(schema, field)


def _schema_text(schema: Any, field: str) -> str:
    """A schema (an object, or its JSON text) checked, as JSON text."""
    if isinstance(schema, str):
        try:  # strict JSON: no NaN or Infinity, which no engine's JSON parser takes
            schema = msgspec.json.decode(schema)
        except msgspec.DecodeError as exc:
            raise ValidationError(f"{field} is not valid JSON: {exc}", param=field) from None
        except RecursionError:
            raise ValidationError(f"{field} nests too deeply", param=field) from None
    check_schema(schema, field)
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    _size(text, MAX_SCHEMA_BYTES, field)
    return text


def _check_regex(pattern: Any, field: str) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise ValidationError(f"{field} must be a non-empty regular expression", param=field)
    _size(pattern, MAX_REGEX_BYTES, field)
    try:
        re2.compile(pattern)
    except re2.error as exc:
        raise ValidationError(f"{field} is not an admissible regex: {exc}", param=field) from None
    return pattern


def _choice_regex(choices: Any, field: str) -> str:
    if (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise ValidationError(f"{field} must be a non-empty list of strings", param=field)
    if len(choices) > MAX_CHOICES:
        raise ValidationError(f"{field} has more than {MAX_CHOICES} choices", param=field)
    return _check_regex("(?:" + "|".join(re.escape(c) for c in choices) + ")", field)


def _grammar(text: Any, field: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ValidationError(f"{field} must be a non-empty grammar", param=field)
    _size(text, MAX_GRAMMAR_BYTES, field)
    return text


def _response_format(value: Any) -> tuple[str, str] | None:
    field = "response_format"
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ValidationError(
            "response_format must be an object with a type (text, json_object, json_schema)",
            param=field,
        )
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_schema", '{"type":"object"}'
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise ValidationError(
                "response_format.json_schema must be an object with name and schema", param=field
            )
        name = spec.get("name")
        if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
            raise ValidationError(
                "response_format.json_schema.name must be 1-64 letters, digits, _ or -",
                param=field,
            )
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ValidationError(
                "response_format.json_schema.strict must be a boolean", param=field
            )
        schema = spec.get("schema", {})
        return "json_schema", _schema_text(schema, "response_format")
    raise ValidationError(
        f"response_format.type must be text, json_object or json_schema, got {kind!r}",
        param=field,
    )


def _structured_outputs(value: Any) -> tuple[str, str] | None:
    field = "structured_outputs"
    if not isinstance(value, dict):
        raise ValidationError("structured_outputs must be an object", param=field)
    given = [k for k in _SO_KEYS if value.get(k) not in (None, False)]
    if len(given) > 1:
        raise ValidationError(
            f"structured_outputs sets {', '.join(given)}: give exactly one", param=field
        )
    if not given:
        return None
    key = given[0]
    where = f"{field}.{key}"
    if key == "json":
        return "json_schema", _schema_text(value["json"], where)
    if key == "json_object":
        return "json_schema", '{"type":"object"}'
    if key == "regex":
        return "regex", _check_regex(value["regex"], where)
    if key == "choice":
        return "regex", _choice_regex(value["choice"], where)
    if key == "grammar":
        return "ebnf", _grammar(value["grammar"], where)
    tag = value["structural_tag"]
    if not isinstance(tag, str):
        _check_json_depth(tag, where)
    text = tag if isinstance(tag, str) else json.dumps(tag, ensure_ascii=False)
    _size(text, MAX_SCHEMA_BYTES, where)
    return "structural_tag", text


def _refuse(field: str, what: str) -> ValidationError:
    return ValidationError(
        f"{field} asks for {what}, which needs an engine that constrains decoding; this "
        "server's engine cannot, and will not answer unconstrained",
        param=field,
    )


def structured_fields(body: Mapping[str, Any], *, supported: bool) -> dict[str, str]:
    """``SamplingParams`` grammar fields for an OpenAI request's structured-output fields (at
    most one of them); ``ValidationError`` naming the field when it is malformed, or when the
    engine does not constrain decoding (``supported`` False)."""
    return structured_request(body, supported=supported)[1]


def structured_request(
    body: Mapping[str, Any], *, supported: bool
) -> tuple[str | None, dict[str, str]]:
    """``structured_fields``, with the request field they come from (None without one)."""
    found: list[tuple[str, tuple[str, str]]] = []
    rf = body.get("response_format")
    if rf is not None:
        got = _response_format(rf)
        if got is not None:
            found.append(("response_format", got))
    so = body.get("structured_outputs")
    if so is not None:
        got = _structured_outputs(so)
        if got is not None:
            found.append(("structured_outputs", got))
    for key in _GUIDED:
        value = body.get(key)
        if value is None:
            continue
        if key == "guided_json":
            found.append((key, ("json_schema", _schema_text(value, key))))
        elif key == "guided_regex":
            found.append((key, ("regex", _check_regex(value, key))))
        elif key == "guided_choice":
            found.append((key, ("regex", _choice_regex(value, key))))
        else:
            found.append((key, ("ebnf", _grammar(value, key))))
    for key in _SGLANG:
        value = body.get(key)
        if value is None:
            continue
        if key == "json_schema":
            found.append((key, ("json_schema", _schema_text(value, key))))
        elif key == "regex":
            found.append((key, ("regex", _check_regex(value, key))))
        else:
            found.append((key, ("ebnf", _grammar(value, key))))
    if not found:
        return None, {}
    if len(found) > 1:
        raise ValidationError(
            f"{found[1][0]}: set only one of {', '.join(f for f, _ in found)}", param=found[1][0]
        )
    field, (param, value) = found[0]
    if not supported:
        raise _refuse(field, "structured output" if param == "json_schema" else f"a {param}")
    return field, {param: value}


def check_grammar_params(sampling_params: Mapping[str, Any] | None, *, supported: bool) -> None:
    """SGLang's ``sampling_params`` grammar fields in ``/generate``: checked like the OpenAI
    ones, and refused (naming the field) when the engine does not constrain decoding."""
    if not isinstance(sampling_params, Mapping):
        return
    for key in ("json_schema", "regex", "ebnf", "structural_tag"):
        value = sampling_params.get(key)
        if value is None or value == "":
            continue
        if key == "json_schema":
            _schema_text(value, key)
        elif key == "regex":
            _check_regex(value, key)
        elif isinstance(value, str):
            _size(value, MAX_GRAMMAR_BYTES, key)
        if not supported:
            raise _refuse(key, "structured output" if key == "json_schema" else f"a {key}")
