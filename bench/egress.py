"""Egress benchmark: decode frame -> detok shard -> items in sinks, per generated token.

    python bench/egress.py [tokenizer ...]     (default: qwen3 llama3)

The workload is the peers' ``common.py`` one (256-token prompts, 200 generated ids per request,
one token per request per step, LENGTH on the last step) with two stop strings per request that
never occur, so every token is stop-checked. Batch frames are encoded once up front; the timed
loop decodes each frame and runs the shard, which leaves the step's chunks in the sinks (sinks
are drained between steps, outside the timing, as a consumer would). A third row also times the
consumers taking every request's chunk (``drain``, which builds each ``Frame`` from the step's
columns), so the cost moved from the producer to the consumers is counted too; a fourth, the
egress of requests without stop strings, shows what the stop check and its hold-back cost.

The same run times the peers' baseline, HF ``DecodeStream`` stepped per request with a stop check
(``bench_baseline.py``'s ``decode+stop``), so the two land side by side; the JSON lines have the
peers' shape and can be added to their table (vLLM OutputProcessor 5.3 µs/token and SGLang's three
stages 22.7 µs/token at B=256, measured there).
Environment: BATCHES=64,256,1024  RUNS=3  CLOCK=wall (or ``thread``: this thread's CPU time,
steadier than wall time on a machine others load).
"""

from __future__ import annotations

import gc
import os
import sys
import time

from tokenizers.decoders import DecodeStream as HFDecodeStream

from tokenwire import SamplingParams
from tokenwire.detok.tables import decode_table
from tokenwire.messages.egress import EgressSink
from tokenwire.messages.frames import decode_batch_frame, encode_batch_frame
from tokenwire.shard import DetokShard

from workload import BATCHES, STEPS, STOP, load_tokenizer, record, table, workload

STOPS = [STOP, "<<END OF ANSWER>>"]  # two stop strings, neither in the corpus
_clock = time.thread_time if os.environ.get("CLOCK", "wall") == "thread" else time.perf_counter


def make_frames(work) -> list[bytes]:
    rids = [f"req-{j}" for j in range(len(work))]
    prompt = [len(p) for p, _ in work]
    frames = []
    for s in range(STEPS):
        finish = [{"type": "length", "length": STEPS} if s == STEPS - 1 else None] * len(work)
        header = [rids, finish, prompt, [1] * len(work)]
        frames.append(encode_batch_frame(header, [[g[s] for _, g in work]]))
    return frames


def run_tokenwire(tok, work, frames, take=False, stops=STOPS):
    shard = DetokShard()
    sinks = []
    for j, (p, _) in enumerate(work):
        sink = EgressSink(capacity=4)
        params = SamplingParams(stop=stops or None).normalize(tok)
        shard.register(f"req-{j}", sink, tok, p, params)
        sinks.append(sink)
    texts = [[] for _ in work]
    elapsed = 0.0
    gc.collect()
    for frame in frames:
        t0 = _clock()
        shard.on_frame(decode_batch_frame(frame))
        t1 = _clock()
        for out, sink in zip(texts, sinks):
            for item in sink.drain():
                out.append(item.event.text)
        if take:
            elapsed += _clock() - t1
        elapsed += t1 - t0
    return elapsed, ["".join(t) for t in texts]


def run_tokenwire_take(tok, work, frames):
    return run_tokenwire(tok, work, frames, take=True)


def run_tokenwire_no_stops(tok, work, frames):
    return run_tokenwire(tok, work, frames, stops=[])


def run_hf_baseline(tok, work, _frames):
    hf = tok.hf
    streams = [HFDecodeStream(ids=list(p), skip_special_tokens=True) for p, _ in work]
    gens = [g for _, g in work]
    full = [""] * len(work)
    stop = STOP
    ls = len(stop)
    elapsed = 0.0
    gc.collect()
    for s in range(STEPS):
        t0 = _clock()
        for i, (st, g) in enumerate(zip(streams, gens)):
            d = st.step(hf, g[s]) or ""
            if d:
                txt = full[i] + d
                full[i] = txt
                if txt.find(stop, len(txt) - len(d) - ls + 1) != -1:
                    pass  # would finish the request here
        elapsed += _clock() - t0
    return elapsed, full


def main() -> None:
    names = sys.argv[1:] or ["qwen3", "llama3"]
    batches = [int(b) for b in os.environ.get("BATCHES", ",".join(map(str, BATCHES))).split(",")]
    runs = int(os.environ.get("RUNS", "3"))
    for name in names:
        tok = load_tokenizer(name)
        decode_table(tok, True)
        rows = []
        for b in batches:
            work = workload(tok, b)
            frames = make_frames(work)
            expected = [tok.decode(g) for _, g in work]
            for label, fn in (
                ("HF DecodeStream + 1 stop (peers baseline)", run_hf_baseline),
                ("tokenwire egress: frame + shard + sinks, 2 stops", run_tokenwire),
                ("tokenwire egress + consumers taking every chunk", run_tokenwire_take),
                ("tokenwire egress, no stop strings", run_tokenwire_no_stops),
            ):
                fn(tok, work, frames)  # warm-up
                times, bad = [], 0
                for k in range(runs):
                    t, texts = fn(tok, work, frames)
                    times.append(t)
                    if k == 0:
                        bad = sum(x != e for x, e in zip(texts, expected))
                rec = record(label, b, times, {"mismatch": bad, "tok": name})
                rec["Mtok_per_s"] = round(1 / rec["us_per_token_median"], 2)
                rows.append(rec)
        table(
            rows,
            "HF DecodeStream + 1 stop (peers baseline)",
            f"{name}: egress µs per token (speed-up vs the HF baseline); "
            "Mtok/s = 1 / (µs per token)",
        )
        for r in rows:
            print(f"  {r['impl']} B={r['B']}: {r['Mtok_per_s']} M tokens/s")


if __name__ == "__main__":
    main()
