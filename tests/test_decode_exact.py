"""Exactness: on every real tokenizer, both paths, both ``skip_special_tokens`` values, streamed
text equals ``decode(prompt + generated)`` minus the decoded prompt.

Where the tokenizer's own decode is not monotonic (a byte-fallback run turned invalid), no stream
can match it; there the text before the break must be exact and the stream self-consistent.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tokenwire import DecodeBatch, DecodeStream, Tokenizer
from tokenwire.detok.tables import _bytes_to_unicode, decode_table
from tokenwire.messages.errors import DecodeError

from conftest import ALL_NAMES, GENERIC_ONLY, PATH_CASES, examples, real_tokenizer
from helpers import FFFD, stream_all

CORPUS = (Path(__file__).parent / "data" / "corpus.txt").read_text(encoding="utf-8")
PATHS = [pytest.param(True, id="fast"), pytest.param(False, id="generic")]
SKIPS = [pytest.param(True, id="skip"), pytest.param(False, id="keep")]


@cache
def corpus_ids(name: str) -> list[int]:
    return real_tokenizer(name).encode(CORPUS, add_special_tokens=False)


@cache
def extra_ids(name: str) -> list[int]:
    """Special and added tokens, byte-fallback pieces and a spread of vocabulary ids."""
    tok = real_tokenizer(name)
    ids = sorted(tok.special_ids)[:64]
    ids += list(range(0, tok.vocab_size, max(1, tok.vocab_size // 97)))
    for v in (0x0A, 0x20, 0x41, 0x80, 0xBD, 0xE4, 0xF0, 0x9F, 0xA0, 0xFF):
        token_id = tok.token_to_id(f"<0x{v:02X}>")
        if token_id is not None:
            ids.append(token_id)
    ids += [tok.vocab_size - 1]
    return ids


def first_break(tok: Tokenizer, prompt: list[int], gen: list[int], skip: bool) -> int | None:
    """The first k at which ``decode(prompt + gen[:k])`` stops extending the text before it."""
    prev = tok.decode(prompt, skip)
    for k in range(1, len(gen) + 1):
        cur = tok.decode(prompt + gen[:k], skip)
        if not cur.startswith(prev.rstrip(FFFD)):
            return k
        prev = cur
    return None


def check_exact(tok: Tokenizer, prompt: list[int], gen: list[int], skip: bool, fast: bool) -> None:
    pieces, tail, stream = stream_all(tok, prompt, gen, skip=skip, fast=fast)
    out = "".join(pieces) + tail
    assert stream.output == out
    usable = [i for i in prompt if tok.is_known(i)]
    head = tok.decode(usable, skip)
    full = tok.decode(usable + gen, skip)
    if not head.endswith(FFFD) and full.startswith(head) and out == full[len(head) :]:
        return
    k = first_break(tok, usable, gen, skip)
    if k is not None:
        # Non-monotonic decode: exact up to the break, never raising, self-consistent.
        emitted = "".join(pieces[: k - 1])
        expected = tok.decode(usable + gen[: k - 1], skip)[len(head.rstrip(FFFD)) :]
        assert expected.startswith(emitted) or head.endswith(FFFD)
        return
    if head.endswith(FFFD):
        # The prompt ends inside a character: whatever the generation completes is emitted
        # whole, and no prompt text is emitted again.
        assert full.endswith(out), (out, full)
        assert len(full) - len(out) >= len(head.rstrip(FFFD))
        if not fast and decode_table(tok, skip) is not None:
            # Both paths agree on what the prompt owns (the fast one works on bytes).
            fast_pieces, fast_tail, _ = stream_all(tok, prompt, gen, skip=skip, fast=True)
            assert out == "".join(fast_pieces) + fast_tail
        return
    assert out == full[len(head) :]


def _example(name: str):
    ids = corpus_ids(name)
    extras = extra_ids(name)
    n = len(ids)

    @st.composite
    def example(draw):
        a = draw(st.integers(0, n - 2))
        b = draw(st.integers(a, min(n - 1, a + 40)))
        c = draw(st.integers(b + 1, min(n, b + 64)))
        prompt, gen = list(ids[a:b]), list(ids[b:c])
        if draw(st.booleans()):
            # Mix in special/added tokens, byte pieces and arbitrary vocabulary ids.
            for part in (prompt, gen):
                for _ in range(draw(st.integers(0, 4))):
                    pos = draw(st.integers(0, len(part)))
                    part.insert(pos, draw(st.sampled_from(extras)))
        return prompt, gen

    return example()


@pytest.mark.parametrize("name", ALL_NAMES)
def test_fast_table_availability(name):
    """Context-independent decoders get a fast table (it passed its self-check); WordPiece not."""
    tok = real_tokenizer(name)
    for skip in (True, False):
        assert (decode_table(tok, skip) is None) == (name in GENERIC_ONLY)


@pytest.mark.parametrize("skip", SKIPS)
@pytest.mark.parametrize(("name", "fast"), PATH_CASES)
def test_property_exact(name, fast, skip):
    tok = real_tokenizer(name)

    @settings(max_examples=examples(120), suppress_health_check=list(HealthCheck))
    @given(_example(name))
    def run(example):
        prompt, gen = example
        check_exact(tok, prompt, gen, skip, fast)

    run()


@pytest.mark.parametrize("skip", SKIPS)
@pytest.mark.parametrize(("name", "fast"), PATH_CASES)
def test_fixed_corpus_exact(name, fast, skip):
    """Every cut of the corpus at a stride: prompt before, generation after."""
    tok = real_tokenizer(name)
    ids = corpus_ids(name)
    specials = sorted(tok.special_ids)[:3]
    for cut in range(0, len(ids), max(1, len(ids) // 40)):
        prompt = ids[max(0, cut - 24) : cut]
        gen = ids[cut : cut + 120]
        check_exact(tok, prompt, gen, skip, fast)
        if specials:
            mixed = [
                x
                for i, t in enumerate(gen)
                for x in ([t, specials[i % len(specials)]] if i % 7 == 3 else [t])
            ]
            check_exact(tok, prompt + specials[:1], mixed, skip, fast)
    # The whole corpus as one generation, no prompt.
    check_exact(tok, [], ids, skip, fast)


@pytest.mark.parametrize("skip", SKIPS)
@pytest.mark.parametrize("name", ALL_NAMES)
def test_batch_matches_streams(name, skip):
    """DecodeBatch stepping many streams together emits exactly what DecodeStream does."""
    tok = real_tokenizer(name)
    ids = corpus_ids(name)
    extras = extra_ids(name)
    streams = []
    batch = DecodeBatch(tok, skip_special_tokens=skip)
    slots = []
    gens = []
    n_streams = 48
    for j in range(n_streams):
        start = (j * 37) % (len(ids) - 100)
        prompt = ids[max(0, start - 10) : start]
        gen = ids[start : start + 60]
        if j % 5 == 0:
            gen = [
                x
                for i, t in enumerate(gen)
                for x in ([t, extras[(i + j) % len(extras)]] if i % 9 == 4 else [t])
            ][:60]
        gens.append(gen)
        streams.append(DecodeStream(tok, prompt, skip_special_tokens=skip, fast=batch.fast))
        slots.append(batch.add(prompt))
    out_batch = [[] for _ in range(n_streams)]
    out_stream = [[] for _ in range(n_streams)]
    for step in range(60):
        active = [j for j in range(n_streams) if step < len(gens[j]) and (j + step) % 11 != 0]
        texts, errors = batch.step([slots[j] for j in active], [gens[j][step] for j in active])
        assert not errors
        for j, text in zip(active, texts):
            out_batch[j].append(text)
            out_stream[j].append(streams[j].push_token(gens[j][step]))
    for j in range(n_streams):
        out_batch[j].append(batch.flush(slots[j]))
        out_stream[j].append(streams[j].flush())
        assert "".join(out_batch[j]) == "".join(out_stream[j])


@pytest.mark.parametrize("fast", PATHS)
def test_batch_ragged_and_errors(fast):
    tok = real_tokenizer("qwen3")
    batch = DecodeBatch(tok, fast=fast)
    text = "Hello 你好 👩‍👩‍👧 world"
    ids = tok.encode(text, add_special_tokens=False)
    a, b = batch.add(tok.encode("Say:")), batch.add([])
    assert len(batch) == 2
    bad = tok.model_vocab_size + 1  # past the model's vocabulary (a padding id has no text)
    # slot a gets 3 ids per step, slot b 2 then an id past the model's vocabulary.
    out = {a: [], b: []}
    pos = 0
    while pos < len(ids):
        chunk = ids[pos : pos + 3]
        texts, errors = batch.step_ragged(
            [a, b], chunk + chunk[:2], [len(chunk), min(2, len(chunk))]
        )
        assert not errors
        out[a].append(texts[0])
        out[b].append(texts[1])
        pos += 3
    texts, errors = batch.step_ragged([a, b], [ids[0], ids[1], bad], [1, 2])
    assert set(errors) == {1} and "detokenize failed" in str(errors[1])
    assert texts[0] == tok.decode([ids[0]])
    assert "".join(out[a]) + batch.flush(a) == text
    batch.remove(a)
    slot_c = batch.add([])
    assert slot_c == a  # reused
    texts, errors = batch.step([slot_c], [bad])
    assert texts == [""] and 0 in errors


@pytest.mark.parametrize("skip", SKIPS)
@pytest.mark.parametrize("name", ALL_NAMES)
def test_push_into_gives_each_tokens_text_as_push_does(name, skip):
    """``push_into`` (a request's several tokens of one step) appends what ``push`` returns
    token by token; an id the tokenizer cannot map raises with the texts before it appended,
    and the slot goes on as ``push`` leaves it."""
    tok = real_tokenizer(name)
    ids = corpus_ids(name)[:200]
    extras = extra_ids(name)
    gen = [
        x for i, t in enumerate(ids) for x in ([t, extras[i % len(extras)]] if i % 9 == 4 else [t])
    ]
    one, many = (
        DecodeBatch(tok, skip_special_tokens=skip),
        DecodeBatch(tok, skip_special_tokens=skip),
    )
    a, b = one.add(ids[:5]), many.add(ids[:5])
    expected = [one.push(a, t) for t in gen]
    got: list[str] = []
    for k in range(0, len(gen), 7):
        many.push_into(b, gen[k : k + 7], got)
    assert got == expected
    assert many.flush(b) == one.flush(a)
    bad = tok.model_vocab_size + 1
    c, d = one.add(ids[:3]), many.add(ids[:3])
    before = [one.push(c, t) for t in ids[3:6]]
    partial: list[str] = []
    with pytest.raises(DecodeError):
        many.push_into(d, [*ids[3:6], bad, ids[6]], partial)
    assert partial == before
    assert many.push(d, ids[6]) == one.push(c, ids[6])


def _byte_ids(tok: Tokenizer) -> list[int] | None:
    """The id of each single-byte token (byte fallback ``<0xNN>`` or byte-level), or None."""
    fallback = [tok.token_to_id(f"<0x{v:02X}>") for v in range(256)]
    if all(i is not None for i in fallback):
        return fallback  # type: ignore[return-value]
    chars = _bytes_to_unicode()
    level = [tok.token_to_id(chars[v]) for v in range(256)]
    return level if all(i is not None for i in level) else None  # type: ignore[return-value]


#: Tokenizers with single-byte tokens, so a prompt can end inside a character (not WordPiece).
BYTE_CASES = [c for c in PATH_CASES if c.values[0] not in GENERIC_ONLY]


@pytest.mark.parametrize(("name", "fast"), BYTE_CASES)
def test_prompt_ending_mid_character_is_never_re_emitted(name, fast):
    """A prompt whose last byte tokens are ASCII bytes, then the first bytes of a character:
    generation completes the character, which comes out whole, and nothing of the prompt again
    (on the generic path too, where byte fallback decodes such a run as U+FFFD throughout)."""
    tok = real_tokenizer(name)
    byte_ids = _byte_ids(tok)
    assert byte_ids is not None, f"{name} has no single-byte tokens"
    ids = corpus_ids(name)

    @settings(max_examples=examples(60), suppress_health_check=list(HealthCheck))
    @given(
        st.integers(0, len(ids) - 80),
        st.integers(0, 30),
        st.text(alphabet="ABz 1.", max_size=3),
        st.sampled_from(["你", "é", "👋", "€", "ψ", "漢"]),
        st.data(),
    )
    def run(a, length, ascii_run, char, data):
        raw = char.encode("utf-8")
        cut = data.draw(st.integers(1, len(raw) - 1))
        b = a + length
        head = list(ids[a:b]) + [byte_ids[v] for v in ascii_run.encode()]
        prompt = head + [byte_ids[v] for v in raw[:cut]]
        gen = [byte_ids[v] for v in raw[cut:]] + list(ids[b : b + data.draw(st.integers(0, 20))])
        through_char = tok.decode(head + [byte_ids[v] for v in raw])
        full = tok.decode(prompt + gen)
        assume(through_char.endswith(char) and full.startswith(through_char))
        pieces, tail, _ = stream_all(tok, prompt, gen, fast=fast)
        out = "".join(pieces) + tail
        assert out == full[len(through_char) - len(char) :], (prompt, gen)

    run()
