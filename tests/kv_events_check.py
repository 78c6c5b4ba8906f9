"""Run by vLLM's own Python (the vLLM CPU environment), never imported by tokenwire's tests:
decodes two engines' recorded KV-cache event batches (``test_kv_events_fidelity.py``) with
vLLM's ``KVEventBatch`` and says, as JSON on stdout, how they differ.

    python kv_events_check.py REAL_RECORD MOCK_RECORD

Each batch must decode with vLLM's type and re-encode to the same bytes (no field missing, none
extra, each in vLLM's order and of vLLM's type). Then, step by step of the script both engines
ran: the events of the steps whose blocks are the prompts' must be equal but for the time
stamps; the others (blocks an output filled, evictions) must agree in kinds, fields and block
counts, and the blocks evicted that were prompts' must be the same ones.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

#: Steps whose events follow from the prompts alone (equal in both engines).
EXACT = {"prompt", "hit", "salted", "adapter", "after-reset"}

_decoder = msgspec.msgpack.Decoder(KVEventBatch)
_KINDS = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
_encoder = msgspec.msgpack.Encoder()


def fields(event: Any) -> dict[str, Any]:
    out = {"kind": type(event).__name__}
    for f in event.__struct_fields__:
        out[f] = getattr(event, f)
    return out


def shape(event: Any) -> Any:
    d = fields(event)
    return {
        k: (
            len(v)
            if isinstance(v, list) and k in ("block_hashes", "token_ids")
            else type(v).__name__
        )
        for k, v in d.items()
    } | {"kind": d["kind"]}


def main() -> int:
    errors: list[str] = []
    records = []
    for path in sys.argv[1:3]:
        with open(path, "rb") as f:
            records.append(msgspec.msgpack.decode(f.read()))
    steps: list[dict[str, list]] = []
    prompt_blocks: list[set] = []
    for name, rec in zip(("real", "mock"), records):
        by_step: dict[str, list] = {}
        stored: set = set()
        for step, seq, payload in rec["batches"]:
            try:
                batch = _decoder.decode(payload)
            except msgspec.DecodeError as exc:
                errors.append(f"{name} batch {seq}: does not decode as KVEventBatch: {exc}")
                continue
            again = _encoder.encode(batch)
            if again != payload:
                was, now = msgspec.msgpack.decode(payload), msgspec.msgpack.decode(again)
                errors.append(
                    f"{name} batch {seq}: re-encodes differently: {was!r:.600} != {now!r:.600}"
                )
            if batch.data_parallel_rank != 0:
                errors.append(f"{name} batch {seq}: data_parallel_rank {batch.data_parallel_rank}")
            for event in batch.events:
                if not isinstance(event, (BlockStored, BlockRemoved, AllBlocksCleared)):
                    errors.append(f"{name} batch {seq}: an event of kind {type(event)}")
                if isinstance(event, BlockStored) and step in EXACT:
                    stored.update(event.block_hashes)
            by_step.setdefault(step, []).extend(batch.events)
        steps.append(by_step)
        prompt_blocks.append(stored)
    real, mock = steps
    for step in sorted(set(real) | set(mock)):
        a, b = real.get(step, []), mock.get(step, [])
        if step in EXACT:
            fa = [fields(e) for e in a]
            fb = [fields(e) for e in b]
            if fa != fb:
                errors.append(f"step {step}: events differ:\nreal {fa!r:.1500}\nmock {fb!r:.1500}")
            continue
        sa = sorted(json.dumps(shape(e), sort_keys=True) for e in a)
        sb = sorted(json.dumps(shape(e), sort_keys=True) for e in b)
        if sa != sb:
            only_a = sorted(set(sa) - set(sb))
            only_b = sorted(set(sb) - set(sa))
            kinds = [
                {k: sum(1 for e in events if type(e).__name__ == k) for k in _KINDS}
                for events in (a, b)
            ]
            errors.append(
                f"step {step}: event shapes differ: counts real {kinds[0]} mock {kinds[1]}; "
                f"only real {only_a}; only mock {only_b}"
            )
        removed = [
            {h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes} & known
            for events, known in ((a, prompt_blocks[0]), (b, prompt_blocks[1]))
        ]
        if removed[0] != removed[1]:
            errors.append(f"step {step}: prompt blocks evicted differ: {removed}")
    if records[0]["ready_kv"] is None or records[1]["ready_kv"] is None:
        errors.append("a ready response names no KV events publisher")
    else:
        a, b = dict(records[0]["ready_kv"]), dict(records[1]["ready_kv"])
        for d in (a, b):  # (each engine had its own ports)
            d.pop("endpoint")
            d.pop("replay_endpoint")
        if a != b:
            errors.append(f"the ready responses' kv_events_config differ: {a} != {b}")
    counts = [sum(1 for _ in r["batches"]) for r in records]
    print(json.dumps({"errors": errors, "batches": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
