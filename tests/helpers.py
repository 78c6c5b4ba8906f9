"""Test helpers: a strict byte-level test tokenizer and reference expectations from ``decode``."""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from tokenwire import DecodeStream, Tokenizer
from tokenwire.detok.tables import _bytes_to_unicode

FFFD = "\ufffd"

#: ids 0..255 are the bytes, 256 is a special ``<eos>``, 257 an added non-special ``<tool>``;
#: the "model" has 300 embedding rows, so 258..299 are valid prompt ids the tokenizer cannot map.
BYTE_EOS = 256
BYTE_TOOL = 257
BYTE_MODEL_VOCAB = 300


def byte_tokenizer() -> Tokenizer:
    """A byte-level BPE tokenizer whose token ``b`` is the byte ``b`` (no merges)."""
    chars = _bytes_to_unicode()
    vocab = {chars[b]: b for b in range(256)}
    hf = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(["<eos>"])
    hf.add_tokens(["<tool>"])
    return Tokenizer(
        hf, {"eos_token": "<eos>"}, model_vocab_size=BYTE_MODEL_VOCAB, name="byte-test"
    )


def b(text: str | bytes) -> list[int]:
    """Ids of ``text``'s UTF-8 bytes on the byte tokenizer."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return list(data)


def stream_all(
    tok: Tokenizer,
    prompt: Sequence[int],
    gen: Sequence[int],
    *,
    skip: bool = True,
    fast: bool | None = None,
) -> tuple[list[str], str, DecodeStream]:
    """Push every id of ``gen``; return (pieces, flushed tail, stream)."""
    stream = DecodeStream(tok, prompt, skip_special_tokens=skip, fast=fast)
    pieces = [stream.push_token(i) for i in gen]
    tail = stream.flush()
    return pieces, tail, stream


def expected_delta(tok: Tokenizer, prompt: Sequence[int], gen: Sequence[int], skip: bool) -> str:
    """What the stream must emit: ``decode(prompt + gen)`` minus the decoded prompt (prompt ids the
    tokenizer cannot map are dropped, as for prompt context)."""
    usable = [i for i in prompt if tok.is_known(i)]
    full = tok.decode(usable + list(gen), skip)
    head = tok.decode(usable, skip)
    assert full.startswith(head), (head, full)
    return full[len(head) :]
