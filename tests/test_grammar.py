"""Constrained decoding in the synthetic engine: every output is a sentence of its grammar (JSON
that validates against its schema, a full match of its regex, one of its choices, a sentence of
its EBNF), it ends within ``max_tokens`` (``length`` when the budget is below any finish), it is
deterministic for a seed, grammars compile in a worker thread with a bounded cache, and one
llguidance refuses is a ``ValidationError`` naming the field."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import jsonschema
import pytest

from tokenwire.engine import EngineRequest, check_grammar
from tokenwire.engine.constrained import TokenTables, finish_length
from tokenwire.engine.grammar import GrammarCompiler, closed_objects
from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.messages.errors import ValidationError
from tokenwire.messages.frames import (
    EGRESS_TAG_BATCH,
    EGRESS_TAG_ERROR,
    decode_batch_frame,
    decode_error_frame,
)
from tokenwire.messages.sampling import SamplingParams

from conftest import real_tokenizer

TOK = real_tokenizer("default")

SCHEMAS = {
    # What the openai client's .parse sends for a Pydantic model (strict).
    "weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "sunny": {"type": "boolean"},
        },
        "required": ["city", "days", "sunny"],
        "additionalProperties": False,
    },
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2, "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "format": "email"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            "score": {"type": "number"},
            "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "role": {"enum": ["admin", "user", "guest"]},
        },
        "required": ["name", "age", "tags", "role"],
    },
    "nested": {
        "$defs": {
            "Address": {
                "type": "object",
                "properties": {"street": {"type": "string"}, "zip": {"pattern": "^[0-9]{5}$"}},
                "required": ["street", "zip"],
            }
        },
        "type": "object",
        "properties": {
            "home": {"$ref": "#/$defs/Address"},
            "others": {"type": "array", "items": {"$ref": "#/$defs/Address"}, "minItems": 1},
            "when": {"type": "string", "format": "date-time"},
        },
        "required": ["home", "others", "when"],
    },
    "tree": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["value", "children"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "object": {"type": "object"},
    "list": {"type": "array", "items": {"type": "number"}, "minItems": 2},
}


async def _generate(engine: SyntheticEngine, requests: list[EngineRequest]) -> dict:
    """Run ``requests`` to their ends: rid -> (token ids, finish reason kind or error text)."""
    done: dict[str, tuple[list[int], str]] = {}
    ids: dict[str, list[int]] = {r.rid: [] for r in requests}
    finished = asyncio.Event()

    def output(frame) -> None:
        if frame[0] == EGRESS_TAG_ERROR:
            rid, message = decode_error_frame(frame)
            done[rid] = (ids[rid], "error: " + message)
        elif frame[0] == EGRESS_TAG_BATCH:
            for ev in decode_batch_frame(frame).events:
                ids[ev.rid].extend(ev.token_ids.tolist())
                if ev.finish_reason is not None:
                    done[ev.rid] = (ids[ev.rid], ev.finish_reason.kind)
        if len(done) == len(requests):
            finished.set()

    await engine.start(output)
    try:
        for r in requests:
            engine.submit(r)
        await asyncio.wait_for(finished.wait(), 60)
    finally:
        await engine.close()
    return done


def _request(rid: str, prompt: str = "Tell me.", **params) -> EngineRequest:
    sp = SamplingParams(**params).normalize(TOK)
    return EngineRequest(rid, TOK.encode(prompt, add_special_tokens=False), sp)


def run(requests: list[EngineRequest], **config) -> dict:
    engine = SyntheticEngine(TOK, SyntheticConfig(**config))
    return asyncio.run(_generate(engine, requests))


@pytest.mark.parametrize("output", ["replay", "echo", "random"])
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_output_validates_against_its_schema(name, output) -> None:
    schema = SCHEMAS[name]
    reqs = [
        _request(f"r{seed}", f"prompt {seed}", json_schema=json.dumps(schema), sampling_seed=seed)
        for seed in range(4)
    ]
    for ids, finish in run(reqs, output=output).values():
        assert finish == "stop", (finish, TOK.decode(ids))
        assert ids[-1] in TOK.eos_token_ids
        jsonschema.validate(json.loads(TOK.decode(ids)), schema)


def test_json_reads_like_the_engines_text() -> None:
    """Strings are stretches of the replayed passages, written as json.dumps writes JSON."""
    reqs = [
        _request(f"r{s}", json_schema=json.dumps(SCHEMAS["weather"]), sampling_seed=s)
        for s in range(8)
    ]
    texts = [TOK.decode(ids) for ids, _ in run(reqs).values()]
    values = [json.loads(t) for t in texts]
    assert all(t == json.dumps(v, ensure_ascii=False) for t, v in zip(texts, values))
    from tokenwire.engine.synthetic import replay_passages

    corpus = "\n".join(replay_passages())
    cities = [v["city"] for v in values]
    assert sum(len(c) > 2 and c in corpus for c in cities) >= 6, cities
    assert len(set(cities)) >= 6


def test_echo_that_satisfies_the_grammar_comes_back_unchanged() -> None:
    text = '{"city": "Zürich", "days": 2, "sunny": true}'
    got = run(
        [_request("r", text, json_schema=json.dumps(SCHEMAS["weather"]), ignore_eos=False)],
        output="echo",
    )
    ids, _finish = got["r"]
    assert TOK.decode(ids).startswith(text)
    jsonschema.validate(json.loads(TOK.decode(ids)), SCHEMAS["weather"])


@pytest.mark.parametrize(
    ("kind", "spec", "check"),
    [
        ("regex", r"[A-Z][a-z]+, [0-9]{3}-[0-9]{4}", r"[A-Z][a-z]+, [0-9]{3}-[0-9]{4}"),
        ("regex", r"(?:positive|negative|neutral)", r"positive|negative|neutral"),
        ("regex", r"[a-z ]{5,40}\.", r"[a-z ]{5,40}\."),
        ("ebnf", 'root ::= "The answer is " [0-9]+ "."', r"The answer is [0-9]+\."),
        ("ebnf", 'start: "SELECT " COL " FROM t"\nCOL: /[a-z]+/', r"SELECT [a-z]+ FROM t"),
    ],
)
def test_regexes_and_grammars_are_matched_in_full(kind, spec, check) -> None:
    reqs = [_request(f"r{s}", **{kind: spec, "sampling_seed": s}) for s in range(5)]
    for ids, finish in run(reqs).values():
        assert finish == "stop"
        assert re.fullmatch(check, TOK.decode(ids)), TOK.decode(ids)


def test_structural_tag() -> None:
    tag = {
        "type": "structural_tag",
        "structures": [
            {
                "begin": "<function=add>",
                "schema": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
                "end": "</function>",
            }
        ],
        "triggers": ["<function="],
    }
    reqs = [
        _request(f"r{s}", structural_tag=json.dumps(tag), sampling_seed=s, max_new_tokens=60)
        for s in range(3)
    ]
    for ids, _ in run(reqs, output="random").values():
        text = TOK.decode(ids)
        for call in re.findall(r"<function=add>(.*?)</function>", text, re.S):
            assert set(json.loads(call)) == {"a", "b"}


@pytest.mark.parametrize("name", ["person", "nested", "tree"])
def test_ends_within_the_budget(name) -> None:
    """A budget a little over the shortest finish still ends in valid JSON; one under it ends
    with length."""
    schema = SCHEMAS[name]
    compiler = GrammarCompiler(TOK)
    grammar = compiler.compile("json_schema", json.dumps(schema)).result()
    compiler.close()
    shortest = finish_length(grammar.template, TokenTables.build(TOK), 1000)
    assert shortest is not None
    for budget in (shortest + 6, shortest + 20):
        reqs = [
            _request(
                f"r{s}", json_schema=json.dumps(schema), sampling_seed=s, max_new_tokens=budget
            )
            for s in range(4)
        ]
        for ids, finish in run(reqs).values():
            assert finish == "stop" and len(ids) <= budget
            jsonschema.validate(json.loads(TOK.decode(ids)), schema)
    short = run([_request("r", json_schema=json.dumps(schema), max_new_tokens=shortest - 1)])
    assert short["r"][1] == "length"


def test_deterministic_for_a_seed() -> None:
    schema = json.dumps(SCHEMAS["person"])

    def texts(seed: int) -> list[str]:
        reqs = [_request(f"r{k}", json_schema=schema, sampling_seed=seed + k) for k in range(3)]
        out = run(reqs)  # (in the order the requests finished, which the load may change)
        return [TOK.decode(out[f"r{k}"][0]) for k in range(3)]

    assert texts(7) == texts(7)
    assert texts(7) != texts(8)


def test_closed_objects() -> None:
    """Objects that list properties take no others (as vLLM's disable_additional_properties);
    the output still validates against the schema as sent."""
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}
    assert closed_objects(schema) == {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {}, "additionalProperties": False}},
        "additionalProperties": False,
    }
    assert closed_objects({"type": "object"}) == {"type": "object"}
    assert closed_objects({"additionalProperties": True, "properties": {}})["additionalProperties"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"json_schema": '{"$ref": "#/nope"}'}, "json_schema"),
        ({"ebnf": "root ::= ("}, "ebnf"),
        ({"regex": "a{2,1}"}, "regex"),
        ({"structural_tag": '{"type": "structural_tag", "format": {}}'}, "structural_tag"),
    ],
)
def test_a_refused_grammar_is_a_validation_error_naming_the_field(params, field) -> None:
    engine = SyntheticEngine(TOK)

    async def main() -> None:
        with pytest.raises(ValidationError) as exc:
            await check_grammar(engine, SamplingParams(**params))
        assert exc.value.param == field and "llguidance" in exc.value.detail
        await engine.close()

    asyncio.run(main())
    # Submitted without the check, the request ends with an engine error (no hang).
    got = run([_request("r", **params)])
    assert got["r"][1].startswith("error: ")


def test_compiled_in_a_worker_and_cached() -> None:
    threads: list[str] = []
    compiler = GrammarCompiler(
        TOK, capacity=2, prepare=lambda g: threads.append(threading.current_thread().name)
    )
    try:
        a = compiler.compile("regex", "a+").result()
        assert compiler.compile("regex", "a+").result() is a
        assert compiler.stats["hits"] == 1 and threads == ["tokenwire-grammar_0"]
        compiler.compile("regex", "b+").result()
        compiler.compile("regex", "c+").result()
        assert len(compiler) == 2  # bounded: "a+" went first
        assert compiler.compile("regex", "a+").result() is not a
        bad = compiler.compile("regex", "(")
        assert isinstance(bad.exception(), ValidationError)
        assert compiler.compile("regex", "(") is bad  # a refusal is kept too
    finally:
        compiler.close()


def test_a_request_whose_grammar_compiles_is_not_stepped_meanwhile() -> None:
    """While one request's grammar compiles, the others are stepped; it runs once ready."""
    gate = threading.Event()
    engine = SyntheticEngine(TOK, SyntheticConfig(output="echo"))
    engine._grammars = GrammarCompiler(
        TOK, prepare=lambda g: (gate.wait(10), engine._prepare_grammar(g))
    )

    async def main() -> dict:
        seen: dict[str, list[int]] = {}
        plain_done = asyncio.Event()

        def output(frame) -> None:
            for ev in decode_batch_frame(frame).events:
                seen.setdefault(ev.rid, []).extend(ev.token_ids.tolist())
                if ev.rid == "plain" and ev.finish_reason is not None:
                    plain_done.set()

        await engine.start(output)
        engine.submit(_request("json", json_schema=json.dumps(SCHEMAS["weather"])))
        engine.submit(_request("plain", "one two three four", max_new_tokens=4))
        await asyncio.wait_for(plain_done.wait(), 10)
        assert "json" not in seen and engine.running == 0
        gate.set()
        for _ in range(500):
            await asyncio.sleep(0.01)
            if engine.stats["finished"] == 2:
                break
        await engine.close()
        return seen

    seen = asyncio.run(main())
    jsonschema.validate(json.loads(TOK.decode(seen["json"])), SCHEMAS["weather"])


@pytest.mark.parametrize("output", ["replay", "random"])
def test_free_strings_decode_to_whole_characters(output) -> None:
    """Every string the decoder writes is whole UTF-8 characters: none starts with U+FFFD (on
    main, a string's first word stripped of its space could become the literal U+FFFD token
    when that word ended inside a character: 3 of 200 seeds)."""
    schema = json.dumps(SCHEMAS["weather"])
    reqs = [_request(f"r{s}", json_schema=schema, sampling_seed=s) for s in range(200)]
    for rid, (ids, _) in run(reqs, output=output, step_time=0).items():
        text = TOK.decode(ids)
        assert "\ufffd" not in text, (rid, text)
        json.loads(text)
