"""DecodeStream behaviour, case by case, on both the fast (table) and the generic (window) path."""

from __future__ import annotations

import copy

import pytest

from tokenwire import DecodeError, DecodeStream, Tokenizer
from tokenwire.detok.stream import _MAX_WINDOW, MAX_HOLD_TOKENS
from tokenwire.detok.tables import _bytes_to_unicode, decode_table

from conftest import PATH_CASES, real_tokenizer
from helpers import (
    BYTE_EOS,
    BYTE_MODEL_VOCAB,
    BYTE_TOOL,
    FFFD,
    b,
    byte_tokenizer,
    expected_delta,
    stream_all,
)

PATHS = [pytest.param(True, id="fast"), pytest.param(False, id="generic")]


@pytest.fixture(scope="module")
def btok() -> Tokenizer:
    return byte_tokenizer()


def test_byte_tokenizer_has_a_fast_table(btok):
    assert DecodeStream(btok).fast
    assert not DecodeStream(btok, fast=False).fast


@pytest.mark.parametrize("fast", PATHS)
def test_streams_exact_text(btok, fast):
    text = "Hi 你好 👩‍👩‍👧 ok\n\n  x"
    pieces, tail, stream = stream_all(btok, b("> "), b(text), fast=fast)
    assert "".join(pieces) + tail == text
    assert stream.output == text
    # A multi-byte character appears whole, on the token that completes it.
    i = len(b("Hi "))
    assert pieces[i : i + 3] == ["", "", "你"]


@pytest.mark.parametrize("fast", PATHS)
def test_prompt_ending_inside_a_character_is_not_emitted_again(btok, fast):
    # vLLM #48853: prompt bytes "H i E4 BD", then A0, must give "你", not "Hi你".
    pieces, tail, _ = stream_all(btok, [*b("Hi"), 0xE4, 0xBD], [0xA0], fast=fast)
    assert pieces == ["你"] and tail == ""


@pytest.mark.parametrize("fast", PATHS)
def test_straddling_character_is_emitted_whole_in_the_first_chunk(btok, fast):
    pieces, tail, _ = stream_all(btok, [*b("Hello"), 0xE4], [0xBD, 0xA0, *b("!")], fast=fast)
    assert pieces == ["", "你", "!"] and tail == ""


@pytest.mark.parametrize("fast", PATHS)
def test_prompt_partial_character_never_completed(btok, fast):
    # The prompt's own U+FFFD belongs to the prompt: decode(prompt + gen) minus decode(prompt).
    prompt = [*b("Hi"), 0xE4, 0xBD]
    pieces, tail, _ = stream_all(btok, prompt, b("A b"), fast=fast)
    assert "".join(pieces) + tail == "A b" == expected_delta(btok, prompt, b("A b"), True)
    pieces, tail, _ = stream_all(btok, prompt, [], fast=fast)
    assert pieces == [] and tail == ""


@pytest.mark.parametrize("fast", PATHS)
def test_suffix_seed_with_an_unknown_id(btok, fast):
    prompt = [*b("Hello world"), 270, *b("ab")]
    stream = DecodeStream(btok, prompt, fast=fast)
    assert not stream.prefix_seeded
    assert stream.push_token(ord(" ")) == " "
    assert stream.prefix_seeded
    assert stream.push_tokens(b("ok")) + stream.flush() == "ok"


@pytest.mark.parametrize("fast", PATHS)
def test_all_unknown_prompt(btok, fast):
    pieces, tail, stream = stream_all(btok, list(range(260, 268)), b("hi 你"), fast=fast)
    assert "".join(pieces) + tail == "hi 你"
    assert stream.prefix_seeded


@pytest.mark.parametrize("fast", PATHS)
def test_unknown_id_before_incomplete_utf8(btok, fast):
    pieces, tail, _ = stream_all(btok, [*b("Hi"), 290, 0xE4, 0xBD], [0xA0, *b("!")], fast=fast)
    assert pieces == ["你", "!"] and tail == ""


@pytest.mark.parametrize("fast", PATHS)
def test_incomplete_utf8_before_filtered_ids(btok, fast):
    pieces, tail, _ = stream_all(btok, [*b("Hi"), 0xE4, 0xBD, 280, 281], [0xA0], fast=fast)
    assert pieces == ["你"] and tail == ""


@pytest.mark.parametrize("fast", PATHS)
def test_decode_prompt_context(btok, fast):
    stream = DecodeStream(btok, fast=fast)
    assert stream.decode_prompt_context([*b("ab"), 270, *b("c")]) == ("abc", [*b("ab"), *b("c")])
    assert stream.decode_prompt_context(b("xyz")) == ("xyz", b("xyz"))
    assert stream.decode_prompt_context([270, 271]) == ("", [])


@pytest.mark.parametrize("padding", ["error", "empty"])
@pytest.mark.parametrize("fast", PATHS)
def test_generated_id_past_the_model_vocabulary_is_an_error(btok, fast, padding):
    stream = DecodeStream(btok, b("prompt"), fast=fast, padding=padding)
    assert stream.push_token(ord("a")) == "a"
    with pytest.raises(DecodeError, match=str(BYTE_MODEL_VOCAB)):
        stream.push_token(BYTE_MODEL_VOCAB)
    with pytest.raises(DecodeError, match="-3"):
        stream.push_token(-3)
    # The stream is unharmed: the bad id was not taken.
    assert stream.push_token(ord("b")) == "b"
    assert stream.output == "ab"


@pytest.mark.parametrize("fast", PATHS)
def test_generated_padding_id_is_an_error_by_default(btok, fast):
    """The seed's contract: a generated id the tokenizer cannot map raises, even one the model has
    (a padding row), first or later, and the stream is left as it was."""
    stream = DecodeStream(btok, b("prompt"), fast=fast)
    assert stream.padding == "error"
    with pytest.raises(DecodeError, match=r"270.*padding='empty'"):
        stream.push_token(270)  # before the prompt is taken in
    assert stream.push_token(ord("a")) == "a"
    e4, bd, a0 = b("你")
    assert stream.push_token(e4) == ""
    for bad in (270, BYTE_MODEL_VOCAB - 1):
        with pytest.raises(DecodeError, match=str(bad)):
            stream.push_token(bad)  # inside a character
    assert [stream.push_token(i) for i in (bd, a0)] == ["", "你"]
    assert stream.flush() == "" and stream.output == "a你"
    # Prompt ids it cannot map are still only dropped from the context.
    assert DecodeStream(btok, [*b("p"), 270], fast=fast).push_token(ord("x")) == "x"


def test_padding_mode_is_checked(btok):
    with pytest.raises(ValueError, match="padding"):
        DecodeStream(btok, padding="skip")
    stream = copy.copy(DecodeStream(btok, padding="empty"))
    assert stream.padding == "empty" and stream.push_token(270) == ""


@pytest.mark.parametrize("fast", PATHS)
def test_generated_padding_id_decodes_as_nothing(btok, fast):
    """With ``padding="empty"``, an id below the model's vocabulary size that the tokenizer lacks
    is no text (vLLM's answer), between characters or inside one, first or later."""
    stream = DecodeStream(btok, b("prompt"), fast=fast, padding="empty")
    assert [stream.push_token(i) for i in (270, *b("a"), BYTE_MODEL_VOCAB - 1)] == ["", "a", ""]
    e4, bd, a0 = b("你")
    assert [stream.push_token(i) for i in (e4, 270, bd, 299, a0)] == ["", "", "", "", "你"]
    assert stream.flush() == "" and stream.output == "a你"


@pytest.mark.parametrize("fast", PATHS)
@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(btok, fast, skip):
    gen = [*b("a"), BYTE_EOS, 0xE4, BYTE_EOS, 0xBD, 0xA0, BYTE_TOOL, *b("z"), BYTE_EOS]
    pieces, tail, _ = stream_all(btok, b("p"), gen, skip=skip, fast=fast)
    assert "".join(pieces) + tail == expected_delta(btok, b("p"), gen, skip)
    if skip:
        assert "".join(pieces) == "a你<tool>z"


@pytest.mark.parametrize("fast", PATHS)
def test_incomplete_tail_flushes_as_replacement(btok, fast):
    pieces, tail, _ = stream_all(btok, b("x"), [*b("ok"), 0xF0, 0x9F, 0x98], fast=fast)
    assert "".join(pieces) == "ok" and tail == FFFD


@pytest.mark.parametrize("fast", PATHS)
def test_invalid_bytes_are_exact_when_isolated(btok, fast):
    gen = [*b("ab"), 0x80, 0xFF, 0xC0, *b("cd"), 0xE4, *b("e")]
    pieces, tail, _ = stream_all(btok, b("p"), gen, fast=fast)
    assert "".join(pieces) + tail == expected_delta(btok, b("p"), gen, True)
    assert "".join(pieces) + tail == f"ab{FFFD * 3}cd{FFFD}e"


@pytest.mark.parametrize("fast", PATHS)
def test_push_tokens_and_output(btok, fast):
    stream = DecodeStream(btok, b("p"), fast=fast)
    assert stream.output == ""
    assert stream.push_tokens(b("héllo ")) == "héllo "
    assert stream.push_tokens([0xE4, 0xBD]) == ""
    assert stream.push_tokens([0xA0]) == "你"
    assert stream.output == "héllo 你"


def test_empty_prompt_is_seeded_from_the_start(btok):
    assert DecodeStream(btok).prefix_seeded
    assert not DecodeStream(btok, [1]).prefix_seeded


class CountingHF:
    """Delegates to a ``tokenizers.Tokenizer`` and counts what ``decode`` is asked to do."""

    def __init__(self, hf):
        self._hf = hf
        self.calls = 0
        self.ids = 0

    def decode(self, ids, skip_special_tokens=True):
        self.calls += 1
        self.ids += len(ids)
        return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def __getattr__(self, name):
        return getattr(self._hf, name)


def _counting(tok: Tokenizer) -> CountingHF:
    decode_table(tok, True)
    decode_table(tok, False)
    counter = CountingHF(tok._tok)
    tok._tok = counter
    return counter


@pytest.mark.parametrize("fast", PATHS)
@pytest.mark.parametrize("kind", ["invalid-bytes", "skipped-specials", "incomplete-leads"])
def test_long_runs_cost_linear_work(fast, kind):
    tok = byte_tokenizer()
    counter = _counting(tok)
    n = 20000
    gen = {
        "invalid-bytes": [0x80] * n,
        "skipped-specials": [BYTE_EOS] * n,
        "incomplete-leads": [0xE4, 0xBD] * (n // 2),
    }[kind]
    stream = DecodeStream(tok, b("prompt text"), fast=fast)
    for i in gen:
        stream.push_token(i)
        if fast:
            assert len(stream._pending) <= 3
    stream.push_tokens(b("end"))
    stream.flush()
    if fast:
        assert counter.calls == 0  # no tokenizer call per token on the fast path
    else:
        # Each decode covers a bounded window: total work is linear in the stream length
        # (a quadratic algorithm would decode ~n * n / 2 = 2e8 ids here).
        assert counter.ids <= (_MAX_WINDOW + MAX_HOLD_TOKENS + 2) * (n + 3)
        assert counter.calls <= 3 * (n + 3)
    assert stream.output.endswith("end")
    if kind == "skipped-specials":
        assert stream.output == "end"
    else:
        assert set(stream.output[:-3]) == {FFFD}


@pytest.mark.parametrize("fast", PATHS)
def test_hold_limit_does_not_break_a_character_completed_late(btok, fast):
    # More invalid bytes than the generic path holds, then a character split over three tokens.
    gen = [0x80] * (MAX_HOLD_TOKENS + 3) + [0xE4, 0xBD, 0xA0] + b("x")
    pieces, tail, _ = stream_all(btok, b("p"), gen, fast=fast)
    assert "".join(pieces) + tail == expected_delta(btok, b("p"), gen, True)


# ---- real tokenizers whose model vocabulary is larger than the tokenizer -------------------------

BIG_MODEL_VOCAB = ["qwen3", "deepseek_v3", "gemma3", "gptoss"]


def byte_token(tok: Tokenizer, value: int) -> int:
    """The id of the single-byte token for ``value`` (ByteLevel or byte-fallback vocabularies)."""
    for piece in (f"<0x{value:02X}>", _bytes_to_unicode()[value]):
        token_id = tok.token_to_id(piece)
        if token_id is not None:
            return token_id
    raise AssertionError(f"no byte token for {value:#x}")


@pytest.mark.parametrize("fast", PATHS)
@pytest.mark.parametrize("name", BIG_MODEL_VOCAB)
def test_seed_cases_on_real_tokenizers(name, fast):
    tok = real_tokenizer(name)
    if fast and decode_table(tok, True) is None:
        pytest.fail(f"{name} should have a fast table")
    unk = list(range(tok.vocab_size, tok.model_vocab_size))
    assert len(unk) > 10
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    e4, bd, a0 = (byte_token(tok, v) for v in (0xE4, 0xBD, 0xA0))

    # suffix seed with an unknown id
    prompt = enc("Hello world, this is") + [unk[3]] + enc(" a")
    gen = enc(" test of streaming, 你好 👋")
    pieces, tail, _ = stream_all(tok, prompt, gen, fast=fast)
    assert "".join(pieces) + tail == expected_delta(tok, prompt, gen, True)

    # all-unknown prompt
    pieces, tail, _ = stream_all(tok, unk[:7], gen, fast=fast)
    assert "".join(pieces) + tail == tok.decode(gen)

    # unknown id before incomplete UTF-8
    pieces, tail, _ = stream_all(tok, [*enc("Hi"), unk[0], e4, bd], [a0, *enc("!")], fast=fast)
    assert pieces[0] == "你" and "".join(pieces) + tail == "你!"

    # incomplete UTF-8 before filtered ids
    pieces, tail, _ = stream_all(tok, [*enc("Hi"), e4, bd, unk[1], unk[-1]], [a0], fast=fast)
    assert pieces == ["你"] and tail == ""

    # the seed's contract: a generated id the tokenizer cannot map raises by default, even one
    # the model has (generated_unknown_ids_still_return_decode_error)
    stream = DecodeStream(tok, prompt, fast=fast)
    with pytest.raises(DecodeError, match=str(tok.vocab_size + 5)):
        stream.push_token(tok.vocab_size + 5)
    assert stream.push_tokens(gen) + stream.flush() == expected_delta(tok, prompt, gen, True)

    # with padding="empty", a generated id the model has and the tokenizer lacks (a padding row)
    # is no text, as vLLM decodes it, and leaves the stream as it was; one past the model's
    # vocabulary is an error
    stream = DecodeStream(tok, prompt, fast=fast, padding="empty")
    stream.push_tokens(gen[:3])
    assert stream.push_token(unk[5]) == "" and stream.push_token(unk[-1]) == ""
    with pytest.raises(DecodeError, match=str(tok.model_vocab_size)):
        stream.push_token(tok.model_vocab_size)
    assert stream.push_tokens(gen[3:]) + stream.flush() == expected_delta(
        tok, prompt + gen[:3], gen[3:], True
    )
    # ... also as the first generated id (before the prompt is taken in) and inside a character
    stream = DecodeStream(tok, [*enc("Hi"), e4], fast=fast, padding="empty")
    assert stream.push_token(unk[0]) == "" and stream.push_token(bd) == ""
    assert stream.push_token(unk[1]) == "" and stream.push_token(a0) == "你"


@pytest.mark.parametrize("fast", PATHS)
@pytest.mark.parametrize("name", ["gemma3", "llama2"])
def test_non_monotonic_byte_fallback_never_raises_or_garbles(name, fast):
    # A valid byte-fallback run turned invalid by one more byte: tokenizers' decode rewrites the
    # whole run as U+FFFD (HF's DecodeStream raises "Invalid prefix encountered" here).
    tok = real_tokenizer(name)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    run = [byte_token(tok, v) for v in (0xE4, 0xBD, 0xA0)]
    prompt = enc("Say:")
    before = enc(" ok")
    after = enc(" Hello there")
    stream = DecodeStream(tok, prompt, fast=fast)
    out_before = stream.push_tokens(before + run)
    assert out_before == expected_delta(tok, prompt, before, True) + "你"
    rest = stream.push_token(byte_token(tok, 0x80))
    rest += stream.push_tokens(after) + stream.flush()
    assert stream.output == out_before + rest
    head = tok.decode(prompt + before + run + [byte_token(tok, 0x80)])
    exact_after = tok.decode(prompt + before + run + [byte_token(tok, 0x80)] + after)[len(head) :]
    assert rest.endswith(exact_after)
    assert set(rest[: len(rest) - len(exact_after)]) <= {FFFD}


@pytest.mark.parametrize("fast", PATHS)
def test_llama2_leading_space_strip(fast):
    tok = real_tokenizer("llama2")
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    gen = enc("Hello world")
    # Empty prompt and a prompt of only special tokens: the decoder strips the first space.
    for prompt in ([], [tok.bos_token_id], [tok.bos_token_id] * 7):
        pieces, tail, _ = stream_all(tok, prompt, gen, fast=fast)
        assert "".join(pieces) + tail == tok.decode(prompt + gen) == "Hello world"
    # A prompt with text: the generated text keeps its leading space.
    pieces, tail, _ = stream_all(tok, [tok.bos_token_id, *enc("Hi")], gen, fast=fast)
    assert "".join(pieces) + tail == " Hello world"
    # Special tokens kept: "<s>" is text, so nothing is stripped from the generation.
    pieces, tail, _ = stream_all(tok, [tok.bos_token_id], gen, skip=False, fast=fast)
    assert "".join(pieces) + tail == expected_delta(tok, [tok.bos_token_id], gen, False)


def test_a_long_prompt_is_not_walked_for_the_leading_space_strip(monkeypatch):
    """Whether Llama 2's leading-space strip is still to do after a prompt is decided by the
    prompt's first usable ids: the first push after an 8,000-id prompt looks up the class of a
    bounded number of ids (it looked up all 8,000, about 0.35 ms a request, before), and the
    text is the same."""
    tok = real_tokenizer("llama2")
    table = decode_table(tok, True)
    assert table is not None and table.strip_start
    prompt = tok.encode("The quick brown fox. " * 2000, add_special_tokens=True)[:8000]
    gen = tok.encode("Hello world", add_special_tokens=False)

    class Counting(list):
        looked = 0

        def __getitem__(self, i):
            Counting.looked += 1
            return super().__getitem__(i)

    monkeypatch.setattr(table, "cls_list", Counting(table.cls_list))
    pieces, tail, _ = stream_all(tok, prompt, gen, fast=True)
    assert "".join(pieces) + tail == expected_delta(tok, prompt, gen, True) == " Hello world"
    assert 0 < Counting.looked < 500


@pytest.mark.parametrize(("name", "fast"), PATH_CASES)
@pytest.mark.parametrize("fork_at", [0, 1, 3])
def test_copy_forks_an_independent_stream(name, fast, fork_at):
    tok = real_tokenizer(name)
    if fast and decode_table(tok, True) is None:
        pytest.skip(f"{name} has no fast table")
    prompt = tok.encode("Translate: 你好", add_special_tokens=False)
    first = tok.encode(" 世界 and more 👋🏽 text", add_special_tokens=False)
    second = tok.encode(" ünïcödé, then 漢字!", add_special_tokens=False)
    common = first[:fork_at]
    stream = DecodeStream(tok, prompt, fast=fast)
    head = "".join(stream.push_token(t) for t in common)
    forks = [copy.copy(stream), copy.deepcopy(stream), stream]
    for fork, rest in zip(forks, (first[fork_at:], second[fork_at:], second[fork_at:])):
        text = head + "".join(fork.push_token(t) for t in rest) + fork.flush()
        assert text == expected_delta(tok, prompt, common + rest, True), (name, fast)
        assert fork.output == text
