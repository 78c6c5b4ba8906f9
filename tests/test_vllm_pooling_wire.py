"""Pooling over vLLM's EngineCore protocol with ``tokenwire mock-engine`` (no vLLM needed): the
pooling ADD (vLLM's ``PoolingParams`` array), the engine's answer (a tensor in a frame of its own,
or inline below 256 bytes), the task learned from ``get_supported_tasks``, an engine that runs
no pooling task, and an input the engine fails. The mock's vectors are the synthetic engine's, so
the served embeddings must be exactly those the in-process engine gives."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tokenwire.engine.pooling import Pooled, PoolingRequest
from tokenwire.engine.synthetic_pooling import SyntheticPooler
from tokenwire.engine.vllm import VllmEngine, VllmEngineConfig
from tokenwire.engine.vllm import protocol as wire
from tokenwire.engine.vllm.pooling import (
    decode_pooling_params,
    encode_pooling_add,
    pooled_outputs,
    pooling_params_array,
)
from tokenwire.pooling import PoolingModel, PoolingParams
from tokenwire.server import ServerConfig, create_app
from vllm_helpers import free_port, spawn_mock, stop_process

from conftest import real_tokenizer
from served import run_app

MODEL = "mock-embed"


@contextlib.contextmanager
def served(*mock_args: str) -> Iterator[tuple[str, VllmEngine]]:
    tok = real_tokenizer("default")
    address = f"tcp://127.0.0.1:{free_port()}"
    mock = spawn_mock(address, 0, "--step-time-ms", "2", *mock_args)
    engine = VllmEngine(tok, VllmEngineConfig(handshake_address=address, ready_timeout=60))
    try:
        # (what the model's config would say: Matryoshka embeddings of 96)
        model = PoolingModel(embedding_size=96, is_matryoshka=True)
        app = create_app(tok, engine, ServerConfig(model_name=MODEL, pooling_model=model))
        with run_app(app, start_timeout=120) as url:
            yield url, engine
    finally:
        stop_process(mock)


@pytest.fixture(scope="module")
def pooling():
    with served("--runner", "pooling", "--embedding-dim", "96") as got:
        yield got


def test_pooling_params_travel_as_vllms_array():
    # As vLLM's frontend fills them (verify): trailing defaults left out.
    assert pooling_params_array(PoolingParams("embed")) == [
        True,
        None,
        None,
        None,
        "embed",
        False,
        False,
    ]
    extra = PoolingParams("classify", None, True, {"compressed_token_type_ids": 6})
    arr = pooling_params_array(extra)
    assert arr[4] == "classify" and arr[8] == {"compressed_token_type_ids": 6}
    assert pooling_params_array(PoolingParams("token_embed", 8))[6] is True
    for p in (PoolingParams("embed", 16, False), extra):
        assert decode_pooling_params(pooling_params_array(p)) == p
    add = wire.decode_add(encode_pooling_add(PoolingRequest("r", [1, 2], PoolingParams("embed"))))
    assert add.pooling == pooling_params_array(PoolingParams("embed")) and add.sampling == {}


def test_outputs_are_views_of_the_frames():
    vec = np.arange(96, dtype=np.float32)
    small = np.arange(4, dtype=np.float32)
    aux: list[bytes] = []
    outs = wire.StepOutputs(
        0,
        [
            wire.StepOutput(
                "a", [], pooling_output=wire.encode_array(vec, aux, "float32"), finish_reason=0
            ),
            wire.StepOutput(
                "b", [], pooling_output=wire.encode_array(small, aux, "float32"), finish_reason=0
            ),
            wire.StepOutput("c", [], finish_reason=wire.FINISH_ERROR),
            wire.StepOutput("gen", [5], finish_reason=None),
        ],
    )
    frames = [wire.encode_outputs(outs), *aux]
    msg = wire.decode_outputs(frames[0])
    rest, pooled = pooled_outputs(msg.outputs, frames, {"a", "b", "c"})
    assert [o.request_id for o in rest] == ["gen"]
    assert isinstance(pooled, Pooled) and pooled.rids == ["a", "b"]
    assert np.array_equal(pooled.data[0], vec) and np.array_equal(pooled.data[1], small)
    assert pooled.data[0].base is not None  # (a view of the frame, not a copy)
    assert [rid for rid, _ in pooled.errors] == ["c"]


def test_embeddings_over_the_protocol_are_the_synthetic_engine_s(pooling):
    url, engine = pooling
    assert engine.supported_tasks == ("embed", "token_embed")
    tok = real_tokenizer("default")
    texts = ["the cat sat on the mat", "hi"]
    got = httpx.post(url + "/v1/embeddings", json={"input": texts}, timeout=30).json()
    want = SyntheticPooler(96, 0, tok.special_ids).pool(
        [PoolingRequest(str(i), tok.encode(t), PoolingParams("embed")) for i, t in enumerate(texts)]
    )
    assert [d["embedding"] for d in got["data"]] == [w.tolist() for w in want]
    assert got["usage"]["prompt_tokens"] == sum(len(tok.encode(t)) for t in texts)
    b64 = httpx.post(
        url + "/v1/embeddings", json={"input": texts, "encoding_format": "base64"}, timeout=30
    ).json()
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), np.float32) for d in b64["data"]]
    assert all(np.array_equal(a, b) for a, b in zip(decoded, want))
    short = httpx.post(url + "/v1/embeddings", json={"input": "hi", "dimensions": 2}, timeout=30)
    assert len(short.json()["data"][0]["embedding"]) == 2  # (inline: below 256 bytes)
    ranked = httpx.post(
        url + "/rerank",
        json={"query": "capital of France", "documents": ["stocks fell", "the capital of France"]},
        timeout=30,
    ).json()
    assert [r["index"] for r in ranked["results"]] == [1, 0]
    assert not engine._pooling and not any(c.in_flight for c in engine._cores)


def test_many_inputs_at_once(pooling):
    url, engine = pooling
    texts = [f"input number {i}" for i in range(300)]
    got = httpx.post(url + "/v1/embeddings", json={"input": texts}, timeout=60)
    assert got.status_code == 200 and len(got.json()["data"]) == 300
    assert not engine._pooling


def test_an_engine_that_does_not_pool():
    with served("--runner", "generate") as (url, engine):
        assert engine.supported_tasks == ("generate",)
        r = httpx.post(url + "/v1/embeddings", json={"input": "x"}, timeout=30)
        assert r.status_code == 400 and "text generation" in r.json()["error"]["message"]
        ok = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200
