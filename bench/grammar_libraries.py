"""llguidance beside xgrammar (the two grammar engines vLLM uses) on the bundled Qwen3 tokenizer
(151,936 ids): the tokenizer build, the compile of each grammar, and the per-token cost (the
mask, then the token taken) along a valid output; one thread each, measured in one run.

    python -P bench/grammar_libraries.py

It needs both libraries and ``transformers`` (xgrammar's tokenizer import), which tokenwire does
not: run it with the vLLM CPU environment's interpreter (``python scripts/vllm_cpu_env.py
--check`` prints it; ``-P`` keeps ``bench/`` off the import path, where ``regex.py`` would shadow
the ``regex`` package). It imports no tokenwire code; it reads the tokenizer tokenwire bundles.
"""

from __future__ import annotations

import importlib.metadata
import json
import lzma
import statistics
import time
from pathlib import Path

import llguidance
import llguidance.numpy as llnp
import tokenizers
import transformers
import xgrammar as xgr

DATA = Path(__file__).resolve().parent.parent / "src" / "tokenwire" / "_data" / "qwen3"
VOCAB = 151_936
EOS = 151_645
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

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
        },
        "summary": {"type": "string"},
    },
    "required": ["city", "country", "unit", "days", "summary"],
    "additionalProperties": False,
}
FORECAST_TEXT = json.dumps(
    {
        "city": "Paris",
        "country": "France",
        "unit": "celsius",
        "days": [
            {"name": "Monday", "high": 21.5, "rain": False},
            {"name": "Tuesday", "high": 18, "rain": True},
        ],
        "summary": "A mild week with a little rain on Tuesday afternoon, then sun again.",
    }
)
WIDE = {
    "type": "object",
    "properties": {f"field_{i}": {"type": ["string", "integer", "null"]} for i in range(60)},
    "required": [f"field_{i}" for i in range(60)],
    "additionalProperties": False,
}
WIDE_TEXT = json.dumps({f"field_{i}": (i if i % 2 else f"v{i}") for i in range(60)})
WORKLOADS = [
    ("json_schema: forecast", "json", json.dumps(FORECAST), FORECAST_TEXT),
    ("json_schema: 60 fields", "json", json.dumps(WIDE), WIDE_TEXT),
    ("json_object", "json", '{"type": "object"}', '{"a": [1, 2, {"b": "c"}], "d": null}'),
    ("regex: phone", "regex", r"\(\d{3}\) \d{3}-\d{4}", "(555) 123-4567"),
]


def load() -> tuple[str, transformers.PreTrainedTokenizerFast]:
    text = lzma.decompress((DATA / "tokenizer.json.xz").read_bytes()).decode("utf-8")
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer.from_str(text), eos_token="<|im_end|>"
    )
    return text, hf


def timed(fn, runs: int = 3) -> tuple[float, object]:
    """Median seconds of ``runs`` calls, and the last result."""
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    text, hf = load()
    t_ll, lt = timed(lambda: llguidance.LLTokenizer(text, n_vocab=VOCAB, eos_token=EOS), 1)
    t_xg, info = timed(lambda: xgr.TokenizerInfo.from_huggingface(hf, vocab_size=VOCAB), 1)
    versions = {name: importlib.metadata.version(name) for name in ("llguidance", "xgrammar")}
    print(", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"tokenizer build: llguidance {t_ll * 1e3:.0f} ms, xgrammar {t_xg * 1e3:.0f} ms\n")
    print(
        "| grammar | tokens | llguidance compile | xgrammar compile | llguidance µs/token "
        "| xgrammar µs/token |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, kind, spec, sample in WORKLOADS:
        ids = hf.encode(sample, add_special_tokens=False) + [EOS]
        if kind == "json":
            source = llguidance.LLMatcher.grammar_from_json_schema(spec, defaults=JSON_OPTIONS)
        else:
            source = llguidance.LLMatcher.grammar_from_regex(spec)
        c_ll, _ = timed(lambda source=source: llguidance.LLMatcher(lt, source, log_level=0))

        def xg_compile(kind=kind, spec=spec):
            compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            if kind == "json":
                return compiler.compile_json_schema(spec, any_whitespace=False)
            return compiler.compile_regex(spec)

        c_xg, compiled = timed(xg_compile)

        def walk_ll(source=source, ids=ids) -> float:
            m = llguidance.LLMatcher(lt, source, log_level=0)
            mask = llnp.allocate_token_bitmask(1, VOCAB)
            t0 = time.perf_counter()
            for t in ids:
                llnp.fill_next_token_bitmask(m, mask)
                assert m.consume_token(t)
            return (time.perf_counter() - t0) / len(ids)

        def walk_xg(compiled=compiled, ids=ids) -> float:
            m = xgr.GrammarMatcher(compiled)
            mask = xgr.allocate_token_bitmask(1, VOCAB)
            t0 = time.perf_counter()
            for t in ids:
                m.fill_next_token_bitmask(mask)
                assert m.accept_token(t)
            return (time.perf_counter() - t0) / len(ids)

        p_ll = min(walk_ll() for _ in range(3))
        p_xg = min(walk_xg() for _ in range(3))
        print(
            f"| {name} | {len(ids)} | {c_ll * 1e3:.1f} ms | {c_xg * 1e3:.1f} ms "
            f"| {p_ll * 1e6:.1f} | {p_xg * 1e6:.1f} |"
        )


if __name__ == "__main__":
    main()
