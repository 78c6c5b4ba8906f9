"""Stop-regex admission: RE2 with Python's meaning, bounds, rejection messages, the cache."""

from __future__ import annotations

import re
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire import ValidationError
from tokenwire.messages import regex as rx
from tokenwire.messages.regex import MAX_STOP_REGEX_LEN, UNBOUNDED, admit_stop_regex

from conftest import examples


@pytest.mark.parametrize(
    ("pattern", "bound"),
    [
        (r"\d{6}", 6),
        ("abc", 3),
        ("colou?r", 6),
        ("and|or", 3),
        (r"\d+", UNBOUNDED),
        (r"a{2,5}b", 6),
        (r"(?:ab){3}", 6),
        (r"^\Aend\Z", 3),
        (r"[^x]y.", 3),
        (r"(?i)(stop|halt)!", 5),
        (r"x*?", UNBOUNDED),
    ],
)
def test_max_len(pattern, bound):
    assert admit_stop_regex(pattern).max_len == bound


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        (r"(a)\1", "backreference"),
        (r"(?P<x>a)(?P=x)", "backreference"),
        (r"(?=a)b", "lookahead"),
        (r"a(?!b)", "negative lookahead"),
        (r"(?<=a)b", "lookbehind"),
        (r"(?<!a)b", "negative lookbehind"),
        (r"(?>ab)", "atomic group"),
        (r"a++", "possessive"),
        (r"(\bword)", "word boundary"),
        (r"a.\b.", "word boundary"),
        (r"\b", "word boundary"),
        (r"\b(?:x|1|)", "word boundary"),
        (r"a{1001}", "repetition count"),
    ],
)
def test_rejected_constructs_are_named(pattern, construct):
    with pytest.raises(ValidationError) as info:
        admit_stop_regex(pattern)
    assert construct in str(info.value)
    assert info.value.status == 400


def test_limits_and_syntax_errors():
    ok = "a" * MAX_STOP_REGEX_LEN
    assert admit_stop_regex(ok).max_len == MAX_STOP_REGEX_LEN
    with pytest.raises(ValidationError, match="longer than the limit of 256"):
        admit_stop_regex("a" * (MAX_STOP_REGEX_LEN + 1))
    with pytest.raises(ValidationError, match="257 bytes"):
        admit_stop_regex("é" * 128 + "a")  # 257 UTF-8 bytes, 129 characters
    with pytest.raises(ValidationError, match="not a valid regular expression"):
        admit_stop_regex("(unclosed")
    with pytest.raises(ValidationError, match="not a valid"):
        admit_stop_regex("(?(1)a|b)")


def test_no_re2_logging_on_stderr(capfd):
    for bad in [r"(a)\1", "a{1001}", "(?<=x)y", "("]:
        with pytest.raises(ValidationError):
            admit_stop_regex(bad)
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        (r"\d+", "price: ٣٤٥ or 12"),  # Arabic-Indic digits are \d in Python
        (r"\w+", "naïve ψυχή 漢字_x"),
        (r"\s+", "a\u3000\u2028b\x85c \t\n"),
        (r"[\W\d]", "abc١!"),
        (r"[^\s]+", "\u2003word\u00a0"),
        (r"(?i)STRASSE", "strasse"),
        (r"(?s)a.b", "a\nb"),
        (r"a.b", "a\nb axb"),
        (r"(?m)^x", "a\nx"),
        (r"(?m)x$", "x\nb"),
        (r"\Ax", "xx"),
        (r"x\Z", "ax\nx"),
        (r"(?a)\w+", "naïve"),
        (r"(?x) a  b  # comment", "xab"),
        (r"colou?r|gr[ae]y", "the grey colour"),
        (r"a{2,3}?", "aaaa"),
        (r"[a-c-]+", "x-ab-"),
        (r"\x41\u00e9\N{GREEK SMALL LETTER ALPHA}", "Aéα"),
    ],
)
def test_search_means_what_python_re_means(pattern, text):
    admitted = admit_stop_regex(pattern)
    for pos in range(len(text) + 1):
        m = re.compile(pattern).search(text, pos)
        assert admitted.search(text, pos) == (m.span() if m else None), (pattern, pos)


simple_atoms = st.sampled_from(
    ["a", "b", ".", r"\d", r"\w", r"\s", r"\D", "[ab]", "[^a]", r"[\d\s]", "é", "z"]
)


@st.composite
def patterns(draw):
    parts = draw(st.lists(simple_atoms, min_size=1, max_size=5))
    out = ""
    for p in parts:
        q = draw(st.sampled_from(["", "*", "+", "?", "{1,2}", "*?"]))
        out += f"(?:{p}){q}" if q else p
        if draw(st.booleans()) and draw(st.booleans()):
            out = f"(?:{out})|{draw(simple_atoms)}"
    return out


@settings(max_examples=examples(200))
@given(patterns(), st.text(alphabet="ab é1٣ \t\nz_", max_size=20))
def test_search_agrees_with_python_re_property(pattern, text):
    admitted = admit_stop_regex(pattern)
    m = re.compile(pattern).search(text)
    assert admitted.search(text) == (m.span() if m else None)


CATASTROPHIC = [r"(?:a+)+b", r"(?:.|.)*Z", r"a*a*a*a*a*a*a*a*b", r"(?:.*){20}Z", r"(?:.?){255}Z"]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_catastrophic_patterns_are_admitted_and_run_on_100kb(pattern):
    # RE2 runs in time linear in the text: each of SGLang's catastrophic patterns either is
    # rejected or completes a search over 100 KB of adversarial text (no timing asserted).
    admitted = admit_stop_regex(pattern)
    text = "a" * 100_000
    assert admitted.search(text) is None
    assert admitted.search(text + "bZ") is not None


def test_cache_is_lru_and_caches_only_successes(monkeypatch):
    rx.clear_cache()
    monkeypatch.setattr(rx, "CACHE_SIZE", 4)
    first = admit_stop_regex("p0")
    for i in range(1, 4):
        admit_stop_regex(f"p{i}")
    assert admit_stop_regex("p0") is first  # a hit refreshes p0
    admit_stop_regex("p4")  # evicts the least recently used: p1
    assert list(rx._cache) == ["p2", "p3", "p0", "p4"]
    for _ in range(3):
        with pytest.raises(ValidationError):
            admit_stop_regex(r"(a)\1")
    assert r"(a)\1" not in rx._cache
    info = rx.cache_info()
    assert info["size"] == 4 and info["hits"] == 1
    rx.clear_cache()


def test_cached_and_fresh_results_are_equal():
    rx.clear_cache()
    fresh = rx._admit(r"(?i)stop\s+now")
    cached = admit_stop_regex(r"(?i)stop\s+now")
    again = admit_stop_regex(r"(?i)stop\s+now")
    assert fresh == cached and cached is again
    assert fresh.search("please STOP  now") == again.search("please STOP  now")


def test_cache_is_thread_safe():
    rx.clear_cache()
    results: dict[int, list] = {}
    pats = [f"w{i}[0-9]+" for i in range(40)]

    def worker(k: int) -> None:
        results[k] = [admit_stop_regex(p) for p in pats * 5]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(8):
        assert [r.pattern for r in results[k]] == pats * 5
        assert all(r == rx._admit(r.pattern) for r in results[k][:40])
    assert rx.cache_info()["size"] == 40


# ---- SGLang's Rust admission corpus: what it must admit, with RE2/Rust meaning ----------------


@pytest.mark.parametrize(
    ("pattern", "bound"),
    [
        (r"[.!?]\s*$", UNBOUNDED),
        (r"\s+$", UNBOUNDED),
        (r"^abc$", 3),
        (r"\bword\b", 4),
        ("", 0),
        (r"^$", 0),
    ],
)
def test_sglang_must_admit(pattern, bound):
    assert admit_stop_regex(pattern).max_len == bound


@pytest.mark.parametrize(
    ("pattern", "text", "span"),
    [
        (r"end$", "the end", (4, 7)),
        (r"end$", "the end\n", None),  # $ is the end of the text (Python: before a final \n too)
        (r"[.!?]\s*$", "Done. ", (4, 6)),
        (r"[.!?]\s*$", "Done. And", None),
        (r"\s+$", "a \t", (1, 3)),
        (r"^abc$", "abc", (0, 3)),
        (r"^abc$", "xabc", None),
        (r"^abc$", "abcd", None),
        ("", "anything", (0, 0)),
        ("", "", (0, 0)),
        (r"(?m)^b$", "a\nb\nc", (2, 3)),
    ],
)
def test_anchors_mean_the_text(pattern, text, span):
    assert admit_stop_regex(pattern).search(text) == span


BOUNDARY_PATTERNS = [
    r"\bword\b",
    r"\bword",
    r"word\b",
    r"\Bor",
    r"or\B",
    r"x\B",
    r"\b\d+\b",
    r"\b[a-zé]+\b",
    r"\b漢字\b",
    r"\bψ\w*",
    r"a\b b",
    r"a\Bb",
    r"a\bb",
    r"\b(?:yes|no)\b",
    r"\B[.!]",
    r"[.!]\b",
    r"(?a)\bnaïve\b",
    r"(?i)\bWORD\b",
]
BOUNDARY_TEXTS = [
    "word",
    "a word.",
    "swords word",
    "éword wordé word",
    "naïve wordy word!",
    "漢字 x漢字 漢字",
    "ψυχή ψ",
    "a b ab a  b",
    "x xa x1 x_",
    "yes no noyes no.",
    "123 a123 123",
    "hi! .! x.",
    "WORD Word",
    "ornament color orb",
]


@pytest.mark.parametrize("pattern", BOUNDARY_PATTERNS)
def test_word_boundaries_are_unicode_aware(pattern):
    admitted = admit_stop_regex(pattern)
    compiled = re.compile(pattern)
    for text in BOUNDARY_TEXTS:
        for pos in range(len(text) + 1):
            m = compiled.search(text, pos)
            assert admitted.search(text, pos) == (m.span() if m else None), (pattern, text, pos)


boundary_atoms = st.sampled_from(
    ["a", "é", "漢", "1", "_", " ", r"\.", r"\d", r"\s", "[ab]", "[.!]"]
)


@st.composite
def boundary_patterns(draw):
    atoms = draw(st.lists(boundary_atoms, min_size=1, max_size=4))
    body = ""
    for k, atom in enumerate(atoms):
        if k and draw(st.booleans()):
            body += draw(st.sampled_from([r"\b", r"\B"]))
        body += atom + draw(st.sampled_from(["", "+", "{1,2}"]))
    before = draw(st.sampled_from(["", r"\b", r"\B"]))
    after = draw(st.sampled_from(["", r"\b", r"\B"]))
    return before + body + after


@settings(max_examples=examples(300))
@given(boundary_patterns(), st.text(alphabet="aé漢1_ .!b", max_size=12))
def test_word_boundaries_agree_with_python_re_property(pattern, text):
    admitted = admit_stop_regex(pattern)
    compiled = re.compile(pattern)
    for pos in range(len(text) + 1):
        m = compiled.search(text, pos)
        assert admitted.search(text, pos) == (m.span() if m else None), (pattern, text, pos)
