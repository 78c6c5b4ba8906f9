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


def _encodings(name: str) -> tuple[str, dict[bytes, int], object]:
    """A fast tokenizer's regex, ranks and tiktoken encoding with the regex as it is."""
    import json

    import tiktoken

    from tokenwire.fast_bpe import _pattern, _ranks

    spec = json.loads(real_tokenizer(name).hf.to_str())
    pattern = _pattern(spec["pre_tokenizer"])
    ranks = _ranks(spec["model"]["vocab"])
    assert pattern is not None and ranks is not None
    full = tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    return pattern, ranks, full


#: Every kind of character the regexes tell apart around white space.
_AROUND_SPACE = " \t\n\r\x0b\x0c\x85\xa0\u2028\u3000\u2003aZ1.'s/\u0301\u00e9\u4e2d"


@pytest.mark.parametrize("name", sorted(FAST))
def test_the_regex_without_its_look_ahead_over_the_cut_text_gives_the_same_ids(name):
    """Each fast tokenizer's regex ends in the look-ahead; the regex without it, over the text
    cut where the look-ahead shortens a run, gives exactly its ids: with the text cut however
    often, and as ``encode`` does it (a text cut too often goes through the look-ahead itself;
    an ASCII one without tabs is searched for runs of spaces only)."""
    import tiktoken

    from tokenwire.fast_bpe import (
        _LOOKAHEAD_TAIL,
        _SHORTENED_RUNS,
        _cut_before_shortened_runs,
        _without_lookahead,
    )

    pattern, ranks, full = _encodings(name)
    encode = _without_lookahead(pattern, ranks, full)
    assert encode is not None
    # The cutting the sample picks (the tokenizers whose earlier alternative takes line
    # breaks, and the others), applied to every text however often it cuts.
    runs = _SHORTENED_RUNS[0 if r"\s*[\r\n]+" in pattern else 1]
    plain = tiktoken.Encoding(
        name=name + "-plain",
        pat_str=pattern[: -len(_LOOKAHEAD_TAIL)] + r"|\s+",
        mergeable_ranks=ranks,
        special_tokens={},
    )
    always = _cut_before_shortened_runs(plain.encode_ordinary, full.encode_ordinary, runs, 0)

    @settings(max_examples=examples(500), deadline=None)
    @given(
        st.text(alphabet=st.sampled_from(_AROUND_SPACE), max_size=60)
        | st.text(alphabet=st.sampled_from(" \n\raZ1.'s/"), max_size=60)  # ASCII, no tabs
        | st.text(max_size=30)
    )
    def same(text: str) -> None:
        want = full.encode_ordinary(text)
        assert always(text) == want
        assert encode(text) == want

    same()
    prose = "Two spaces after a full stop.  As typists did, 1 or 2 at a time. " * 50
    code = "x\n    y = 1\n" * 200
    for text in (CORPUS, CORPUS.replace(" ", "  "), prose, code, "a" + "  b" * 500):
        assert always(text) == full.encode_ordinary(text)
        assert encode(text) == full.encode_ordinary(text)


def test_a_regex_that_looks_around_elsewhere_keeps_its_look_ahead():
    from tokenwire.fast_bpe import _without_lookahead

    pattern, ranks, full = _encodings("qwen3")
    for other in (r"(?=\p{L})\p{L}+|", r"\b\p{N}|", r"\p{L}+$|", r"^\p{N}|", r"(?<!x)\p{N}|"):
        assert _without_lookahead(other + pattern, ranks, full) is None
    assert _without_lookahead(pattern.replace(r"(?!\S)", ""), ranks, full) is None
