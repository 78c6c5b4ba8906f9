from __future__ import annotations

import json
import shutil

import pytest

from tokenwire import DecodeError, Tokenizer, ValidationError

from conftest import REAL_TOKENIZERS, real_tokenizer, tokenizer_dir
from helpers import BYTE_EOS, BYTE_MODEL_VOCAB, BYTE_TOOL, byte_tokenizer


def test_default_is_bundled_qwen3():
    tok = Tokenizer.default()
    assert tok.vocab_size == 151669
    assert tok.model_vocab_size == 151936
    assert tok.eos_token_ids == (151645,)
    assert tok.bos_token_id == 151643
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert tok.max_model_len == 40960
    assert tok.decode(tok.encode("héllo 你好 👋", add_special_tokens=False)) == "héllo 你好 👋"
    assert tok.is_special(151645) and not tok.is_special(100)


def test_decode_is_strict_about_unknown_ids():
    tok = Tokenizer.default()
    ids = tok.encode("hello", add_special_tokens=False)
    assert tok.hf.decode([*ids, 151700]) == "hello"  # what tokenizers does on its own
    with pytest.raises(DecodeError, match="151700"):
        tok.decode([*ids, 151700])
    with pytest.raises(DecodeError, match="-1"):
        tok.decode([-1])
    assert str(DecodeError("x")) == "detokenize failed: x"


def test_id_to_token_and_sizes():
    tok = byte_tokenizer()
    assert tok.vocab_size == 258
    assert tok.model_vocab_size == BYTE_MODEL_VOCAB
    assert tok.id_to_token(BYTE_EOS) == "<eos>"
    assert tok.id_to_token(BYTE_TOOL) == "<tool>"
    assert tok.id_to_token(258) is None
    assert tok.id_to_token(-1) is None
    assert tok.is_special(BYTE_EOS) and not tok.is_special(BYTE_TOOL)
    assert tok.eos_token_ids == (BYTE_EOS,)


def test_model_vocab_size_is_the_larger_one():
    tok = byte_tokenizer()
    assert Tokenizer(tok.hf, model_vocab_size=10).model_vocab_size == tok.vocab_size
    assert Tokenizer(tok.hf).model_vocab_size == tok.vocab_size


def test_validate_prompt_ids():
    tok = Tokenizer.default()
    tok.validate_prompt_ids([0, 151668, 151669, 151935])  # past the tokenizer, inside the model
    with pytest.raises(ValidationError) as info:
        tok.validate_prompt_ids([1, 2, 151936, -5])
    assert "[2]" in str(info.value) and "151936" in str(info.value)
    assert str(info.value).startswith("validation failed: ")
    with pytest.raises(ValidationError, match=r"\[1\] = -5"):
        tok.validate_prompt_ids([1, -5])
    with pytest.raises(ValidationError, match="not an integer"):
        tok.validate_prompt_ids([1, True])
    with pytest.raises(ValidationError, match="not an integer"):
        tok.validate_prompt_ids([1, "2"])


class _CountedIds(list):
    """A list of ids that counts the times Python code iterates it."""

    iterated = 0

    def __iter__(self):
        _CountedIds.iterated += 1
        return super().__iter__()


def test_a_token_id_prompt_is_checked_without_a_python_step_per_id():
    """A prompt of 8,000 token ids is checked (integers, not bools, inside the model's
    vocabulary) in msgspec's C code: neither the integer check that completions, SGLang's
    ``/generate`` and the pooling routes share nor the tokenizer's range check walks it in
    Python (1.9 ms for a completion prompt's checks before, 0.14 ms now); the only pass left is
    the copy each route keeps. A bad id is still named by its position."""
    from tokenwire.pooling.inputs import pooling_inputs
    from tokenwire.server import fields
    from tokenwire.tokenizer import all_ints

    tok = Tokenizer.default()
    ids = _CountedIds(range(100, 8100))
    _CountedIds.iterated = 0
    assert all_ints(ids)
    tok.validate_prompt_ids(ids)
    assert _CountedIds.iterated == 0
    assert fields.prompt_ids(ids, tok, "prompt", add_special=False) == [[*range(100, 8100)]]
    assert _CountedIds.iterated == 1  # (the prompt's copy)
    assert pooling_inputs(ids) == [[*range(100, 8100)]]
    assert _CountedIds.iterated == 2  # (the input's copy)
    assert not all_ints([1, True]) and not all_ints([1, 2.0]) and all_ints([])
    with pytest.raises(ValidationError, match=r"prompt\[7000\] = 151936 is out of range"):
        fields.prompt_ids([*ids[:7000], 151936], tok, "prompt", add_special=False)
    with pytest.raises(ValidationError, match=r"prompt\[1\] must be a string or a list"):
        fields.prompt_ids([[1, 2], [3, True]], tok, "prompt", add_special=False)


def test_from_pretrained_local_dir_reads_configs(tmp_path):
    src = tokenizer_dir("qwen3")
    if isinstance(src, str):
        pytest.skip(src)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, tmp_path / name)
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "vocab_size": 151936,
                "eos_token_id": [151645, 151643],
                "bos_token_id": 151643,
                "max_position_embeddings": 4096,
            }
        )
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 151644}))
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok.model_vocab_size == 151936
    assert tok.eos_token_ids == (151645, 151643, 151644)
    assert tok.bos_token_id == 151643
    assert tok.max_model_len == 4096
    assert tok.chat_template == "{{ messages[0]['content'] }}"
    # An explicit model vocab size wins over config.json.
    assert Tokenizer.from_pretrained(tmp_path, model_vocab_size=160000).model_vocab_size == 160000


def test_from_pretrained_hub_id_goes_through_huggingface_hub(tmp_path, monkeypatch):
    src = tokenizer_dir("llama2")
    if isinstance(src, str):
        pytest.skip(src)
    calls = []

    def fake_snapshot_download(repo_id, allow_patterns):
        calls.append((repo_id, tuple(allow_patterns)))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(src / name, tmp_path / name)
        return str(tmp_path)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    tok = Tokenizer.from_pretrained("meta-llama/Llama-2-7b-hf")
    assert calls and calls[0][0] == "meta-llama/Llama-2-7b-hf"
    assert "tokenizer.json" in calls[0][1]
    assert tok.vocab_size == 32000 and tok.bos_token_id == 1 and tok.eos_token_ids == (2,)


@pytest.mark.parametrize("name", list(REAL_TOKENIZERS))
def test_real_tokenizer_sizes(name):
    tok = real_tokenizer(name)
    expected = {
        "llama2": (32000, 32000),
        "llama3": (128256, 128256),
        "qwen3": (151669, 151936),
        "gemma3": (262145, 262208),
        "deepseek_v3": (128815, 129280),
        "gptoss": (200019, 201088),
        "claude": (65000, 65000),
        "minilm_bert": (30522, 30522),
    }[name]
    assert (tok.vocab_size, tok.model_vocab_size) == expected
    # Every id past the tokenizer but inside the model is a valid prompt id and undecodable.
    if tok.model_vocab_size > tok.vocab_size:
        tok.validate_prompt_ids([tok.vocab_size, tok.model_vocab_size - 1])
        with pytest.raises(DecodeError):
            tok.decode([tok.vocab_size])


@pytest.mark.parametrize("name", ["qwen3", "llama2", "minilm_bert"])
def test_both_tables_built_together_equal_each_built_alone(name):
    """``build_decode_tables`` derives the skipping table and checks only what differs: the
    result is the same as building and checking each table on its own."""
    from tokenwire.detok.tables import build_decode_table, build_decode_tables

    tok = real_tokenizer(name)
    together = build_decode_tables(tok)
    for skip in (False, True):
        alone = build_decode_table(tok, skip_special_tokens=skip)
        both = together[skip]
        assert (alone is None) == (both is None)
        if alone is not None:
            assert both.skip_special_tokens == skip and both.kind == alone.kind
            assert (both.cls == alone.cls).all() and both.tok_bytes == alone.tok_bytes
            assert both.tok_str == alone.tok_str and both.strip_start == alone.strip_start
