"""The detok shard's step alone: µs of CPU per token of ``DetokShard.on_frame``.

    python bench/shard_step.py                      # C = 1, 64, 256, with and without a stop string
    CONCURRENCY=64 PROFILE=1 python bench/shard_step.py   # ... and cProfile's top functions

Every request streams to a sink whose direct consumer takes every chunk at once (as a
``DirectStream`` whose connection takes writes, less the formatting and the write), so what is
timed is the step itself: the batch decode, the step-wide stop check and hold-back, and the
delivery loop. Each step is a vLLM ``EngineCoreOutputs`` message's columns (``protocol.to_batch``),
every request one random plain token of the bundled Qwen3 tokenizer; the stop string is the chat
workload's ``"\\n\\nHuman:"``. The median and the best of ROUNDS rounds of STEPS steps each, after
a warm-up.

Environment: CONCURRENCY=1,64,256, STEPS=100, ROUNDS=9, PROFILE=0.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import time

import numpy as np

from tokenwire import SamplingParams, Tokenizer
from tokenwire.detok.tables import decode_table
from tokenwire.engine.vllm import protocol as wire
from tokenwire.messages.egress import EgressSink
from tokenwire.shard import DetokShard

STOP = "\n\nHuman:"
STEPS = int(os.environ.get("STEPS", "100"))
ROUNDS = int(os.environ.get("ROUNDS", "9"))


def _take(text: str, token_id: int, tokens: int) -> bool:
    return True


def frames(tok: Tokenizer, rids: list[str], n: int, seed: int = 0) -> list:
    """``n`` steps' decoded columns, as ``VllmEngine`` hands them to the shard."""
    rng = np.random.default_rng(seed)
    specials = tok.special_ids
    plain = np.array([i for i in range(tok.vocab_size) if i not in specials], dtype=np.int64)
    picks = plain[rng.integers(0, len(plain), size=(n, len(rids)))].tolist()
    prompt_lens = dict.fromkeys(rids, 3)
    max_tokens: dict[str, int | None] = dict.fromkeys(rids, None)
    out = []
    for row in picks:
        rows = [(rid, [row[j]], None, None) for j, rid in enumerate(rids)]
        msg = wire.decode_outputs(wire.encode_outputs(wire.outputs_for_step(0, rows)))
        out.append(wire.to_batch(msg.outputs, prompt_lens, max_tokens, None, [b""]).decoded)
    return out


def measure(tok: Tokenizer, c: int, stop: bool, profile: bool) -> tuple[float, float]:
    """(median, best) µs per token of the shard's step over ``c`` requests."""
    shard = DetokShard()
    rids = [f"r{k}" for k in range(c)]
    for rid in rids:
        sink = EgressSink()
        sink.set_direct(_take)
        params = SamplingParams(stop=[STOP] if stop else None)
        params.normalize(tok)
        shard.register(rid, sink, tok, [1, 2, 3], params)
    steps = frames(tok, rids, STEPS * (ROUNDS + 1) + (STEPS if profile else 0))
    for f in steps[:STEPS]:  # warm-up
        shard.on_frame(f)
    got = []
    for r in range(1, ROUNDS + 1):
        batch = steps[r * STEPS : (r + 1) * STEPS]
        t0 = time.thread_time_ns()
        for f in batch:
            shard.on_frame(f)
        got.append((time.thread_time_ns() - t0) / len(batch) / c / 1e3)
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for f in steps[(ROUNDS + 1) * STEPS :]:
            shard.on_frame(f)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    got.sort()
    return got[len(got) // 2], got[0]


def main() -> None:
    tok = Tokenizer.default()
    decode_table(tok, True)
    levels = [int(c) for c in os.environ.get("CONCURRENCY", "1,64,256").split(",")]
    profile = os.environ.get("PROFILE") == "1"
    print(f"µs of CPU per token of the shard's step (median and best of {ROUNDS} rounds)\n")
    print("| C | stop string | median | best |")
    print("|---:|---|---:|---:|")
    for c in levels:
        for stop in (True, False):
            med, best = measure(tok, c, stop, profile)
            print(f"| {c} | {'yes' if stop else 'no'} | {med:.3f} | {best:.3f} |", flush=True)


if __name__ == "__main__":
    main()
