"""What constrained decoding costs the synthetic engine: per token beside the unconstrained
engine, and per compile, measured in one run on the bundled Qwen3 tokenizer (151k vocabulary).

    python bench/grammar.py [--requests 64] [--rounds 3]

Per token: the engine (``step_time`` 0) runs ``--requests`` requests at once to their ends, and
the wall time is divided by the tokens it produced (best of ``--rounds``); the constrained rows
run with their grammar already compiled (the cache), so they show the per-token work: llguidance's
checks and masks and the choice among allowed tokens. Per compile: a fresh ``GrammarCompiler``
(llguidance's grammar, its shortest finish), after the tokenizer's one-time llguidance build,
which is reported on its own. The library comparison (llguidance beside xgrammar) is
``bench/grammar_libraries.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from tokenwire.engine import EngineRequest
from tokenwire.engine.grammar import GrammarCompiler, ll_tokenizer
from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.messages.frames import decode_batch_frame
from tokenwire.messages.sampling import SamplingParams
from tokenwire.tokenizer import Tokenizer

FORECAST = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "country": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "high": {"type": "number"},
                    "rain": {"type": "boolean"},
                },
                "required": ["name", "high", "rain"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 3,
        },
        "summary": {"type": "string"},
        "confidence": {"enum": ["low", "medium", "high"]},
    },
    "required": ["city", "country", "unit", "days", "summary", "confidence"],
    "additionalProperties": False,
}
TOOL_CALLS = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "properties": {
            "name": {"enum": ["add"]},
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
        "required": ["name", "parameters"],
    },
}
WORKLOADS: list[tuple[str, dict]] = [
    ("unconstrained (replay)", {}),
    ("json_schema: forecast (Pydantic-like)", {"json_schema": json.dumps(FORECAST)}),
    ("json_schema: tool_choice required", {"json_schema": json.dumps(TOOL_CALLS)}),
    ("json_object", {"json_schema": '{"type":"object"}'}),
    ("regex: [A-Z][a-z]+ ( [a-z]+){3,12}\\.", {"regex": r"[A-Z][a-z]+( [a-z]+){3,12}\."}),
    ("choice (3)", {"regex": "(?:positive|negative|neutral)"}),
]


async def _run(engine: SyntheticEngine, requests: list[EngineRequest]) -> tuple[float, int]:
    """Seconds to run ``requests`` to their ends, and the tokens they produced."""
    left = {r.rid for r in requests}
    tokens = 0
    done = asyncio.Event()

    def output(frame) -> None:
        nonlocal tokens
        for ev in decode_batch_frame(frame).events:
            tokens += len(ev.token_ids)
            if ev.finish_reason is not None:
                left.discard(ev.rid)
        if not left:
            done.set()

    await engine.start(output)
    t0 = time.perf_counter()
    for r in requests:
        engine.submit(r)
    await done.wait()
    elapsed = time.perf_counter() - t0
    engine._grammars = None  # the compiler is shared between rounds: closed at the end
    await engine.close()
    return elapsed, tokens


def per_token(tok: Tokenizer, grammar: dict, n: int, rounds: int, compiler) -> tuple[float, int]:
    """Best µs per generated token over ``rounds``, and the tokens of one round."""
    best, count = float("inf"), 0
    for r in range(rounds):
        engine = SyntheticEngine(tok, SyntheticConfig(step_time=0.0, max_batch_size=n))
        engine._grammars = compiler  # compiled already: the per-token work alone
        reqs = [
            EngineRequest(
                f"r{r}-{k}",
                tok.encode(f"question {k}", add_special_tokens=False),
                SamplingParams(max_new_tokens=256, sampling_seed=k, **grammar).normalize(tok),
            )
            for k in range(n)
        ]
        elapsed, count = asyncio.run(_run(engine, reqs))
        best = min(best, elapsed / count * 1e6)
    return best, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tok = Tokenizer.default()
    t0 = time.perf_counter()
    ll_tokenizer(tok)
    build = time.perf_counter() - t0
    probe = SyntheticEngine(tok)
    t0 = time.perf_counter()
    probe.grammars.compile("regex", "x").result()  # the engine's token tables, once
    tables = time.perf_counter() - t0
    compiler = probe.grammars
    print(
        f"llguidance {__import__('llguidance').__version__}; tokenizer build (once per "
        f"tokenizer) {build * 1e3:.0f} ms; the engine's token tables (once) {tables * 1e3:.0f} ms"
    )
    print(f"\n{args.requests} requests at once, max_tokens 256, best of {args.rounds} rounds\n")
    print("| workload | compile (cold) | cached | tokens | µs / token | × unconstrained |")
    print("|---|---:|---:|---:|---:|---:|")
    base = None
    for name, grammar in WORKLOADS:
        cold = hit = "-"
        if grammar:
            ((kind, text),) = grammar.items()
            fresh = GrammarCompiler(tok, prepare=probe._prepare_grammar)
            t0 = time.perf_counter()
            fresh.compile(kind, text).result()
            cold = f"{(time.perf_counter() - t0) * 1e3:.1f} ms"
            t0 = time.perf_counter()
            fresh.compile(kind, text).result()
            hit = f"{(time.perf_counter() - t0) * 1e6:.0f} µs"
            fresh.close()
            compiler.compile(kind, text).result()
        us, count = per_token(tok, grammar, args.requests, args.rounds, compiler)
        base = base or us
        print(f"| {name} | {cold} | {hit} | {count} | {us:.1f} | {us / base:.1f} |")
    compiler.close()


if __name__ == "__main__":
    main()
