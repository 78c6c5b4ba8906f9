"""The pooling core, sans I/O: which task a model runs, its parameters, the inputs (bounded,
truncated and paired as vLLM does it, checked against the ``tokenizers`` library's own pair
encoding and truncation), the vector math and encodings, and the synthetic engine's vectors."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from tokenwire.engine.pooling import PoolingRequest
from tokenwire.engine.synthetic_pooling import SyntheticPooler
from tokenwire.messages.errors import ValidationError
from tokenwire.pooling import (
    MAX_POOLING_INPUTS,
    PairTemplate,
    PoolingModel,
    PoolingParams,
    TokenBudget,
    base64_vector,
    choose_pooling_task,
    cosine_rows,
    encode_pair,
    float_rows,
    maxsim,
    pack_bits,
    pooling_inputs,
    score_inputs,
    scoring_kind,
    tokenize_inputs,
)
from tokenwire.pooling.inputs import returns_type_ids, truncate_text_to_tokens
from tokenwire.pooling.vectors import to_dtype_bytes

from conftest import real_tokenizer

EMBED = PoolingModel(("BertModel",), 128, True, (16, 32, 64, 128))

# ---- tasks and parameters ------------------------------------------------------------------------


def test_the_task_is_vllms_choice():
    m = PoolingModel()
    assert choose_pooling_task(("embed", "token_embed"), m) == "embed"
    assert choose_pooling_task(("classify",), m) == "classify"
    assert choose_pooling_task(("token_embed", "token_classify"), m) == "token_embed"
    assert choose_pooling_task(("generate",), m) is None
    tagger = PoolingModel(("BertForTokenClassification",))
    assert choose_pooling_task(("classify", "token_classify"), tagger) == "token_classify"
    assert choose_pooling_task(("embed", "token_embed"), m, "token_embed") == "token_embed"
    with pytest.raises(ValueError, match="classify"):
        choose_pooling_task(("embed",), m, "classify")


def test_which_tasks_score():
    assert scoring_kind("embed", PoolingModel()) == "bi-encoder"
    assert scoring_kind("token_embed", PoolingModel()) == "late-interaction"
    assert scoring_kind("classify", PoolingModel(num_labels=1)) == "cross-encoder"
    assert scoring_kind("classify", PoolingModel(num_labels=3)) is None
    assert scoring_kind(None, PoolingModel()) is None


def test_the_model_facts_come_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["BertForSequenceClassification"],
                "hidden_size": 384,
                "id2label": {"0": "neg", "1": "pos"},
                "use_sep_token": False,
            }
        )
    )
    m = PoolingModel.from_dir(str(tmp_path))
    assert m.embedding_size == 384 and m.num_labels == 2 and m.id2label == {0: "neg", 1: "pos"}
    assert not m.use_sep_token and not m.is_matryoshka
    # A sentence-transformers Dense layer sets the embedding size.
    (tmp_path / "modules.json").write_text(
        json.dumps([{"path": "2_Dense", "type": "sentence_transformers.models.Dense"}])
    )
    (tmp_path / "2_Dense").mkdir()
    (tmp_path / "2_Dense" / "config.json").write_text(json.dumps({"out_features": 256}))
    assert PoolingModel.from_dir(str(tmp_path)).embedding_size == 256
    default = PoolingModel.from_config({"num_labels": 1})
    assert default.id2label == {0: "LABEL_0"}


def test_dimensions_are_checked_as_vllm_checks_them():
    ok = PoolingParams.resolve("embed", dimensions=32, use_activation=None, model=EMBED)
    assert ok == PoolingParams("embed", 32, True)
    for dims, words in ((48, "only supports Matryoshka dimensions"), (0, r"range \[1, 128\]")):
        with pytest.raises(ValidationError, match=words) as err:
            PoolingParams.resolve("embed", dimensions=dims, use_activation=None, model=EMBED)
        assert err.value.param == "dimensions"
    with pytest.raises(ValidationError, match="does not support Matryoshka"):
        PoolingParams.resolve("embed", dimensions=8, use_activation=None, model=PoolingModel())
    with pytest.raises(ValidationError, match="dimensions"):
        PoolingParams.resolve("classify", dimensions=8, use_activation=None)
    # The pooler config fills what a request leaves unset.
    got = PoolingParams.resolve(
        "embed",
        dimensions=None,
        use_activation=None,
        defaults={"dimensions": 64, "use_activation": False},
        model=EMBED,
    )
    assert got == PoolingParams("embed", 64, False)


# ---- vectors -------------------------------------------------------------------------------------


def test_base64_is_the_vector_s_own_bytes():
    v = np.random.default_rng(0).standard_normal(384).astype(np.float32)
    assert np.array_equal(np.frombuffer(base64.b64decode(base64_vector(v)), np.float32), v)
    # float32 native: no copy, the buffer itself.
    assert to_dtype_bytes(v).base is v or to_dtype_bytes(v) is v
    big = np.frombuffer(base64.b64decode(base64_vector(v, endianness="big")), ">f4")
    assert np.array_equal(big, v)
    half = np.frombuffer(base64.b64decode(base64_vector(v, "float16")), np.float16)
    assert np.array_equal(half, v.astype(np.float16))


def test_bfloat16_rounds_to_nearest_even():
    # bf16 keeps the top 16 bits of the float32 pattern, rounded to nearest, ties to even.
    patterns = np.array([0x3F800000, 0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7FC00001], np.uint32)
    values = patterns.view(np.float32)
    got = np.frombuffer(to_dtype_bytes(values, "bfloat16").tobytes(), np.uint16)
    assert got[:4].tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F81]
    assert got[4] & 0x7F80 == 0x7F80 and got[4] & 0x7F  # NaN stays NaN
    with pytest.raises(ValidationError) as err:
        to_dtype_bytes(values, "fp8_e4m3")
    assert err.value.param == "embed_dtype"


def test_scores_as_vllm_computes_them():
    rng = np.random.default_rng(1)
    q, docs = rng.standard_normal(16, dtype=np.float32), rng.standard_normal((5, 16), np.float32)
    want = [float(q @ d / (np.linalg.norm(q) * np.linalg.norm(d))) for d in docs]
    assert np.allclose(cosine_rows(q, docs), want, atol=1e-6)
    qs = rng.standard_normal((5, 16), dtype=np.float32)
    pairwise = [float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(qs, docs)]
    assert np.allclose(cosine_rows(qs, docs), pairwise, atol=1e-6)
    qt, dt = rng.standard_normal((3, 8), np.float32), rng.standard_normal((7, 8), np.float32)
    assert maxsim(qt, dt) == pytest.approx(sum(max(a @ b for b in dt) for a in qt), rel=1e-5)


def test_float_rows_and_bits():
    rows = [np.array([0.5, -1.25], np.float32), np.array([2.0, 0.0], np.float32)]
    assert float_rows(rows) == [[0.5, -1.25], [2.0, 0.0]]
    assert float_rows([np.zeros(2, np.float32), np.zeros(3, np.float32)])[1] == [0.0] * 3
    bits = np.array([[1, -1, 1, 1, -1, -1, -1, 1]], np.float32)
    assert pack_bits(bits, signed=False) == [[0b10110001]]
    assert pack_bits(bits, signed=True) == [[0b10110001 - 128]]


# ---- inputs --------------------------------------------------------------------------------------


def test_every_input_form():
    assert pooling_inputs("a") == ["a"]
    assert pooling_inputs(["a", "b"]) == ["a", "b"]
    assert pooling_inputs([1, 2]) == [[1, 2]]
    assert pooling_inputs([[1, 2], "c"]) == [[1, 2], "c"]
    for bad in ([], 3, None, [[]], [1.5], ["a", 3], {"a": 1}):
        with pytest.raises(ValidationError) as err:
            pooling_inputs(bad, "input")
        assert err.value.param == "input"


def test_the_batch_is_bounded_before_anything_is_tokenized(monkeypatch):
    from tokenwire.pooling import inputs

    tok = real_tokenizer("default")
    calls: list[list[str]] = []
    real = inputs._encode_many

    def counted(tok, texts, add_special):
        calls.append(texts)
        return real(tok, texts, add_special)

    monkeypatch.setattr(inputs, "_encode_many", counted)
    with pytest.raises(ValidationError, match="limit") as err:
        tokenize_inputs(pooling_inputs(["x"] * (MAX_POOLING_INPUTS + 1)), tok)
    assert err.value.param == "input" and not calls
    # The token budget: token-id inputs count first, texts a chunk at a time, and the request
    # stops at the first chunk past it.
    with pytest.raises(ValidationError, match="more than 10 tokens"):
        tokenize_inputs([[1] * 8, *(["a b c d e f"] * 200)], tok, budget=TokenBudget(10))
    assert len(calls) == 1 and len(calls[0]) == 64
    with pytest.raises(ValidationError, match="more than 10 tokens"):
        tokenize_inputs([[1] * 11, "a"], tok, budget=TokenBudget(10))
    assert len(calls) == 1
    # One batch call gives what one call a text gives.
    bert = real_tokenizer("minilm_bert")
    texts = ["the cat", "Paris is the capital of France.", "日本語"]
    assert tokenize_inputs(texts, bert) == [bert.encode(t) for t in texts]


def test_truncation_keeps_what_vllm_keeps():
    bert = real_tokenizer("minilm_bert")
    text = "the quick brown fox jumps over the lazy dog"
    full = bert.encode(text)
    # The tokenizer's way: its special tokens kept, the content cut on the right.
    (kept,) = tokenize_inputs([text], bert, truncate=5)
    assert kept == [full[0], *full[1:4], full[-1]]
    # A side named: the whole encoding sliced.
    (left,) = tokenize_inputs([text], bert, truncate=5, side="left")
    (right,) = tokenize_inputs([text], bert, truncate=5, side="right")
    assert left == full[-5:] and right == full[:5]
    (ids,) = tokenize_inputs([[5, 6, 7, 8]], bert, truncate=2)
    assert ids == [5, 6]
    with pytest.raises(ValidationError, match="maximum context length") as err:
        tokenize_inputs([text], bert, max_len=4)
    assert err.value.param == "input"
    with pytest.raises(ValidationError) as err:
        tokenize_inputs([[bert.model_vocab_size]], bert)
    assert err.value.param == "input"


def test_score_inputs_pair_as_vllm_pairs_them():
    one = score_inputs("q", ["a", "b"], ("queries", "documents"))
    assert one.pairs == [("q", "a"), ("q", "b")]
    same = score_inputs(["q1", "q2"], ["a", "b"], ("queries", "documents"))
    assert same.pairs == [("q1", "a"), ("q2", "b")]
    parts = score_inputs({"content": [{"type": "text", "text": "hi"}]}, "d", ("text_1", "text_2"))
    assert parts.queries == ["hi"]
    for first, second, param in (
        (["a", "b", "c"], ["x", "y"], "queries"),
        ([], ["x"], "queries"),
        ("q", [], "documents"),
        ("q", [3], "documents"),
        ({"content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "d", "queries"),
    ):
        with pytest.raises(ValidationError) as err:
            score_inputs(first, second, ("queries", "documents"))
        assert err.value.param == param


def test_pairs_are_the_tokenizer_s_pair_encoding():
    bert = real_tokenizer("minilm_bert")
    hf = bert.hf
    q, d = "what is a cat", "a cat is a small domesticated carnivorous mammal"
    ids, second = encode_pair(bert, q, d, PairTemplate())
    want = hf.encode(q, pair=d)
    assert ids == want.ids and second == want.type_ids.index(1)
    # Truncated as the Hugging Face tokenizer truncates a pair (longest_first), for each size.
    for keep in range(6, len(want.ids)):
        hf.enable_truncation(keep, strategy="longest_first")
        try:
            ref = hf.encode(q, pair=d)
        finally:
            hf.no_truncation()
        got, second = encode_pair(bert, q, d, PairTemplate(), truncate=keep)
        assert got == ref.ids and second == ref.type_ids.index(1), keep
    # max_tokens_per_doc: only the document is cut.
    got, _ = encode_pair(bert, q, d, PairTemplate(), max_tokens_per_doc=3)
    assert got == hf.encode(q, pair=" ".join(d.split()[:3])).ids
    # An LLM as reranker: the two texts one after the other, no token types.
    joined, none = encode_pair(bert, q, d, PairTemplate(use_sep_token=False))
    assert joined == bert.encode(q + d) and none is None
    with pytest.raises(ValidationError, match="maximum context length") as err:
        encode_pair(bert, q, d, PairTemplate(), max_len=8, field="documents")
    assert err.value.param == "documents"
    assert returns_type_ids(bert) is True
    assert returns_type_ids(real_tokenizer("default")) is False


def test_texts_cut_to_tokens_at_character_boundaries():
    bert = real_tokenizer("minilm_bert")
    text = "Tokenization splits unbelievably long words"
    cut = truncate_text_to_tokens(bert, text, 3)
    assert text.startswith(cut)
    assert (
        bert.encode(cut, add_special_tokens=False)
        == bert.encode(text, add_special_tokens=False)[:3]
    )


# ---- the synthetic engine's vectors --------------------------------------------------------------


def _pool(pooler: SyntheticPooler, tok, texts, **params):
    reqs = [
        PoolingRequest(str(i), tok.encode(t), PoolingParams(**{"task": "embed", **params}))
        for i, t in enumerate(texts)
    ]
    return pooler.pool(reqs)


def test_synthetic_vectors_are_deterministic_unit_and_follow_overlap():
    tok = real_tokenizer("default")
    pooler = SyntheticPooler(384, 0, tok.special_ids)
    query = "What is the capital of France?"
    docs = [
        "Stock markets fell sharply on Monday.",
        "Paris is the capital of France.",
        "The capital city has many museums.",
    ]
    a = _pool(pooler, tok, [query, *docs])
    b = _pool(SyntheticPooler(384, 0, tok.special_ids), tok, [query, *docs])
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert all(abs(float(np.linalg.norm(v)) - 1) < 1e-5 and v.dtype == np.float32 for v in a)
    scores = cosine_rows(a[0], np.stack(a[1:]))
    assert list(np.argsort(-scores)) == [1, 2, 0]
    # Another seed, other vectors; a reordering, a close but different one.
    c = _pool(SyntheticPooler(384, 1, tok.special_ids), tok, [query])[0]
    assert float(a[0] @ c) < 0.5
    swapped = _pool(pooler, tok, ["cat dog bird"])[0]
    straight = _pool(pooler, tok, ["cat bird dog"])[0]
    assert 0.9 < float(swapped @ straight) < 0.9999


def test_synthetic_dimensions_activation_and_token_vectors():
    tok = real_tokenizer("default")
    pooler = SyntheticPooler(64, 0, tok.special_ids)
    (short,) = _pool(pooler, tok, ["hello world"], dimensions=16)
    assert short.shape == (16,) and abs(float(np.linalg.norm(short)) - 1) < 1e-5
    (raw,) = _pool(pooler, tok, ["hello world"], use_activation=False)
    assert float(np.linalg.norm(raw)) > 1.1
    ids = tok.encode("hello world")
    (rows,) = pooler.pool([PoolingRequest("t", ids, PoolingParams("token_embed"))])
    assert rows.shape == (len(ids), 64)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-5)


def test_a_score_template_renders_the_pair():
    from tokenwire.runtime import Features
    from tokenwire.server.pooling.requests import PoolingContext, _pair_template

    bert = real_tokenizer("minilm_bert")
    template = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{{ instruction | default('') }}"
    )
    ctx = PoolingContext(bert, "m", "classify", features=Features(chat_template=template))
    pair = _pair_template(ctx, {"instruction": "Judge."})
    assert pair.render is not None
    text = pair.render("what is a cat", "a small animal")
    assert text == "query: what is a cat\ndocument: a small animal\nJudge."
    ids, second = encode_pair(bert, "what is a cat", "a small animal", pair)
    assert ids == bert.encode(text) and second is None
    with pytest.raises(ValidationError) as err:
        _pair_template(ctx, {"tools": []})
    assert err.value.param == "chat_template_kwargs"
