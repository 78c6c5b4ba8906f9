"""The pooling routes on ``tokenwire serve``'s defaults (the synthetic engine's embeddings), with
real clients: every input form of ``/v1/embeddings``, float and base64, ``dimensions``,
truncation, chat inputs, ``/pooling``, ``/score``, the rerank routes in Jina's and Cohere's
shapes, SGLang's ``/encode``; every bad input a 400 naming its field, a route the model cannot
serve a 400 naming its task; inputs batched into the engine's steps, dropped with their client,
failed with their engine; the openai client, langchain's ``OpenAIEmbeddings`` and Cohere's SDK,
and the bodies they send (``tests/clients/pooling/``) replayed."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from pathlib import Path

import cohere
import httpx
import numpy as np
import openai
import pytest
from langchain_openai import OpenAIEmbeddings

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.engine.synthetic_pooling import SYNTHETIC_POOLING_TASKS
from tokenwire.pooling import MAX_POOLING_INPUTS
from tokenwire.server import ServerConfig, create_app

from conftest import real_tokenizer
from served import MODEL, run_tokenwire, serve, wait_until

FIXTURES = Path(__file__).resolve().parent / "clients" / "pooling"
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Stock markets fell sharply on Monday.",
    "Paris is the capital of France.",
    "The capital city has many museums.",
]


@pytest.fixture(scope="module")
def srv():
    with serve(SyntheticConfig(step_time=0.002)) as s:
        s.http = httpx.Client(base_url=s.url, timeout=30)
        yield s


def post(srv, path: str, body: dict, status: int = 200) -> dict:
    r = srv.http.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()


def vectors(resp: dict) -> np.ndarray:
    return np.array([d["embedding"] for d in resp["data"]], dtype=np.float64)


# ---- /v1/embeddings ------------------------------------------------------------------------------


def test_every_input_form_and_its_usage(srv):
    tok = real_tokenizer("default")
    texts = ["the cat sat on the mat", "a dog"]
    ids = [tok.encode(t) for t in texts]
    by_text = post(srv, "/v1/embeddings", {"model": MODEL, "input": texts})
    assert by_text["object"] == "list" and by_text["model"] == MODEL
    assert by_text["id"].startswith("embd-")
    assert [d["index"] for d in by_text["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in by_text["data"])
    n = sum(map(len, ids))
    assert by_text["usage"] == {
        "prompt_tokens": n,
        "total_tokens": n,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    by_ids = post(srv, "/v1/embeddings", {"input": ids})
    one_text = post(srv, "/v1/embeddings", {"input": texts[0]})
    one_ids = post(srv, "/v1/embeddings", {"input": ids[0]})
    assert np.array_equal(vectors(by_text), vectors(by_ids))
    assert np.array_equal(vectors(one_text)[0], vectors(by_text)[0])
    assert np.array_equal(vectors(one_ids)[0], vectors(by_text)[0])
    assert vectors(by_text).shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors(by_text), axis=1), 1, atol=1e-6)


def test_base64_is_the_float_vector(srv):
    body = {"input": ["hello world", "hello there"]}
    floats = vectors(post(srv, "/v1/embeddings", body))
    b64 = post(srv, "/v1/embeddings", {**body, "encoding_format": "base64"})
    got = [np.frombuffer(base64.b64decode(d["embedding"]), np.float32) for d in b64["data"]]
    assert np.array_equal(np.stack(got), floats.astype(np.float32))
    half = post(
        srv, "/v1/embeddings", {**body, "encoding_format": "base64", "embed_dtype": "float16"}
    )
    h = np.frombuffer(base64.b64decode(half["data"][0]["embedding"]), np.float16)
    assert np.array_equal(h, floats[0].astype(np.float32).astype(np.float16))
    raw = srv.http.post("/v1/embeddings", json={**body, "encoding_format": "bytes"})
    assert raw.headers["content-type"] == "application/octet-stream"
    meta = json.loads(raw.headers["metadata"])
    items = meta["data"]
    assert [(i["start"], i["end"], i["shape"]) for i in items] == [
        (0, 1536, [384]),
        (1536, 3072, [384]),
    ]
    assert np.array_equal(np.frombuffer(raw.content, np.float32).reshape(2, 384), floats)


def test_dimensions_activation_and_truncation(srv):
    short = vectors(post(srv, "/v1/embeddings", {"input": "hello world", "dimensions": 64}))
    assert short.shape == (1, 64) and abs(np.linalg.norm(short) - 1) < 1e-6
    raw = vectors(
        post(srv, "/v1/embeddings", {"input": "hello big world", "use_activation": False})
    )
    assert np.linalg.norm(raw) > 1.1
    tok = real_tokenizer("default")
    text = "one two three four five six seven"
    cut = post(srv, "/v1/embeddings", {"input": text, "truncate_prompt_tokens": 3})
    assert cut["usage"]["prompt_tokens"] == 3
    first = post(srv, "/v1/embeddings", {"input": tok.encode(text)[:3]})
    assert np.array_equal(vectors(cut), vectors(first))
    left = post(
        srv,
        "/v1/embeddings",
        {"input": text, "truncate_prompt_tokens": 3, "truncation_side": "left"},
    )
    last = post(srv, "/v1/embeddings", {"input": tok.encode(text)[-3:]})
    assert np.array_equal(vectors(left), vectors(last))


def test_chat_inputs_embed_the_rendered_conversation(srv):
    conv = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!"}]
    ask = {"messages": conv, "add_generation_prompt": False}
    ids = srv.http.post("/tokenize", json=ask).json()["tokens"]
    want = vectors(post(srv, "/v1/embeddings", {"input": ids}))
    for body in ({"messages": conv}, {"input": conv}):
        got = post(srv, "/v1/embeddings", body)
        assert np.array_equal(vectors(got), want) and got["usage"]["prompt_tokens"] == len(ids)
    batch = post(srv, "/v1/embeddings", {"messages": [conv, conv[:1]]})
    assert len(batch["data"]) == 2 and np.array_equal(vectors(batch)[0], want[0])


BAD = [
    ({"input": []}, "input"),
    ({"input": [1, "a"]}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [-1]}, "input"),
    ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "dimensions": 10_000}, "dimensions"),
    ({"input": "x", "dimensions": "8"}, "dimensions"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "x", "embed_dtype": "int4"}, "embed_dtype"),
    ({"input": "x", "endianness": "middle"}, "endianness"),
    ({"input": "x", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"input": "x", "truncate_prompt_tokens": 10**9}, "truncate_prompt_tokens"),
    ({"input": "x", "truncation_side": "middle"}, "truncation_side"),
    ({"input": "x", "normalize": True}, "normalize"),
    ({"input": "x", "use_activation": "yes"}, "use_activation"),
    ({"input": "x", "model": "other"}, "model"),
    ({"input": "x", "priority": 1.5}, "priority"),
    ({"input": "x", "cache_salt": ""}, "cache_salt"),
    ({"input": "x", "padding": "longest"}, "padding"),
    ({"input": "x", "mm_processor_kwargs": {"a": 1}}, "mm_processor_kwargs"),
    ({"messages": [{"role": "user"}], "input": 3}, "messages"),
    ({"input": ["x"] * (MAX_POOLING_INPUTS + 1)}, "input"),
    ({"input": ["x " * 2000] * 200}, "input"),
]


@pytest.mark.parametrize(("body", "param"), BAD, ids=[p for _, p in BAD])
def test_bad_input_is_a_400_naming_the_field(srv, body, param):
    r = srv.http.post("/v1/embeddings", json=body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param, r.text


def test_routes_the_model_cannot_serve_name_its_task(srv):
    err = post(srv, "/classify", {"input": "x"}, 400)["error"]
    assert "embed" in err["message"] and err["param"] == "model"
    err = post(srv, "/pooling", {"input": "x", "task": "token_embed"}, 400)["error"]
    assert err["param"] == "task" and "--pooler-config" in err["message"]
    err = post(srv, "/pooling", {"input": "x", "task": "classify"}, 400)["error"]
    assert err["param"] == "task" and "Unsupported task" in err["message"]


def test_a_pooling_only_engine_refuses_generation():
    class PoolingOnly(SyntheticEngine):
        supported_tasks = SYNTHETIC_POOLING_TASKS

    tok = real_tokenizer("default")
    app = create_app(tok, PoolingOnly(tok), ServerConfig(model_name=MODEL))
    with run_tokenwire(app) as url:
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 400 and "embed pooling task" in r.json()["error"]["message"]
        ok = httpx.post(url + "/v1/embeddings", json={"input": "hi"})
        assert ok.status_code == 200


# ---- /pooling, /score, the rerank routes, /encode ------------------------------------------------


def test_pooling_gives_the_raw_outputs(srv):
    got = post(srv, "/pooling", {"input": ["hello world", "x"]})
    assert got["id"].startswith("pooling-") and got["data"][0]["object"] == "pooling"
    emb = post(srv, "/v1/embeddings", {"input": ["hello world", "x"]})
    assert [d["data"] for d in got["data"]] == [d["embedding"] for d in emb["data"]]


def test_rerank_puts_documents_sharing_words_first(srv):
    tok = real_tokenizer("default")
    body = {"model": MODEL, "query": QUERY, "documents": DOCUMENTS}
    got = post(srv, "/rerank", body)
    assert [r["index"] for r in got["results"]] == [1, 2, 0]
    scores = [r["relevance_score"] for r in got["results"]]
    assert scores == sorted(scores, reverse=True)
    assert got["results"][0]["document"] == {"text": DOCUMENTS[1], "multi_modal": None}
    n = len(tok.encode(QUERY)) + sum(len(tok.encode(d)) for d in DOCUMENTS)
    assert got["usage"] == {"prompt_tokens": n, "total_tokens": n}
    assert got["id"].startswith("score-") and got["model"] == MODEL
    for path in ("/v1/rerank", "/v2/rerank"):
        assert post(srv, path, body)["results"] == got["results"]
    top = post(srv, "/v1/rerank", {**body, "top_n": 1, "return_documents": False})
    assert top["results"] == [{"index": 1, "relevance_score": scores[0]}]
    # SGLang's instruct and Cohere's fields are accepted.
    post(srv, "/v2/rerank", {**body, "instruct": "Rank.", "max_tokens_per_doc": 4})
    for bad, param in (
        ({"query": QUERY}, "documents"),
        ({"documents": DOCUMENTS}, "query"),
        ({"query": [QUERY, QUERY], "documents": DOCUMENTS}, "query"),
        ({**body, "top_n": -1}, "top_n"),
        ({**body, "documents": [1]}, "documents"),
        ({**body, "return_documents": "no"}, "return_documents"),
    ):
        assert post(srv, "/rerank", bad, 400)["error"]["param"] == param


def test_score_pairs_one_to_many_and_many_to_many(srv):
    vec = vectors(post(srv, "/v1/embeddings", {"input": [QUERY, *DOCUMENTS]}))
    want = [float(vec[0] @ v) for v in vec[1:]]
    for shape in (("queries", "documents"), ("queries", "items"), ("text_1", "text_2")):
        got = post(srv, "/score", {shape[0]: QUERY, shape[1]: DOCUMENTS})
        assert [d["index"] for d in got["data"]] == [0, 1, 2]
        assert all(d["object"] == "score" for d in got["data"])
        assert np.allclose([d["score"] for d in got["data"]], want, atol=1e-6)
    pairs = post(srv, "/v1/score", {"data_1": [QUERY, DOCUMENTS[0]], "data_2": DOCUMENTS[1:]})
    assert pairs["data"][1]["score"] == pytest.approx(float(vec[1] @ vec[3]), abs=1e-6)
    err = post(srv, "/score", {"queries": ["a", "b"], "documents": ["c", "d", "e"]}, 400)
    assert err["error"]["param"] == "queries"


def test_sglang_encode_answers_one_object_each(srv):
    one = post(srv, "/encode", {"text": "hello world", "rid": "mine"})
    assert one["meta_info"]["id"] == "mine" and len(one["embedding"]) == 384
    emb = post(srv, "/v1/embeddings", {"input": "hello world"})
    assert one["embedding"] == emb["data"][0]["embedding"]
    batch = srv.http.post("/encode", json={"input_ids": [[9707, 1879], [785]]}).json()
    assert isinstance(batch, list) and [b["meta_info"]["prompt_tokens"] for b in batch] == [2, 1]
    assert srv.http.put("/encode", json={"text": "x", "dimensions": 16}).status_code == 200
    assert post(srv, "/encode", {"text": "x", "input_ids": [1]}, 400)["error"]["param"] == "text"


# ---- how requests travel -------------------------------------------------------------------------


def test_small_requests_share_engine_steps():
    steps: list[int] = []
    with serve(SyntheticConfig(step_time=0.05)) as s:
        real = s.engine._pool_step

        def counted():
            out = real()
            steps.append(len(out.rids))
            return out

        s.engine._pool_step = counted

        async def many() -> list[int]:
            async with httpx.AsyncClient(base_url=s.url, timeout=30) as client:
                rs = await asyncio.gather(
                    *(client.post("/v1/embeddings", json={"input": f"text {i}"}) for i in range(64))
                )
                return [r.status_code for r in rs]

        assert asyncio.run(many()) == [200] * 64
    assert sum(steps) == 64 and len(steps) < 16  # (64 requests, a few steps)


def test_a_client_that_goes_away_drops_its_inputs():
    with serve(SyntheticConfig(step_time=2.0)) as s:
        body = json.dumps({"input": ["a", "b", "c"]}).encode()
        # (an engine step now, then none for two seconds: the inputs wait for the next one)
        assert httpx.post(s.url + "/v1/embeddings", json={"input": "x"}).status_code == 200
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        assert wait_until(lambda: len(s.runtime.pooling) == 3, 10)
        sock.close()
        assert wait_until(lambda: len(s.runtime.pooling) == 0 and not s.engine._pooling, 10)
        assert s.engine.stats["aborted"] >= 3


def test_an_engine_failure_fails_the_request():
    with serve(SyntheticConfig(step_time=0.2)) as s:
        s.engine.inject("crash")
        r = httpx.post(s.url + "/v1/embeddings", json={"input": ["a", "b"]}, timeout=30)
        assert r.status_code in (500, 503), r.text
        assert wait_until(lambda: len(s.runtime.pooling) == 0, 5)


def test_requests_in_flight_are_bounded():
    with serve(SyntheticConfig(step_time=1.0), max_concurrent_requests=2) as s:
        r = httpx.post(s.url + "/v1/embeddings", json={"input": ["a", "b", "c"]}, timeout=30)
        assert r.status_code == 429


# ---- real clients --------------------------------------------------------------------------------


def test_the_openai_client(srv):
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    # The client asks for base64 and decodes it: the same numbers as the floats.
    got = client.embeddings.create(model=MODEL, input=DOCUMENTS)
    floats = client.embeddings.create(model=MODEL, input=DOCUMENTS, encoding_format="float")
    assert [d.embedding for d in got.data] == [d.embedding for d in floats.data]
    assert got.usage.prompt_tokens == floats.usage.prompt_tokens > 0
    short = client.embeddings.create(model=MODEL, input="hi", dimensions=32)
    assert len(short.data[0].embedding) == 32
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=MODEL, input=[])


def test_langchain_embeddings(srv):
    emb = OpenAIEmbeddings(
        model=MODEL, base_url=srv.url + "/v1", api_key="none", check_embedding_ctx_length=False
    )
    docs = emb.embed_documents(DOCUMENTS)
    query = emb.embed_query(QUERY)
    scores = [float(np.dot(query, d)) for d in docs]
    assert len(docs) == 3 and len(query) == 384 and int(np.argmax(scores)) == 1


def test_cohere_rerank_v1_and_v2(srv):
    v2 = cohere.ClientV2(base_url=srv.url, api_key="none")
    got = v2.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=2)
    assert [r.index for r in got.results] == [1, 2]
    v1 = cohere.Client(base_url=srv.url, api_key="none")
    got = v1.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, return_documents=True)
    assert [r.index for r in got.results] == [1, 2, 0]
    assert got.results[0].document.text == DOCUMENTS[1]


def _fixtures():
    out = []
    for path in sorted(FIXTURES.glob("*.json")):
        corpus = json.loads(path.read_text(encoding="utf-8"))
        for k, req in enumerate(corpus["requests"]):
            out.append(pytest.param(req, id=f"{path.stem}-{k}-{req['name']}"))
    return out


@pytest.mark.parametrize("req", _fixtures())
def test_what_the_clients_send_is_served(srv, req):
    body = {**req["body"], "model": MODEL}
    r = srv.http.request(req["method"], req["path"], json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    if "rerank" in req["path"]:
        assert got["results"][0]["index"] == 1
    else:
        n = len(body["input"]) if isinstance(body["input"], list) else 1
        if isinstance(body["input"], list) and body["input"] and isinstance(body["input"][0], int):
            n = 1
        assert len(got["data"]) == n


def test_the_fixtures_cover_the_clients():
    assert {p.stem for p in FIXTURES.glob("*.json")} >= {
        "openai-embeddings",
        "langchain-openai-embeddings",
        "cohere",
    }


def test_a_late_interaction_model_scores_by_maxsim():
    # (--pooler-config '{"task": "token_embed"}': the synthetic engine's token vectors served)
    tok = real_tokenizer("default")
    config = ServerConfig(model_name=MODEL, pooler_config={"task": "token_embed"})
    app = create_app(tok, SyntheticEngine(tok), config)
    with run_tokenwire(app) as url:
        err = httpx.post(url + "/v1/embeddings", json={"input": "x"}).json()["error"]
        assert "token_embed pooling task" in err["message"]
        rows = httpx.post(url + "/pooling", json={"input": ["hello world", "hi"]}).json()
        assert [len(d["data"]) for d in rows["data"]] == [len(tok.encode("hello world")), 1]
        q, *docs = (
            np.array(d["data"])
            for d in httpx.post(url + "/pooling", json={"input": [QUERY, *DOCUMENTS]}).json()[
                "data"
            ]
        )
        want = [float((q @ d.T).max(axis=1).sum()) for d in docs]
        got = httpx.post(url + "/score", json={"queries": QUERY, "documents": DOCUMENTS}).json()
        assert np.allclose([d["score"] for d in got["data"]], want, rtol=1e-5)
        ranked = httpx.post(url + "/rerank", json={"query": QUERY, "documents": DOCUMENTS}).json()
        assert ranked["results"][0]["index"] == 1


def test_a_pooler_config_task_the_engine_does_not_run_stops_the_start():
    tok = real_tokenizer("default")
    config = ServerConfig(model_name=MODEL, pooler_config={"task": "classify"})
    app = create_app(tok, SyntheticEngine(tok), config)

    async def start() -> None:
        await app.runtime.start()

    with pytest.raises(RuntimeError, match="classify"):
        asyncio.run(start())
