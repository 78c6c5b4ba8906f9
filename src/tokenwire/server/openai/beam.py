"""Beam search (vLLM's ``use_beam_search``, ``n`` beams, ``length_penalty``), run in the frontend
over ordinary engine requests with logprobs, as vLLM runs it: each step every live beam asks the
engine for one token with ``2 * beam_width`` logprobs; the candidates (each beam's tokens with
their cumulative logprobs) keep the best ``beam_width``; a candidate ending in EOS is complete;
after ``max_tokens`` steps the complete and live beams are scored by cumulative logprob over
length ** ``length_penalty`` and the best ``n`` are the choices. Stop strings are not matched
(vLLM's beam search does not either); streaming is refused by name, as vLLM refuses it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenwire.messages.egress import Done
from tokenwire.messages.errors import ValidationError
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.messages.sampling import SamplingParams
from tokenwire.runtime import Plan, Runtime
from tokenwire.server.fields import flag
from tokenwire.server.logprobs import rows_from_extras
from tokenwire.server.streaming import Gathered, gather

__all__ = ["BEAM_FIELDS", "beam_request", "beam_search"]

#: The request fields beam search reads (vLLM's names).
BEAM_FIELDS = ("use_beam_search", "length_penalty")


def beam_request(body: Mapping[str, Any], n: int, stream: bool) -> tuple[int, float] | None:
    """``(beam width, length penalty)`` when the request asks for beam search, else None."""
    if not flag(body, "use_beam_search", False):
        return None
    if stream:
        raise ValidationError(
            "Streaming is not currently supported with beam search", param="stream"
        )
    penalty = body.get("length_penalty", 1.0)
    if penalty is None:
        penalty = 1.0
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)):
        raise ValidationError(
            f"length_penalty must be a number, got {penalty!r:.40}", param="length_penalty"
        )
    return n, float(penalty)


@dataclass
class _Beam:
    tokens: list[int] = field(default_factory=list)
    cum_logprob: float = 0.0
    #: Per token: the logprob row as the engine gave it for this beam's choice.
    steps: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
    finish: FinishReason | None = None


def _score(beam: _Beam, prompt_len: int, eos: int | None, penalty: float) -> float:
    """vLLM's ``get_beam_search_score``: the prompt counts in the length, a final EOS does not."""
    n = prompt_len + len(beam.tokens)
    if beam.tokens and beam.tokens[-1] == eos:
        n -= 1
    return beam.cum_logprob / (max(n, 1) ** penalty)


def _extras(steps: list[tuple[int, float, list[tuple[int, float]]]]) -> list[dict[str, Any]]:
    """A beam's logprob rows as the shard's ``extras`` (``out_lp`` / ``out_topk``)."""
    out = []
    for tid, lp, top in steps:
        out.append(
            {
                "out_lp": {
                    "values": np.array([lp], dtype=np.float32),
                    "ids": np.array([tid], dtype=np.int32),
                },
                "out_topk": {
                    "poslens": np.array([len(top)], dtype=np.int64),
                    "values": np.array([v for _, v in top], dtype=np.float32),
                    "ids": np.array([t for t, _ in top], dtype=np.int32),
                },
            }
        )
    return out


async def beam_search(rt: Runtime, plan: Plan) -> Gathered | tuple[int, Any]:
    """Every prompt's best ``n`` beams, as the items a non-streamed response is made of (or an
    error's status and body)."""
    assert plan.beam is not None
    width, penalty = plan.beam
    tok = rt.tokenizer
    eos = tok.eos_token_ids[0] if tok.eos_token_ids else None
    ignore_eos = plan.params.ignore_eos
    max_tokens = plan.params.max_new_tokens
    if max_tokens is None:
        max_tokens = 16
    step = SamplingParams(
        temperature=plan.params.temperature,
        max_new_tokens=1,
        logprobs=2 * width,
        ignore_eos=True,  # (EOS is a candidate like any other; the search ends its beam)
        skip_special_tokens=plan.params.skip_special_tokens,
    ).normalize(tok)
    out = Gathered(len(plan.prompts) * width)
    for p, prompt in enumerate(plan.prompts):
        beams = [_Beam()]
        completed: list[_Beam] = []
        for _ in range(max_tokens):
            sub = Plan(
                "completion",
                [prompt + b.tokens for b in beams],
                step,
                model=plan.model,
                priority=plan.priority,
                lora=plan.lora,
                cache_salt=plan.cache_salt,
                data_parallel_rank=plan.data_parallel_rank,
            )
            got = await gather(rt, await rt.admit(sub))  # (each step waits in the queue)
            if not isinstance(got, Gathered):
                return got
            candidates: list[tuple[float, int, _Beam, tuple[int, float, list]]] = []
            for i, beam in enumerate(beams):
                rows = rows_from_extras(got.extras[i], "out")
                if not rows:
                    continue
                tid, lp, top = rows[0]
                seen: set[int] = set()
                for t, v in [(tid, lp), *top]:
                    if t in seen:
                        continue
                    seen.add(t)
                    row = (t, v, top)
                    total = beam.cum_logprob + v
                    if t == eos and not ignore_eos:
                        done = _Beam(beam.tokens + [t], total, [*beam.steps, row])
                        done.finish = FinishReason.stop(t)
                        completed.append(done)
                    else:
                        candidates.append((total, t, beam, row))
            candidates.sort(key=lambda c: -c[0])
            beams = [
                _Beam(b.tokens + [t], total, [*b.steps, row])
                for total, t, b, row in candidates[:width]
            ]
            if not beams:
                break
        for b in beams:
            b.finish = FinishReason.length(max_tokens)
        best = sorted(
            completed + beams, key=lambda b: _score(b, len(prompt), eos, penalty), reverse=True
        )[:width]
        for k, beam in enumerate(best):
            index = p * width + k
            shown = beam.tokens[:-1] if beam.tokens and beam.tokens[-1] == eos else beam.tokens
            text = tok.decode(
                [t for t in shown if tok.is_known(t)], plan.params.skip_special_tokens
            )
            out.texts[index] = [text]
            out.ids[index] = list(beam.tokens)
            out.extras[index] = _extras(beam.steps) if plan.params.logprobs is not None else []
            out.finals[index] = Done(
                f"{plan.id}-beam-{index}",
                [],
                beam.finish,
                len(prompt),
                "",
                len(beam.tokens),
            )
    return out
