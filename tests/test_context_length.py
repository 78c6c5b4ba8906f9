"""A prompt past the context is refused after tokenizing a bounded part of it, and one that may
fit is tokenized exactly as a whole; keeping a prompt's last (or first) tokens tokenizes only that
end."""

from __future__ import annotations

import pytest

from tokenwire import Tokenizer, ValidationError
from tokenwire.context_length import CUT_SLACK, PIECE_CHARS, encode_truncated, encode_within

from conftest import ALL_NAMES, REPO, real_tokenizer

CORPUS = (REPO / "tests" / "data" / "corpus.txt").read_text()


def _texts() -> dict[str, str]:
    """Long texts of the kinds that tokenize oddly near a cut: prose in many scripts, runs of
    digits (grouped by three in some tokenizers), runs of spaces, one long word."""
    n = 2 * PIECE_CHARS + 12345
    return {
        "prose": (CORPUS * (n // len(CORPUS) + 1))[:n],
        "digits": ("1234567890" * (n // 10 + 1))[:n],
        "spaces": ("a" + " " * 997) * (n // 998),
        "word": "x" * n,
        "cjk": ("日本語のテキスト、中文文本。" * (n // 14 + 1))[:n],
    }


class _Counting:
    """Wraps a tokenizer, counting the characters it is asked to tokenize."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.chars = 0
        self.max_model_len = tok.max_model_len

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        self.chars += len(text)
        return self.tok.encode(text, add_special_tokens=add_special_tokens)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_a_text_that_fits_is_tokenized_whole_and_exactly(name, monkeypatch):
    tok = real_tokenizer(name)
    monkeypatch.setattr(tok, "max_model_len", 10**7)
    for kind, text in _texts().items():
        got = encode_within(tok, text, add_special_tokens=True, where="prompt", field="prompt")
        assert got == tok.encode(text, add_special_tokens=True), (name, kind)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_a_truncated_text_is_its_first_or_last_tokens(name):
    tok = real_tokenizer(name)
    for kind, text in _texts().items():
        whole = tok.encode(text, add_special_tokens=True)
        for keep in (1, 5000):
            got = encode_truncated(tok, text, keep, add_special_tokens=True)
            assert got == whole[-keep:], (name, kind, keep)
            got = encode_truncated(tok, text, keep, side="right", add_special_tokens=True)
            assert got == whole[:keep], (name, kind, keep, "right")


def test_a_huge_prompt_is_refused_after_a_bounded_part_of_it():
    tok = Tokenizer.default()
    tok.max_model_len = 4096
    counting = _Counting(tok)
    text = "7" * 20_000_000  # 20 million tokens
    with pytest.raises(ValidationError, match="maximum context length is 4096") as info:
        encode_within(counting, text, add_special_tokens=True, where="prompt", field="prompt")
    assert info.value.param == "prompt"
    assert counting.chars <= PIECE_CHARS  # one piece was enough to know


def test_a_prompt_near_the_limit_is_counted_with_the_cuts_slack_then_tokenized_whole():
    tok = Tokenizer.default()
    text = "7" * (3 * PIECE_CHARS)  # one token per digit
    tok.max_model_len = len(text)  # fits exactly
    counting = _Counting(tok)
    ids = encode_within(counting, text, add_special_tokens=False, where="prompt", field="prompt")
    assert len(ids) == len(text) and counting.chars == 2 * len(text)
    tok.max_model_len = len(text) - 2 * CUT_SLACK - 1  # past the context by more than the slack
    with pytest.raises(ValidationError):
        encode_within(tok, text, add_special_tokens=False, where="prompt", field="prompt")


def test_keeping_the_end_of_a_huge_prompt_tokenizes_only_the_end():
    tok = Tokenizer.default()
    counting = _Counting(tok)
    text = "Once upon a time, " + "7" * 20_000_000 + " the end."
    got = encode_truncated(counting, text, 100, add_special_tokens=True)
    assert tok.decode(got).endswith("7777 the end.") and len(got) == 100
    assert counting.chars <= 4 * PIECE_CHARS
