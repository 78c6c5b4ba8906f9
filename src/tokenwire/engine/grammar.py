"""Grammars for constrained decoding, compiled with llguidance over the served tokenizer.

A request's constraint is one of ``SamplingParams``' grammar fields: ``json_schema``, ``regex``,
``ebnf`` (Lark or GBNF, as vLLM's ``grammar``) or ``structural_tag`` (vLLM's: ``structures`` with
``triggers``). ``GrammarCompiler`` compiles it in a worker thread (llguidance releases the GIL
while it builds a grammar), keeps the most recent ones in a bounded cache keyed by the
constraint, and answers one llguidance refuses with a ``ValidationError`` naming the field.
Every request decodes with its own copy of the compiled matcher (``Grammar.matcher``).

JSON is compiled without free whitespace, items separated by ``", "`` and keys by ``": "`` (the
text ``json.dumps`` writes), and objects that list their properties take no others
(``closed_objects``): every byte of structure is then forced, and the engine only chooses where
a schema leaves a choice.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import llguidance

from tokenwire.messages.errors import ValidationError

if TYPE_CHECKING:
    from tokenwire.messages.sampling import SamplingParams
    from tokenwire.tokenizer import Tokenizer

__all__ = [
    "GRAMMAR_FIELDS",
    "DEFAULT_CACHE_SIZE",
    "Grammar",
    "GrammarCompiler",
    "closed_objects",
    "constraint_of",
    "grammar_source",
    "ll_tokenizer",
]

#: The ``SamplingParams`` fields that constrain decoding, in the order they are looked at.
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
#: Compiled grammars kept (the least recently used goes first).
DEFAULT_CACHE_SIZE = 256
#: How JSON schemas are compiled (see the module docstring).
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
#: Most characters of llguidance's message quoted in a refusal.
_MESSAGE_LIMIT = 300


def constraint_of(params: SamplingParams) -> tuple[str, str] | None:
    """The ``(field, text)`` a request's decoding is constrained to, or None."""
    for name in GRAMMAR_FIELDS:
        value = getattr(params, name)
        if value is not None:
            return name, value
    return None


def ll_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of ``tokenizer`` (built once per tokenizer, most of a second): its
    whole model vocabulary, its EOS ids."""
    return tokenizer.derived("llguidance", _build_ll_tokenizer)


def _build_ll_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(
        tokenizer.hf.to_str(),
        n_vocab=tokenizer.model_vocab_size,
        eos_token=list(tokenizer.eos_token_ids) or None,
    )


#: Keywords whose value maps names to subschemas, and keywords whose value is subschemas.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = (
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "contains",
    "items",
    "prefixItems",
    "additionalItems",
    "not",
    "if",
    "then",
    "else",
    "allOf",
    "anyOf",
    "oneOf",
)


def closed_objects(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` wherever an object schema lists its
    properties and says nothing of others (vLLM's ``disable_additional_properties``): output
    then has the properties a schema names, as a model's has, and still validates against it."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_objects(v) for k, v in out[key].items()}
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), (dict, list)):
            out[key] = closed_objects(out[key])
    if "additionalProperties" not in out and isinstance(out.get("properties"), dict):
        out["additionalProperties"] = False
    return out


def _json_grammar(schema: Any) -> str:
    return llguidance.LLMatcher.grammar_from_json_schema(
        closed_objects(schema), defaults=JSON_OPTIONS
    )


def _structural_tag(text: str) -> str:
    """vLLM's structural tag (``{"structures": [{"begin", "schema", "end"}], "triggers"}``): free
    text in which each structure, once its trigger appears, is constrained to its schema."""
    spec = json.loads(text)
    if not isinstance(spec, dict) or "structures" not in spec:
        raise ValueError(
            'a structural tag needs "structures" (begin, schema, end) and "triggers"; '
            "xgrammar's newer format form is not supported"
        )
    triggers = spec.get("triggers")
    if not isinstance(triggers, list) or not all(isinstance(t, str) and t for t in triggers):
        raise ValueError("triggers must be a list of non-empty strings")
    tags = []
    for s in spec["structures"] or []:
        if not isinstance(s, dict):
            raise ValueError("each structure must be an object with begin, schema and end")
        begin, end, schema = s.get("begin"), s.get("end", ""), s.get("schema", {})
        if not isinstance(begin, str) or not isinstance(end, str):
            raise ValueError("a structure's begin and end must be strings")
        trigger = next((t for t in triggers if begin.startswith(t)), None)
        if trigger is None:
            raise ValueError(f"no trigger starts the structure {begin[:40]!r}")
        if isinstance(schema, dict):
            schema = closed_objects(schema)
            schema["x-guidance"] = {**JSON_OPTIONS, **(schema.get("x-guidance") or {})}
        elif not isinstance(schema, bool):
            raise ValueError("a structure's schema must be a JSON schema")
        tags.append(llguidance.StructTag(trigger=trigger, begin=begin, grammar=schema, end=end))
    if not tags:
        raise ValueError("the structural tag has no structures")
    return llguidance.StructTag.to_grammar(tags)


def grammar_source(kind: str, text: str) -> str:
    """llguidance's grammar for a constraint (``ValueError`` when it cannot be one)."""
    if kind == "json_schema":
        return _json_grammar(json.loads(text))
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(text)
    if kind == "ebnf":
        return llguidance.grammar_from("grammar", text)
    if kind == "structural_tag":
        return _structural_tag(text)
    raise ValueError(f"unknown constraint {kind!r}")


@dataclass
class Grammar:
    """A compiled constraint: a matcher in its start state, copied for each request."""

    kind: str
    text: str
    template: llguidance.LLMatcher
    #: Facts about the grammar computed once, in the worker, by the compiler's ``prepare``
    #: hook (the decoder keeps the length of its shortest finish here).
    facts: dict[str, Any] = field(default_factory=dict)

    def matcher(self) -> llguidance.LLMatcher:
        """A fresh matcher for one request."""
        return self.template.deep_copy()


def _refusal(kind: str, message: str) -> ValidationError:
    message = message.strip().replace("\n", " ")
    if len(message) > _MESSAGE_LIMIT:
        message = message[: _MESSAGE_LIMIT - 3] + "..."
    return ValidationError(
        f"{kind} is refused by the grammar engine (llguidance): {message}", param=kind
    )


class GrammarCompiler:
    """Compiles constraints in a worker thread and keeps the last ``capacity`` of them (a refusal
    is kept too, so a bad grammar is not compiled again). ``prepare`` runs on each new grammar in
    the worker, after it compiled."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        capacity: int = DEFAULT_CACHE_SIZE,
        prepare: Callable[[Grammar], None] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.tokenizer = tokenizer
        self.capacity = capacity
        self._prepare = prepare
        self._cache: OrderedDict[tuple[str, str], Future[Grammar]] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenwire-grammar")
        #: Counters for tests and benchmarks.
        self.stats = {"compiled": 0, "refused": 0, "hits": 0}

    def compile(self, kind: str, text: str) -> Future[Grammar]:
        """The compiled grammar of a constraint, as a future (done at once when cached); a refusal
        is a ``ValidationError`` naming ``kind``. Call from one thread (the event loop's)."""
        key = (kind, text)
        fut = self._cache.get(key)
        if fut is not None:
            self._cache.move_to_end(key)
            self.stats["hits"] += 1
            return fut
        fut = self._pool.submit(self._build, kind, text)
        self._cache[key] = fut
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return fut

    def compile_params(self, params: SamplingParams) -> Future[Grammar] | None:
        """``compile`` for a request's constraint, or None when it has none."""
        got = constraint_of(params)
        return None if got is None else self.compile(*got)

    async def check(self, params: SamplingParams) -> None:
        """Wait for a request's grammar to compile (in the worker); ``ValidationError`` naming
        the ``SamplingParams`` field when llguidance refuses it."""
        fut = self.compile_params(params)
        if fut is not None:
            await asyncio.wrap_future(fut)

    def __len__(self) -> int:
        return len(self._cache)

    def close(self) -> None:
        """Stop the worker (compilations in progress finish; queued ones are dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _build(self, kind: str, text: str) -> Grammar:
        """Compile one constraint (in the worker)."""
        try:
            tok = ll_tokenizer(self.tokenizer)
            source = grammar_source(kind, text)
            err = llguidance.LLMatcher.validate_grammar(source, tok)
            if err:
                raise ValueError(err)
            matcher = llguidance.LLMatcher(tok, source, log_level=0)
            if matcher.is_error():
                raise ValueError(matcher.get_error())
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            self.stats["refused"] += 1
            raise _refusal(kind, str(exc)) from None
        grammar = Grammar(kind, text, matcher)
        if self._prepare is not None:
            self._prepare(grammar)
        self.stats["compiled"] += 1
        return grammar
