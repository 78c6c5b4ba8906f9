"""The pooling routes' answers, in vLLM's shapes (SGLang's for ``/encode``), from a job's outputs:
plain functions of the parsed request and the engine's arrays, columnar (a batch of vectors
becomes JSON numbers in one call, base64 from each vector's own buffer)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from tokenwire.pooling.vectors import (
    base64_vector,
    cosine_rows,
    float_rows,
    maxsim,
    to_dtype_bytes,
)
from tokenwire.server.http import encode
from tokenwire.server.pooling.requests import PoolingCall

__all__ = ["answer", "usage"]

JSON = [(b"content-type", b"application/json")]


def usage(prompt_tokens: int) -> dict[str, Any]:
    """vLLM's ``UsageInfo`` of a pooling request: its inputs' tokens."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def _vectors(call: PoolingCall, outputs: Sequence[np.ndarray]) -> list[Any]:
    enc = call.encoding
    if enc.format == "base64":
        return [base64_vector(o, enc.embed_dtype, enc.endianness) for o in outputs]
    return float_rows(outputs)


def _listing(call: PoolingCall, items: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    plan = call.plan
    return {
        "id": call.response_id,
        "object": "list",
        "created": plan.created,
        "model": plan.model,
        "data": items,
        "usage": usage(tokens),
    }


def _binary(call: PoolingCall, outputs: Sequence[np.ndarray]) -> tuple[bytes, list]:
    """vLLM's ``bytes`` / ``bytes_only`` answer: the vectors' bytes one after another, and
    (``bytes``) a ``metadata`` header saying where each is."""
    enc = call.encoding
    chunks = [to_dtype_bytes(o, enc.embed_dtype, enc.endianness) for o in outputs]
    body = b"".join(c.tobytes() for c in chunks)
    headers = [(b"content-type", b"application/octet-stream")]
    if enc.format == "bytes":
        items, at = [], 0
        for i, (o, c) in enumerate(zip(outputs, chunks)):
            items.append(
                {
                    "index": i,
                    "embed_dtype": enc.embed_dtype,
                    "endianness": enc.endianness,
                    "start": at,
                    "end": at + c.nbytes,
                    "shape": list(o.shape),
                }
            )
            at += c.nbytes
        tokens = call.plan.prompt_tokens
        meta = {
            "id": call.response_id,
            "created": call.plan.created,
            "model": call.plan.model,
            "data": items,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        headers.append((b"metadata", json.dumps(meta).encode()))
    return body, headers


def answer(
    call: PoolingCall, outputs: Sequence[np.ndarray], started: float = 0.0
) -> tuple[bytes, list]:
    """The response body and headers for ``call``, its outputs in the order of its plan's
    prompts."""
    route = call.route
    if route in ("embeddings", "pooling") and call.encoding.format in ("bytes", "bytes_only"):
        return _binary(call, outputs)
    if route == "embeddings":
        vectors = _vectors(call, outputs)
        items = [{"index": i, "object": "embedding", "embedding": v} for i, v in enumerate(vectors)]
        return encode(_listing(call, items, call.plan.prompt_tokens)), JSON
    if route == "pooling":
        vectors = _vectors(call, outputs)
        items = [{"index": i, "object": "pooling", "data": v} for i, v in enumerate(vectors)]
        return encode(_listing(call, items, call.plan.prompt_tokens)), JSON
    if route == "classify":
        return encode(_classified(call, outputs)), JSON
    if route in ("score", "rerank"):
        scores = _scores(call, outputs)
        if route == "score":
            items = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
            return encode(_listing(call, items, call.plan.prompt_tokens)), JSON
        return encode(_reranked(call, scores)), JSON
    if route == "encode":
        return encode(_encoded(call, outputs, started)), JSON
    raise AssertionError(f"no answer for route {route!r}")


def _classified(call: PoolingCall, outputs: Sequence[np.ndarray]) -> dict[str, Any]:
    rows = float_rows([np.asarray(o).reshape(-1) for o in outputs])
    items = []
    for i, (out, probs) in enumerate(zip(outputs, rows)):
        best = int(np.argmax(out)) if out.size else 0
        items.append(
            {
                "index": i,
                "label": call.id2label.get(best),
                "probs": probs,
                "num_classes": len(probs),
            }
        )
    return _listing(call, items, call.plan.prompt_tokens)


def _scores(call: PoolingCall, outputs: Sequence[np.ndarray]) -> list[float]:
    """Each pair's score: the classifier's one output (cross-encoder), the cosine of the two
    embeddings (bi-encoder) or their MaxSim (late interaction)."""
    if call.scoring == "cross-encoder":
        return [float(np.asarray(o).reshape(-1)[0]) for o in outputs]
    nq = call.n_queries
    queries, docs = outputs[:nq], outputs[nq:]
    if call.scoring == "late-interaction":
        qs = list(queries) * len(docs) if len(queries) == 1 else list(queries)
        return [maxsim(q, d) for q, d in zip(qs, docs)]
    q = np.stack(queries) if len(queries) > 1 else queries[0]
    return cosine_rows(q, np.stack(docs)).tolist()


def _reranked(call: PoolingCall, scores: list[float]) -> dict[str, Any]:
    results = []
    for i, score in enumerate(scores):
        item: dict[str, Any] = {"index": i}
        if call.return_documents:
            item["document"] = {"text": call.documents[i], "multi_modal": None}
        item["relevance_score"] = score
        results.append(item)
    results.sort(key=lambda r: r["relevance_score"], reverse=True)  # (stable: ties keep order)
    if 0 < call.top_n < len(results):
        results = results[: call.top_n]
    tokens = call.plan.prompt_tokens
    return {
        "id": call.response_id,
        "model": call.plan.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }


def _encoded(call: PoolingCall, outputs: Sequence[np.ndarray], started: float) -> Any:
    """SGLang's ``/encode`` answer: per input its embedding and ``meta_info`` (one object for
    one input, a list for a batch)."""
    latency = time.perf_counter() - started if started else 0.0
    rids = call.rids or []
    items = [
        {
            "embedding": vector,
            "meta_info": {
                "id": rids[i] if i < len(rids) else f"{call.plan.id}-{i}",
                "finish_reason": {"type": "length", "length": 0},
                "prompt_tokens": len(call.plan.prompts[i]),
                "e2e_latency": latency,
            },
        }
        for i, vector in enumerate(float_rows(outputs))
    ]
    return items if call.batch else items[0]
