"""The pooling routes in front of real vLLM engines, differentially against stock ``vllm serve``
on the same tiny random BERT models (``scripts/vllm_cpu_env.py`` builds them): an embedding model
(sentence-transformers mean pooling, normalized, Matryoshka) and a one-label cross-encoder.
``/v1/embeddings`` (every input form, float, base64 and bytes, ``dimensions``, truncation),
``/pooling``, ``/classify``, ``/score`` and the rerank routes must give what stock vLLM gives:
vectors and scores to 1e-5, the same order, the same usage. The openai client, langchain's
``OpenAIEmbeddings`` and Cohere's SDK work against ``tokenwire serve --engine vllm``.

The four servers (stock and tokenwire, for each model) start at once and serve the whole module.
Without the vLLM environment these tests skip with that reason (CI's strict-skip flag turns a
skip into a failure)."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator

import cohere
import numpy as np
import openai
import pytest
from langchain_openai import OpenAIEmbeddings

from vllm_helpers import free_port, vllm_env, vllm_process_env

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

ENV = vllm_env()
if ENV is None:
    pytest.skip(
        "the vLLM CPU environment is not built: run `python scripts/vllm_cpu_env.py` "
        "(about 5 minutes and 3.5 GB, once)",
        allow_module_level=True,
    )

from test_vllm_real import Server, start_all  # noqa: E402

EMBED, RERANK = "tiny-embed", "tiny-rerank"
VLLM_ARGS = ["--enforce-eager", "--dtype", "float32"]
TEXTS = ["the cat sat on the mat", "Paris is the capital of France.", "a", "日本語のテキスト"]
QUERY = "what is the capital of france"
DOCUMENTS = [
    "stock markets fell sharply on monday",
    "paris is the capital of france",
    "the capital city has many museums and a long river",
]


def _stock(model: str, name: str, port: int) -> list[str]:
    return [ENV["vllm"], "serve", model, "--served-model-name", name, "--port", str(port)]


def _ours(model: str, name: str, port: int) -> list[str]:
    argv = [sys.executable, "-m", "tokenwire", "serve", "--engine", "vllm", "--model", model]
    argv += ["--vllm-command", ENV["vllm"], "--served-model-name", name, "--port", str(port)]
    return [*argv, *(f"--vllm-arg={a}" for a in VLLM_ARGS)]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Server]]:
    """Stock ``vllm serve`` and tokenwire, each over its own engine, for each model."""
    ports = [free_port() for _ in range(4)]
    env = vllm_process_env()
    specs = [
        ([*_stock(ENV["embed_model"], EMBED, ports[0]), *VLLM_ARGS], env, ports[0]),
        (_ours(ENV["embed_model"], EMBED, ports[1]), env, ports[1]),
        ([*_stock(ENV["rerank_model"], RERANK, ports[2]), *VLLM_ARGS], env, ports[2]),
        (_ours(ENV["rerank_model"], RERANK, ports[3]), env, ports[3]),
    ]
    with start_all(*specs) as (se, oe, sr, our):
        yield {"stock_embed": se, "ours_embed": oe, "stock_rerank": sr, "ours_rerank": our}


def both(servers: dict[str, Server], model: str, path: str, body: dict) -> tuple[dict, dict]:
    kind = "embed" if model == EMBED else "rerank"
    out = []
    for who in ("stock", "ours"):
        r = servers[f"{who}_{kind}"].http.post(servers[f"{who}_{kind}"].url + path, json=body)
        assert r.status_code == 200, f"{who} {path}: {r.text}"
        out.append(r.json())
    return out[0], out[1]


def _vectors(resp: dict, key: str = "embedding") -> list[np.ndarray]:
    out = []
    for item in resp["data"]:
        v = item[key]
        if isinstance(v, str):
            out.append(np.frombuffer(base64.b64decode(v), np.float32).astype(np.float64))
        else:
            out.append(np.asarray(v, np.float64))
    return out


def _same_listing(stock: dict, ours: dict, key: str = "embedding") -> None:
    assert ours.keys() == stock.keys()
    assert ours["object"] == stock["object"] and ours["model"] == stock["model"]
    assert ours["usage"] == stock["usage"]
    assert [d["index"] for d in ours["data"]] == [d["index"] for d in stock["data"]]
    assert [d.keys() for d in ours["data"]] == [d.keys() for d in stock["data"]]
    assert [d["object"] for d in ours["data"]] == [d["object"] for d in stock["data"]]
    a, b = _vectors(stock, key), _vectors(ours, key)
    assert [x.shape for x in a] == [y.shape for y in b]
    for x, y in zip(a, b):
        assert np.allclose(x, y, atol=1e-5, rtol=0), float(np.max(np.abs(x - y)))


EMBEDDING_BODIES = [
    {"input": TEXTS[0]},
    {"input": TEXTS},
    {"input": [101, 1996, 4937, 102]},
    {"input": [[101, 1996, 102], [101, 4937, 2938, 2006, 102]]},
    {"input": TEXTS, "dimensions": 32},
    {"input": TEXTS, "truncate_prompt_tokens": 4},
    {"input": TEXTS, "truncate_prompt_tokens": 4, "truncation_side": "left"},
    {"input": TEXTS[:2], "use_activation": False},
    {"input": TEXTS[:2], "add_special_tokens": False},
]


@pytest.mark.parametrize("encoding", ["float", "base64"])
@pytest.mark.parametrize(
    "body", EMBEDDING_BODIES, ids=[str(i) for i in range(len(EMBEDDING_BODIES))]
)
def test_embeddings_as_stock_vllm(servers, body, encoding):
    stock, ours = both(
        servers, EMBED, "/v1/embeddings", {"model": EMBED, **body, "encoding_format": encoding}
    )
    _same_listing(stock, ours)
    assert ours["id"].startswith("embd-")


def test_binary_embeddings_as_stock_vllm(servers):
    body = {"model": EMBED, "input": TEXTS, "encoding_format": "bytes"}
    got = [
        servers[who].http.post(servers[who].url + "/v1/embeddings", json=body)
        for who in ("stock_embed", "ours_embed")
    ]
    assert all(r.status_code == 200 for r in got)
    a, b = (np.frombuffer(r.content, np.float32) for r in got)
    assert a.shape == b.shape and np.allclose(a, b, atol=1e-5)
    meta = [json.loads(r.headers["metadata"]) for r in got]
    assert [m["data"] for m in meta[0:1]] == [m["data"] for m in meta[1:2]]
    assert meta[0]["usage"] == meta[1]["usage"]


def test_pooling_route_as_stock_vllm(servers):
    stock, ours = both(servers, EMBED, "/pooling", {"model": EMBED, "input": TEXTS})
    _same_listing(stock, ours, key="data")


def test_bi_encoder_scores_and_rerank_as_stock_vllm(servers):
    for body in (
        {"queries": QUERY, "documents": DOCUMENTS},
        {"queries": [QUERY, DOCUMENTS[0]], "documents": DOCUMENTS[1:]},
    ):
        stock, ours = both(servers, EMBED, "/v1/score", {"model": EMBED, **body})
        _same_scores(stock, ours)
    body = {"model": EMBED, "query": QUERY, "documents": DOCUMENTS}
    stock, ours = both(servers, EMBED, "/v1/rerank", body)
    _same_rerank(stock, ours)


def _same_scores(stock: dict, ours: dict) -> None:
    assert ours.keys() == stock.keys() and ours["usage"] == stock["usage"]
    assert [d["index"] for d in ours["data"]] == [d["index"] for d in stock["data"]]
    a = [d["score"] for d in stock["data"]]
    b = [d["score"] for d in ours["data"]]
    assert np.allclose(a, b, atol=1e-5, rtol=0), (a, b)


def _same_rerank(stock: dict, ours: dict) -> None:
    assert ours.keys() == stock.keys() and ours["usage"] == stock["usage"]
    assert [r["index"] for r in ours["results"]] == [r["index"] for r in stock["results"]]
    assert [r["document"] for r in ours["results"]] == [r["document"] for r in stock["results"]]
    a = [r["relevance_score"] for r in stock["results"]]
    b = [r["relevance_score"] for r in ours["results"]]
    assert np.allclose(a, b, atol=1e-5, rtol=0), (a, b)


CROSS_BODIES = [
    {"queries": QUERY, "documents": DOCUMENTS},
    {"queries": [QUERY, "museums"], "documents": DOCUMENTS[:2]},
    {"text_1": QUERY, "text_2": DOCUMENTS, "truncate_prompt_tokens": 9},
    {"queries": QUERY, "documents": DOCUMENTS, "max_tokens_per_doc": 3},
    {"queries": QUERY, "documents": DOCUMENTS, "max_tokens_per_query": 2},
    {"queries": QUERY, "documents": DOCUMENTS, "use_activation": False},
]


@pytest.mark.parametrize("body", CROSS_BODIES, ids=[str(i) for i in range(len(CROSS_BODIES))])
def test_cross_encoder_scores_as_stock_vllm(servers, body):
    stock, ours = both(servers, RERANK, "/score", {"model": RERANK, **body})
    _same_scores(stock, ours)


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_cross_encoder_rerank_as_stock_vllm(servers, path):
    for extra in ({}, {"top_n": 2}):
        body = {"model": RERANK, "query": QUERY, "documents": DOCUMENTS, **extra}
        stock, ours = both(servers, RERANK, path, body)
        _same_rerank(stock, ours)


def test_classify_as_stock_vllm(servers):
    stock, ours = both(servers, RERANK, "/classify", {"model": RERANK, "input": TEXTS})
    assert ours.keys() == stock.keys() and ours["usage"] == stock["usage"]
    for a, b in zip(stock["data"], ours["data"]):
        assert (a["index"], a["label"], a["num_classes"]) == (
            b["index"],
            b["label"],
            b["num_classes"],
        )
        assert np.allclose(a["probs"], b["probs"], atol=1e-5)


def test_refusals_as_stock_vllm(servers):
    for body in (
        {"model": EMBED, "input": "x", "dimensions": 48},  # not one of the Matryoshka sizes
        {"model": EMBED, "input": "x", "normalize": True},
        {"model": EMBED, "input": "x " * 400},  # past the context (256)
        {"model": EMBED, "input": "x", "truncate_prompt_tokens": 300},
    ):
        codes = [
            servers[who].http.post(servers[who].url + "/v1/embeddings", json=body).status_code
            for who in ("stock_embed", "ours_embed")
        ]
        assert codes == [400, 400], (body, codes)


def test_routes_a_model_cannot_serve_name_its_task(servers):
    ours = servers["ours_rerank"]
    r = ours.http.post(ours.url + "/v1/embeddings", json={"input": "x"})
    assert r.status_code == 400 and "classify pooling task" in r.json()["error"]["message"]
    r = servers["ours_embed"].http.post(
        servers["ours_embed"].url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}
    )
    assert r.status_code == 400 and "embed pooling task" in r.json()["error"]["message"]


def test_the_clients_over_vllm_engines(servers):
    ours, stock = servers["ours_embed"], servers["stock_embed"]
    mine = openai.OpenAI(base_url=ours.url + "/v1", api_key="none", max_retries=0)
    theirs = openai.OpenAI(base_url=stock.url + "/v1", api_key="none", max_retries=0)
    got = mine.embeddings.create(model=EMBED, input=TEXTS)  # (base64, decoded by the client)
    want = theirs.embeddings.create(model=EMBED, input=TEXTS)
    assert np.allclose([d.embedding for d in got.data], [d.embedding for d in want.data], atol=1e-5)
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    emb = OpenAIEmbeddings(
        model=EMBED, base_url=ours.url + "/v1", api_key="none", check_embedding_ctx_length=False
    )
    assert np.allclose(
        emb.embed_documents(TEXTS[:2]), [d.embedding for d in want.data[:2]], atol=1e-5
    )
    rr = servers["ours_rerank"]
    v2 = cohere.ClientV2(base_url=rr.url, api_key="none")
    ranked = v2.rerank(model=RERANK, query=QUERY, documents=DOCUMENTS, top_n=2)
    stock_rr = (
        servers["stock_rerank"]
        .http.post(
            servers["stock_rerank"].url + "/v2/rerank",
            json={"model": RERANK, "query": QUERY, "documents": DOCUMENTS, "top_n": 2},
        )
        .json()
    )
    assert [r.index for r in ranked.results] == [r["index"] for r in stock_rr["results"]]
