"""The tiktoken path gives exactly the tokenizer's own ids (the real tokenizers it applies to,
on arbitrary text with their added tokens mixed in, with and without the special tokens the
post-processor adds), and the tokenizers it does not reproduce keep their own path."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.fast_bpe import FastBpe

from conftest import ALL_NAMES, REPO, examples, real_tokenizer

#: Which real tokenizers the fast path applies to (byte-level BPE over one regex).
FAST = {"llama3", "qwen3", "gptoss", "claude"}
CORPUS = (REPO / "tests" / "data" / "corpus.txt").read_text()


@pytest.mark.parametrize("name", ALL_NAMES)
def test_the_fast_path_applies_where_it_reproduces_the_tokenizer(name):
    tok = real_tokenizer(name)
    assert (tok.fast_bpe() is not None) == (name in FAST)


def _pieces(name: str) -> st.SearchStrategy[str]:
    tok = real_tokenizer(name)
    added = [t for t in tok.hf.get_added_tokens_decoder().values()][:40]
    words = ["hello", " world", "'s", "'LL", "123456", "3.14", "\n\n", "  ", "\t", "é", "e\u0301"]
    return st.one_of(
        st.text(max_size=12),
        st.sampled_from(words),
        st.sampled_from([a.content for a in added]),
        st.sampled_from(CORPUS.split(" ")),
    )


@pytest.mark.parametrize("name", sorted(FAST))
def test_fast_ids_are_the_tokenizers_own(name):
    tok = real_tokenizer(name)
    fast = tok.fast_bpe()
    assert isinstance(fast, FastBpe)

    @settings(max_examples=examples(300), deadline=None)
    @given(st.lists(_pieces(name), max_size=30).map("".join), st.booleans())
    def check(text: str, special: bool) -> None:
        assert tok.encode(text, add_special_tokens=special) == (
            tok.hf.encode(text, add_special_tokens=special).ids
        )

    check()
    long = CORPUS * 30
    assert tok.encode(long) == tok.hf.encode(long).ids


def test_a_fresh_tokenizer_builds_its_decode_tables_and_its_fast_path_together():
    """The decode tables' self-check encodes text, which builds the fast path: one derived value
    made while another is being made (a deadlock once)."""
    import threading

    from tokenwire import Tokenizer
    from tokenwire.detok.tables import decode_table

    tok = Tokenizer.default()
    done = []
    t = threading.Thread(target=lambda: done.append(decode_table(tok, True)), daemon=True)
    t.start()
    t.join(60)
    assert done and done[0] is not None and tok.fast_bpe() is not None


@pytest.mark.parametrize("form", ["NFC", "NFKC"])
def test_normalizing_line_by_line_is_normalizing_the_whole(form):
    # A line feed neither composes nor reorders with any character on either side: every code
    # point, before and after one.
    import unicodedata

    from tokenwire.fast_bpe import _NORMALIZERS

    normalize = unicodedata.normalize
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        one = normalize(form, c)
        assert normalize(form, "\n" + c) == "\n" + one, hex(cp)
        assert normalize(form, c + "\n") == one + "\n", hex(cp)
    by_line = _NORMALIZERS[form]
    assert by_line is not None
    for text in (CORPUS, "e\n\u0301x", "\u0301\n\n\u1100\n\u1161\u11a8", "plain ascii\nlines"):
        assert by_line(text) == normalize(form, text)

    @given(
        st.text(
            alphabet=st.sampled_from(
                "ae\n\u0301\u0327\u0306\u1100\u1161\u11a8\ufb01\u212b\u00c5 x"
            ),
            max_size=40,
        )
    )
    @settings(max_examples=300, deadline=None)
    def same(text):
        assert by_line(text) == normalize(form, text)

    same()
