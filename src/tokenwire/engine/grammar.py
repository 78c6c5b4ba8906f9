"""Grammars for constrained decoding, compiled with llguidance over the served tokenizer.

A request's constraint is one of ``SamplingParams``' grammar fields: ``json_schema``, ``regex``,
``ebnf`` (Lark or GBNF, as vLLM's ``grammar``) or ``structural_tag`` (vLLM's: ``structures`` with
``triggers``). ``GrammarCompiler`` compiles it in a small pool of worker threads (llguidance
releases the GIL while it builds a grammar and computes masks, the bulk of the work), keeps the
most recent ones in a bounded cache keyed by the constraint, and answers one llguidance refuses
with a ``ValidationError`` naming the field. Compiles are fair between clients: each client's
wait in its own queue, the queues are served in turn, and no client holds more than half the
workers (so another client's compile starts at once). The work after a compile (the
``prepare`` hook: the decoder's rollout) must end by ``Grammar.deadline``, ``compile_timeout``
seconds after the compile began. Every request decodes with its own copy of the compiled
matcher (``Grammar.matcher``).

JSON is compiled without free whitespace, items separated by ``", "`` and keys by ``": "`` (the
text ``json.dumps`` writes), and objects that list their properties take no others
(``closed_objects``): every byte of structure is then forced, and the engine only chooses where
a schema leaves a choice.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
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
#: Compile workers (the machine's cores are shared with the event loop and the decoders).
DEFAULT_COMPILE_WORKERS = 2
#: Seconds a grammar's compile and rollout may take.
DEFAULT_COMPILE_TIMEOUT = 10.0
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
    #: When (``time.monotonic()``) the ``prepare`` hook must be done by (None: no bound).
    deadline: float | None = None

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
    """Compiles constraints in a pool of worker threads, fairly between clients, and keeps the
    last ``capacity`` of them (a refusal is kept too, so a bad grammar is not compiled again).
    ``prepare`` runs on each new grammar in the worker, after it compiled, with
    ``Grammar.deadline`` set ``compile_timeout`` seconds after the compile began."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        capacity: int = DEFAULT_CACHE_SIZE,
        prepare: Callable[[Grammar], None] | None = None,
        workers: int = DEFAULT_COMPILE_WORKERS,
        compile_timeout: float | None = DEFAULT_COMPILE_TIMEOUT,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.tokenizer = tokenizer
        self.capacity = capacity
        self.compile_timeout = compile_timeout
        self._prepare = prepare
        self._cache: OrderedDict[tuple[str, str], Future[Grammar]] = OrderedDict()
        #: Compiles waiting, per client, served in turn; compiles running, per client.
        self._queues: OrderedDict[str, deque[tuple[str, str, Future[Grammar]]]] = OrderedDict()
        self._running: dict[str, int] = {}
        self._per_client = max(1, workers // 2)
        self._cond = threading.Condition()
        self._closed = False
        self._workers = workers
        self._threads: list[threading.Thread] = []
        #: Counters for tests and benchmarks.
        self.stats = {"compiled": 0, "refused": 0, "hits": 0}

    def compile(self, kind: str, text: str, client: str | None = None) -> Future[Grammar]:
        """The compiled grammar of a constraint, as a future (done at once when cached); a refusal
        is a ``ValidationError`` naming ``kind``. ``client`` (an API key's id, a peer address)
        says whose turn it waits for. Call from one thread (the event loop's)."""
        key = (kind, text)
        fut = self._cache.get(key)
        if fut is not None:
            self._cache.move_to_end(key)
            self.stats["hits"] += 1
            return fut
        fut = Future()
        self._cache[key] = fut
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        with self._cond:
            if self._closed:
                fut.cancel()
                return fut
            self._queues.setdefault(client or "", deque()).append((kind, text, fut))
            if len(self._threads) < self._workers:
                thread = threading.Thread(
                    target=self._work, name=f"tokenwire-grammar_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            self._cond.notify()
        return fut

    def compile_params(
        self, params: SamplingParams, client: str | None = None
    ) -> Future[Grammar] | None:
        """``compile`` for a request's constraint, or None when it has none."""
        got = constraint_of(params)
        return None if got is None else self.compile(*got, client=client)

    async def check(self, params: SamplingParams, client: str | None = None) -> Grammar | None:
        """Wait for a request's grammar to compile (in the pool); ``ValidationError`` naming
        the ``SamplingParams`` field when llguidance refuses it."""
        fut = self.compile_params(params, client)
        if fut is None:
            return None
        return await asyncio.wrap_future(fut)

    def __len__(self) -> int:
        return len(self._cache)

    def close(self) -> None:
        """Stop the workers (compilations in progress finish; queued ones are cancelled)."""
        with self._cond:
            self._closed = True
            for queue in self._queues.values():
                for _, _, fut in queue:
                    fut.cancel()
            self._queues.clear()
            self._cond.notify_all()

    def _next(self) -> tuple[str, str, str, Future[Grammar]] | None:
        """The next compile to run: the first client in turn that has one waiting and fewer
        than its share running (half the workers: the other half stays free for the next
        client that comes). Under the lock."""
        for client, queue in self._queues.items():
            if self._running.get(client, 0) < self._per_client:
                kind, text, fut = queue.popleft()
                if queue:
                    self._queues.move_to_end(client)
                else:
                    del self._queues[client]
                return client, kind, text, fut
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                job = None
                while not self._closed and (job := self._next()) is None:
                    self._cond.wait()
                if job is None:
                    return
                client = job[0]
                self._running[client] = self._running.get(client, 0) + 1
            try:
                _, kind, text, fut = job
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(self._build(kind, text))
                    except BaseException as exc:
                        fut.set_exception(exc)
            finally:
                with self._cond:
                    self._running[client] -= 1
                    if not self._running[client]:
                        del self._running[client]
                    self._cond.notify()

    def _build(self, kind: str, text: str) -> Grammar:
        """Compile one constraint (in a worker)."""
        start = time.monotonic()
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
        if self.compile_timeout is not None:
            grammar.deadline = start + self.compile_timeout
        if self._prepare is not None:
            self._prepare(grammar)
        self.stats["compiled"] += 1
        return grammar
