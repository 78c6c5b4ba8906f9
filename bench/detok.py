"""Detokenization benchmark: µs per generated token, the same token streams, one run, side by side.

    python bench/detok.py [tokenizer ...]      (default: llama3 qwen3 llama2 gemma3)

Rows: HF ``tokenizers.decoders.DecodeStream`` stepped from Python (prefilled with the prompt ids),
tokenwire's generic path, its fast per-token path, and its batch path (all streams of a step in one
call). Every row also checks that each stream's text equals ``decode(generated)``.
Environment: BATCHES=64,256,1024  RUNS=3.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from tokenizers.decoders import DecodeStream as HFDecodeStream

from tokenwire import DecodeBatch, DecodeStream
from tokenwire.detok.tables import decode_table

from workload import BATCHES, STEPS, load_tokenizer, record, table, workload


def prepare_hf(tok, work):
    """HF DecodeStream, prefilled with the prompt, stepped per request per token."""
    hf = tok.hf
    streams = [HFDecodeStream(ids=list(p), skip_special_tokens=True) for p, _ in work]
    gens = [g for _, g in work]
    steps: list[list[str | None]] = []

    def run():
        for s in range(STEPS):
            steps.append([st.step(hf, g[s]) for st, g in zip(streams, gens)])

    def texts():
        return ["".join(step[j] or "" for step in steps) for j in range(len(work))]

    return run, texts


def prepare_streams(tok, work, fast):
    """tokenwire DecodeStream per request, stepped per request per token."""
    streams = [DecodeStream(tok, p, fast=fast) for p, _ in work]
    gens = [g for _, g in work]

    def run():
        for s in range(STEPS):
            [st.push_token(g[s]) for st, g in zip(streams, gens)]

    def texts():
        return [st.output + st.flush() for st in streams]

    return run, texts


def prepare_batch(tok, work):
    """tokenwire DecodeBatch: every stream's token of a step in one call."""
    batch = DecodeBatch(tok)
    slots = np.array([batch.add(p) for p, _ in work], dtype=np.intp)
    columns = np.array([g for _, g in work], dtype=np.int32).T.copy()  # one row per step
    steps: list[list[str]] = []

    def run():
        for s in range(STEPS):
            steps.append(batch.step(slots, columns[s])[0])

    def texts():
        return [
            "".join(step[j] for step in steps) + batch.flush(int(slots[j]))
            for j in range(len(work))
        ]

    return run, texts


def measure(prepare, runs):
    """Time ``runs`` fresh runs (streams built outside the timing); check the first's text."""
    times = []
    first = None
    for k in range(runs + 1):
        run, texts = prepare()
        t = timed_once(run)
        if k == 0:
            first = texts()
        else:
            times.append(t)
    return times, first


def timed_once(fn) -> float:
    import gc
    import time

    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    names = sys.argv[1:] or ["llama3", "qwen3", "llama2", "gemma3"]
    batches = [int(b) for b in os.environ.get("BATCHES", ",".join(map(str, BATCHES))).split(",")]
    runs = int(os.environ.get("RUNS", "3"))
    for name in names:
        tok = load_tokenizer(name)
        decode_table(tok, True)
        tok.single_token_texts(True)
        rows = []
        for b in batches:
            work = workload(tok, b)
            expected = [tok.decode(g) for _, g in work]
            variants = [
                ("HF DecodeStream", lambda w=work, t=tok: prepare_hf(t, w)),
                ("tokenwire generic", lambda w=work, t=tok: prepare_streams(t, w, False)),
                ("tokenwire fast per-token", lambda w=work, t=tok: prepare_streams(t, w, True)),
                ("tokenwire batch", lambda w=work, t=tok: prepare_batch(t, w)),
            ]
            for label, prepare in variants:
                times, texts = measure(prepare, runs)
                bad = sum(t != e for t, e in zip(texts, expected))
                rows.append(record(label, b, times, {"mismatch": bad, "tok": name}))
        table(rows, "HF DecodeStream", f"{name}: µs per token (speed-up vs HF DecodeStream)")


if __name__ == "__main__":
    main()
