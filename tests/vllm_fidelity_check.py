"""Run by vLLM's own Python (the vLLM CPU environment), never imported by tokenwire's tests:
decodes two engines' recorded messages (``vllm_wire.Record``) with vLLM's own message types and
says, as JSON on stdout, how they differ.

    python vllm_fidelity_check.py REAL_RECORD MOCK_RECORD

For each engine, each message must decode with vLLM's ``MsgpackDecoder`` and re-encode with its
``MsgpackEncoder`` to the same msgpack (so no field is missing, none extra, every value of the
type vLLM writes); then, step by step of the script both engines ran, the two must agree on the
shapes of their messages and outputs (which fields are set, with what types), on each request's
outputs (tokens per output, finish reason, stop reason, events, prefill stats, logprob array
shapes and frames), on prefix-cache accounting, on the stats-only message after the last request
finishes, and on every utility call's answer.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from typing import Any

import msgspec
import numpy as np
import torch
from vllm.v1.engine import EngineCoreOutputs, EngineCoreReadyResponse
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

#: Steps whose request outputs race with the script (an abort lands after some outputs): their
#: output shapes need only be among those the real engine sent somewhere.
RACY_STEPS = {"abort"}


def plain(buf: bytes) -> Any:
    """A message as plain msgpack (raw-view extensions as their bytes)."""
    return msgspec.msgpack.decode(buf, ext_hook=lambda code, data: ("ext", code, bytes(data)))


def sig(v: Any) -> Any:
    """The shape of a decoded value: types, struct fields, map keys (not values)."""
    if v is None:
        return "nil"
    if isinstance(v, enum.Enum):
        return type(v).__name__
    if isinstance(v, (bool, int, float, str, bytes)):
        return type(v).__name__
    if isinstance(v, np.ndarray):
        return f"ndarray[{v.dtype.str},{v.ndim}]"
    if isinstance(v, torch.Tensor):
        return f"tensor[{v.dtype},{v.ndim}]"
    if hasattr(v, "_fields"):  # NamedTuple
        return [type(v).__name__, [[f, sig(getattr(v, f))] for f in v._fields]]
    if isinstance(v, msgspec.Struct):
        return [type(v).__name__, [[f, sig(getattr(v, f))] for f in v.__struct_fields__]]
    if dataclasses.is_dataclass(v):
        fields = dataclasses.fields(v)
        return [type(v).__name__, [[f.name, sig(getattr(v, f.name))] for f in fields]]
    if isinstance(v, dict):
        return ["dict", sorted([str(k), sig(x)] for k, x in v.items())]
    if isinstance(v, (list, tuple, set, frozenset)):
        return ["seq", sorted({json.dumps(sig(x)) for x in v})]
    return type(v).__name__


def key(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


class Engine:
    """One engine's record, decoded with vLLM's types."""

    def __init__(self, path: str, errors: list[str], name: str) -> None:
        self.name = name
        self.errors = errors
        with open(path, "rb") as f:
            rec = msgspec.msgpack.decode(f.read())
        self.hello = plain(rec["hello"])
        self.ready = plain(rec["ready"])
        self.ready_raw = plain(rec["ready_response"])
        self.calls = {int(k): v for k, v in rec["calls"].items()}
        try:
            self.ready_typed = msgspec.msgpack.decode(
                rec["ready_response"], type=EngineCoreReadyResponse
            )
        except msgspec.MsgspecError as exc:
            self.error(f"ready response does not decode as EngineCoreReadyResponse: {exc}")
            self.ready_typed = None
        wanted = {f.name for f in dataclasses.fields(EngineCoreReadyResponse)}
        got = set(self.ready_raw)
        if got != wanted:
            self.error(
                f"ready response fields differ from vLLM's: missing {sorted(wanted - got)}, "
                f"extra {sorted(got - wanted)}"
            )
        #: (step, typed message, frame count)
        self.messages: list[tuple[str, EngineCoreOutputs, int]] = []
        decoder = MsgpackDecoder(EngineCoreOutputs)
        encoder = MsgpackEncoder()
        for step, frames in rec["outputs"]:
            try:
                msg = decoder.decode(frames)
            except Exception as exc:  # vLLM's decoder raises several kinds
                self.error(
                    f"{step}: a message vLLM cannot decode ({exc}): {plain(frames[0])!r:.300}"
                )
                continue
            again = encoder.encode(msg)
            if plain(again[0]) != plain(frames[0]) or [bytes(b) for b in again[1:]] != frames[1:]:
                self.error(
                    f"{step}: a message is not what vLLM's encoder writes for it:\n"
                    f"  sent    {plain(frames[0])!r:.600}\n  vLLM's  {plain(again[0])!r:.600}"
                )
            self.messages.append((step, msg, len(frames)))

    def error(self, line: str) -> None:
        self.errors.append(f"{self.name}: {line}")

    def steps(self) -> list[str]:
        return list(dict.fromkeys(step for step, _, _ in self.messages))

    def shapes(self, step: str) -> tuple[set[str], set[str]]:
        """The step's message shapes (outputs as set or not) and output shapes."""
        messages, outputs = set(), set()
        for s, msg, _ in self.messages:
            if s != step:
                continue
            outs = msg.outputs
            msg.outputs = []
            messages.add(key([sig(msg), bool(outs)]))
            msg.outputs = outs
            outputs.update(key(sig(o)) for o in outs)
        return messages, outputs

    def digest(self, step: str, *, racy: bool) -> dict[str, Any]:
        """What must agree between the engines in one step of the script."""
        reqs: dict[str, dict[str, Any]] = {}
        first_tokens: dict[str, int] = {}
        prefix = [0, 0]
        utility = {}
        last = None
        for s, msg, nframes in self.messages:
            if s != step:
                continue
            last = msg
            st = msg.scheduler_stats
            if st is not None:
                prefix[0] += st.prefix_cache_stats.requests
                prefix[1] += st.prefix_cache_stats.queries
            if msg.utility_output is not None:
                out = msg.utility_output
                method = self.calls.get(out.call_id, "?")
                result = None if out.result is None else out.result.result
                utility[method] = [out.failure_message, result]
            for o in msg.outputs:
                r = reqs.setdefault(o.request_id, {"outputs": [], "events": []})
                if o.request_id not in first_tokens and o.new_token_ids:
                    first_tokens[o.request_id] = o.new_token_ids[0]
                lp = o.new_logprobs
                plp = o.new_prompt_logprobs_tensors
                r["outputs"].append(
                    [
                        len(o.new_token_ids),
                        nframes,
                        None if lp is None else [list(a.shape) for a in lp[:3]],
                        None if plp is None else [list(a.shape) for a in plp[:3]],
                    ]
                )
                if o.events:
                    r["events"].append([int(e.type) for e in o.events])
                    if not all(e.timestamp <= msg.timestamp for e in o.events):
                        self.error(f"{step}: an event after its message's timestamp")
                if o.prefill_stats is not None:
                    r["prefill"] = dataclasses.asdict(o.prefill_stats)
                if o.finish_reason is not None:
                    stop = o.stop_reason
                    if isinstance(stop, int):
                        stop = "first token" if stop == first_tokens.get(o.request_id) else stop
                    r["end"] = [int(o.finish_reason), stop]
        if racy:
            for r in reqs.values():
                r["outputs"] = r["outputs"][:1]
        ends_idle = (
            last is not None
            and not last.outputs
            and last.scheduler_stats is not None
            and last.scheduler_stats.num_running_reqs == 0
        )
        return {
            "requests": reqs,
            "prefix cache (requests, queries)": prefix,
            "ends with a stats-only message, nothing running": ends_idle,
            "utility": utility,
        }


def main() -> int:
    errors: list[str] = []
    real = Engine(sys.argv[1], errors, "real")
    mock = Engine(sys.argv[2], errors, "mock")
    if real.hello != mock.hello or real.ready != mock.ready:
        errors.append(f"handshake: real {real.hello} {real.ready}, mock {mock.hello} {mock.ready}")
    if real.ready_typed is not None and mock.ready_typed is not None:
        if sig(real.ready_typed) != sig(mock.ready_typed):
            errors.append(
                f"ready response: real {sig(real.ready_typed)}, mock {sig(mock.ready_typed)}"
            )
        for field in (
            "vllm_version",
            "world_size",
            "data_parallel_size",
            "supports_lora",
            "dp_stats_address",
            "enable_sleep_mode",
            "kv_events_config",
        ):
            a, b = getattr(real.ready_typed, field), getattr(mock.ready_typed, field)
            if a != b:
                errors.append(f"ready response {field}: real {a!r}, mock {b!r}")
    if real.steps() != mock.steps():
        errors.append(f"steps with messages: real {real.steps()}, mock {mock.steps()}")
    all_real_outputs: set[str] = set()
    for step in real.steps():
        all_real_outputs |= real.shapes(step)[1]
    for step in real.steps():
        racy = step in RACY_STEPS
        (rm, ro), (mm, mo) = real.shapes(step), mock.shapes(step)
        if rm != mm:
            errors.append(f"{step}: message shapes\n  real only {rm - mm}\n  mock only {mm - rm}")
        if (not mo <= all_real_outputs) if racy else ro != mo:
            errors.append(f"{step}: output shapes\n  real only {ro - mo}\n  mock only {mo - ro}")
        rd, md = real.digest(step, racy=racy), mock.digest(step, racy=racy)
        for what in rd:
            if rd[what] != md[what]:
                errors.append(f"{step}: {what}\n  real {rd[what]!r}\n  mock {md[what]!r}")
    print(json.dumps({"errors": errors, "messages": [len(real.messages), len(mock.messages)]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
