"""``DecodeStream``: generated token ids in, exactly the text ``decode`` would give out, one token
at a time, with the prompt as left context."""

from __future__ import annotations

from codecs import utf_8_decode as _utf8_decode
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from tokenwire.detok.tables import (
    BYTE,
    BYTELEVEL,
    EMPTY,
    UNKNOWN,
    DecodeTable,
    decode_table,
    utf8_feed,
)
from tokenwire.messages.errors import DecodeError

if TYPE_CHECKING:
    from tokenwire.tokenizer import Tokenizer

__all__ = ["MAX_HOLD_TOKENS", "PADDING_MODES", "SAFE_SUFFIX_MAX", "SAFE_SUFFIX_MIN", "DecodeStream"]

#: What a generated id the tokenizer cannot map but the model has (a padding row of the embedding,
#: ``[vocab_size, model_vocab_size)``) does: ``"error"`` raises ``DecodeError`` (the default, as
#: for any id the tokenizer cannot map), ``"empty"`` decodes it as no text (vLLM's answer).
PADDING_MODES = ("error", "empty")

#: Fewest prompt tokens (after dropping the ones that cannot be decoded) used as left context.
SAFE_SUFFIX_MIN = 4
#: Longest prompt suffix tried before falling back to the whole prompt.
SAFE_SUFFIX_MAX = 6
#: Tokens the generic path holds back waiting for a character to complete; past this the text is
#: emitted as it decodes (invalid bytes as U+FFFD), which keeps every step's work bounded.
MAX_HOLD_TOKENS = 8
#: Generic path: the longest decode window (only invalid byte runs make it grow past a few tokens).
_MAX_WINDOW = 64
#: Generic path: windows of at most this many ids have their decode memoised (per tokenizer).
_MEMO_WINDOW = 3
#: Generic path: the memo is cleared when it reaches this many windows.
_MEMO_MAX = 1 << 17
#: Generic path: consumed ids are dropped from the front of the id list past this many.
_TRIM_AT = 256
#: Fast path: the (pending bytes, token) memo is cleared when it reaches this many entries.
_FEED_MEMO_MAX = 1 << 16
#: Fast path: prompt bytes looked at to find a partial character at the prompt's end.
_TAIL_BYTES = 8
#: Fast path: bytes of a prompt's trailing byte-fallback run looked at.
_MAX_RUN_LOOKBACK = 256
#: Fast path: prompt tokens looked at to see whether the leading-space strip is done.
_STRIP_LOOKAHEAD = 64

_REPLACEMENT = "\ufffd"
_FFFD_BYTES = _REPLACEMENT.encode("utf-8")


def _unknown_id(token_id: int, model_vocab_size: int) -> DecodeError:
    return DecodeError(
        f"generated token id {token_id} is outside the model's vocabulary "
        f"(its ids are 0..{model_vocab_size - 1})"
    )


def _padding_id(token_id: int) -> DecodeError:
    return DecodeError(
        f"generated token id {token_id} is in the model's vocabulary but the tokenizer cannot "
        "map it (a padding row; padding='empty' decodes such ids as no text)"
    )


class DecodeStream:
    """Incremental detokenizer for one request.

    ``push_token(id)`` returns the text that token completes (``""`` while a character is still
    partial), ``flush()`` whatever is held at the end of the stream. Concatenated, the pieces equal
    ``tokenizer.decode(prompt + generated)`` minus the decoded prompt. Prompt ids the tokenizer
    cannot map are dropped from the context; a generated id it cannot map raises ``DecodeError``
    (the stream is left as it was). ``padding`` chooses what a generated id the model has but the
    tokenizer lacks does (a padding row, ``[vocab_size, model_vocab_size)``, which random or
    untrained weights sample): ``"error"`` (the default) raises like any other unknown id,
    ``"empty"`` decodes it as no text, as vLLM does. An id past the model's vocabulary always
    raises.

    Tokenizers whose decoder is context-independent use precomputed per-token tables (no tokenizer
    call per token); any other decoder uses a generic sliding-window algorithm over ``decode``.
    ``fast=False`` forces the generic path.
    """

    __slots__ = (
        "_tok",
        "_prompt",
        "_skip",
        "_table",
        "_parts",
        "prefix_seeded",
        "_pad_empty",
        # fast path
        "_pending",
        "_ppend",
        "_run_bad",
        "_strip_left",
        "_irregular",
        # generic path
        "_ids",
        "_start",
        "_read",
        "_text",
        "_ctx_tail",
        "_g",
    )

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Iterable[int] = (),
        *,
        skip_special_tokens: bool = True,
        fast: bool | None = None,
        padding: str = "error",
    ) -> None:
        if padding not in PADDING_MODES:
            raise ValueError(f"padding must be one of {PADDING_MODES}, got {padding!r}")
        self._pad_empty = padding == "empty"
        self._tok = tokenizer
        tolist = getattr(prompt_token_ids, "tolist", None)  # numpy arrays
        self._prompt: list[int] = tolist() if tolist is not None else list(prompt_token_ids)
        self._skip = skip_special_tokens
        table = decode_table(tokenizer, skip_special_tokens) if fast is not False else None
        if fast and table is None:
            raise ValueError(f"{tokenizer.name} has no fast decode table")
        self._table: DecodeTable | None = table
        self._parts: list[str] = []
        #: Whether the prompt context has been taken in (it is, lazily, on the first push).
        self.prefix_seeded: bool = not self._prompt
        self._pending = b""
        self._ppend = 0
        self._run_bad = False
        self._strip_left = table.strip_start if table is not None else 0
        self._irregular = True
        self._ids: list[int] = []
        self._start = 0
        self._read = 0
        self._text = ""
        self._ctx_tail = 0
        self._g = _GenericShared.of(tokenizer, skip_special_tokens) if table is None else None

    # ---- public API ------------------------------------------------------------------------------

    def __copy__(self) -> DecodeStream:
        """An independent stream in the same state, sharing only the tokenizer and its tables (as
        HF's ``DecodeStream`` allows): fork a stream, e.g. for ``n`` choices of one prompt."""
        cls = type(self)
        new = cls.__new__(cls)
        for name in DecodeStream.__slots__:
            setattr(new, name, getattr(self, name))
        new._parts = list(self._parts)
        new._prompt = list(self._prompt)
        new._ids = new._prompt if self._ids is self._prompt else list(self._ids)
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> DecodeStream:
        """Same as ``copy.copy``: the state is copied, the tokenizer (read-only) is shared."""
        return self.__copy__()

    @property
    def fast(self) -> bool:
        """Whether this stream uses the precomputed tables."""
        return self._table is not None

    @property
    def padding(self) -> str:
        """What a generated padding id does: ``"error"`` or ``"empty"``."""
        return "empty" if self._pad_empty else "error"

    @property
    def output(self) -> str:
        """All text emitted so far."""
        parts = self._parts
        if len(parts) > 1:
            joined = "".join(parts)
            parts[:] = [joined]
        return parts[0] if parts else ""

    def push_token(self, token_id: int) -> str:
        """Take one generated id; return the text it completes."""
        table = self._table
        if table is not None:
            if not self._irregular and 0 <= token_id < table.size:
                s = table.tok_str[token_id]
                if s is not None:
                    if s:
                        self._parts.append(s)
                    return s
            text = self._push_fast(token_id)
        else:
            if not self._irregular:
                # The common generic step, inline: the window is the last emitted token plus this
                # one, and their decode is memoised.
                g = self._g
                ids = self._ids
                if 0 <= token_id < g.vocab_size and g.plain[token_id]:
                    new = g.pairs.get(ids[-1] * g.vocab_size + token_id)
                    if new is not None:
                        text = self._text
                        if len(new) > len(text) and new.startswith(text):
                            ids.append(token_id)
                            self._start += 1
                            self._read += 1
                            self._text = g.single[token_id]
                            if self._start > _TRIM_AT:
                                self._trim()
                            text = new[len(text) :]
                            self._parts.append(text)
                            return text
            text = self._push_generic(token_id)
        if text:
            self._parts.append(text)
        return text

    def push_tokens(self, token_ids: Iterable[int]) -> str:
        """Take several generated ids; return the text they complete."""
        return "".join([self.push_token(i) for i in token_ids])

    def flush(self) -> str:
        """End of stream: return whatever is still held (an incomplete character as U+FFFD)."""
        if not self.prefix_seeded:
            self._seed()
        if self._table is not None:
            text = self._flush_fast()
        else:
            text = self._emit_generic(final=True)
        if text:
            self._parts.append(text)
        return text

    # ---- prompt context --------------------------------------------------------------------------

    def decode_prompt_context(self, ids: Sequence[int]) -> tuple[str, list[int]]:
        """Decode prompt-only context: ``(text, ids used)``. Ids the tokenizer cannot map are
        dropped and the decode retried (prompt context only; generated ids stay strict); if none
        could be dropped the original error is raised. Special tokens that decoding skips are
        dropped too: they cannot change the text."""
        tok = self._tok
        try:
            text = tok.decode(ids, self._skip)
            used = list(ids)
        except DecodeError:
            used = [i for i in ids if tok.id_to_token(i) is not None]
            if len(used) == len(ids):
                raise
            text = tok.decode(used, self._skip)
        if self._skip:
            special = tok.special_ids
            used = [i for i in used if i not in special]
        return text, used

    def _seed(self) -> None:
        if self._table is not None:
            self._seed_fast()
        else:
            self._seed_generic()
        self.prefix_seeded = True

    def _lacked(self, token_id: int) -> str:
        """A generated id the tokenizer cannot map: ``DecodeError``, or no text for a padding row
        with ``padding="empty"``. The stream's state is left as it was."""
        tok = self._tok
        model_vocab = tok.model_vocab_size
        if 0 <= token_id < model_vocab:
            if self._pad_empty:
                return ""
            raise _padding_id(token_id)
        raise _unknown_id(token_id, model_vocab)

    # ---- fast path -------------------------------------------------------------------------------

    def _seed_fast(self) -> None:
        table = self._table
        assert table is not None
        cls = table.cls_list
        n = table.size
        tb = table.tok_bytes
        prompt = self._prompt
        # Only the prompt's end matters (a partial character, an open byte-fallback run), so walk
        # back from it over the ids that contribute bytes.
        tail = b""
        k = len(prompt)
        while k > 0:
            k -= 1
            i = prompt[k]
            if not 0 <= i < n:
                continue
            c = cls[i]
            if c in (UNKNOWN, EMPTY):
                continue
            if table.kind == BYTELEVEL:
                tail = tb[i] + tail
                if len(tail) >= _TAIL_BYTES:
                    break
            elif c != BYTE or len(tail) >= _MAX_RUN_LOOKBACK:
                break
            else:
                tail = tb[i] + tail
        if table.kind == BYTELEVEL:
            self._pending = utf8_feed(b"", tail)[1]
        else:
            try:
                self._pending = tail[_utf8_decode(tail, "strict", False)[1] :]
            except UnicodeDecodeError:
                self._run_bad = True
            if self._strip_left:
                # (only the prompt's first usable ids decide it: a long prompt is not walked)
                usable = list(
                    islice(
                        (i for i in prompt if 0 <= i < n and cls[i] != UNKNOWN and cls[i] != EMPTY),
                        _STRIP_LOOKAHEAD,
                    )
                )
                self._strip_left = self._strip_after(usable)
        # Bytes of a character the prompt left unfinished: the character is emitted whole if the
        # generation completes it; if not, its U+FFFD belongs to the prompt's text.
        self._ppend = len(self._pending)
        self._irregular = bool(self._pending) or self._strip_left > 0 or self._run_bad

    def _strip_after(self, usable: list[int]) -> int:
        """How much of the leading-space strip is still to do after the prompt's text."""
        table = self._table
        assert table is not None
        need = self._strip_left
        for ch in table.decode_unstripped(usable[:_STRIP_LOOKAHEAD]):
            if ch != " " or need == 0:
                return 0
            need -= 1
        return need

    def _push_fast(self, token_id: int) -> str:
        table = self._table
        assert table is not None
        if not self.prefix_seeded:
            self._seed()
        if not 0 <= token_id < table.size or table.cls_list[token_id] == UNKNOWN:
            return self._lacked(token_id)
        c = table.cls_list[token_id]
        if c == EMPTY:
            return ""
        if table.kind == BYTELEVEL:
            if self._ppend:
                text = self._feed_lossy(table.tok_bytes[token_id])
            else:
                text, self._pending = _memo_step(table, self._pending, token_id, utf8_feed)
        elif c == BYTE:
            if self._run_bad or self._strip_left or self._ppend:
                text = self._feed_run(table.tok_bytes[token_id])
            else:
                text, self._pending, bad = _memo_step(table, self._pending, token_id, _run_step)
                if bad:
                    self._run_bad = True
        else:
            text = table.tok_bytes[token_id].decode("utf-8")
            if self._pending or self._run_bad:
                text = self._end_run() + text
        if self._strip_left and text:
            text = self._strip(text)
        self._irregular = bool(self._pending) or self._strip_left > 0 or self._run_bad
        return text

    def _feed_lossy(self, data: bytes) -> str:
        """ByteLevel: bytes in, whole characters out; invalid bytes as a lossy decode has them."""
        old = self._pending
        text, self._pending = utf8_feed(old, data)
        if self._ppend and len(old) + len(data) > len(self._pending):
            # The prompt's partial character is resolved; if it turned out invalid, its U+FFFD
            # is already part of the prompt's text.
            if text[:1] == _REPLACEMENT and not (old + data).startswith(_FFFD_BYTES):
                text = text[1:]
            self._ppend = 0
        return text

    def _feed_run(self, data: bytes) -> str:
        """SentencePiece: one byte of a byte-fallback run. A run that holds an invalid byte
        decodes as one U+FFFD per byte, so once a run is invalid every further byte is one."""
        if self._run_bad:
            return _REPLACEMENT
        buf = self._pending + data
        try:
            text, used = _utf8_decode(buf, "strict", False)
        except UnicodeDecodeError:
            self._run_bad = True
            text = _REPLACEMENT * (len(buf) - self._ppend)
            self._pending = b""
            self._ppend = 0
            return text
        if self._strip_left:
            # Still inside the leading-space strip: hold the run until it ends, as one invalid
            # byte later turns the whole run, spaces included, into U+FFFD.
            self._pending = buf
            return ""
        self._pending = buf[used:]
        if used:
            self._ppend = 0
        return text

    def _end_run(self) -> str:
        """A byte-fallback run ends: the text of what it still holds."""
        pending = self._pending
        if self._strip_left and pending and _valid(pending):
            text = pending.decode("utf-8")
        else:
            text = _REPLACEMENT * (len(pending) - self._ppend)
        self._pending = b""
        self._ppend = 0
        self._run_bad = False
        return text

    def _strip(self, text: str) -> str:
        k = 0
        limit = self._strip_left
        while k < len(text) and k < limit and text[k] == " ":
            k += 1
        self._strip_left = 0 if k < len(text) or k == limit else limit - k
        return text[k:]

    def _flush_fast(self) -> str:
        table = self._table
        assert table is not None
        if table.kind == BYTELEVEL:
            pending = self._pending
            text = pending.decode("utf-8", "replace")[1 if self._ppend else 0 :]
            self._pending = b""
            self._ppend = 0
        else:
            text = self._end_run()
        if self._strip_left and text:
            text = self._strip(text)
        self._irregular = self._strip_left > 0
        return text

    # ---- generic path ----------------------------------------------------------------------------

    def _seed_generic(self) -> None:
        ids = self._prompt
        n = len(ids)
        if n > SAFE_SUFFIX_MIN:
            for k in range(SAFE_SUFFIX_MIN, min(SAFE_SUFFIX_MAX, n - 1) + 1):
                text, ctx = self.decode_prompt_context(ids[n - k :])
                if _REPLACEMENT not in text and len(ctx) >= SAFE_SUFFIX_MIN:
                    self._set_context(ctx, text)
                    return
        text, ctx = self.decode_prompt_context(ids)
        self._set_context(ctx, text)

    def _set_context(self, ctx: list[int], text: str) -> None:
        self._ids = ctx
        self._start = 0
        self._read = len(ctx)
        self._text = text
        # A prompt that ends inside a character decodes with U+FFFD at its end; generation may
        # complete that character, which is then emitted whole (and nothing before it again).
        self._ctx_tail = len(text) - len(text.rstrip(_REPLACEMENT))

    def _push_generic(self, token_id: int) -> str:
        tok = self._tok
        if not tok.is_known(token_id):
            return self._lacked(token_id)
        if not self.prefix_seeded:
            self._seed()
        g = self._g
        assert g is not None
        if token_id in g.skipped:
            return ""
        ids = self._ids
        ids.append(token_id)
        self._irregular = True
        read = self._read
        new = None
        pending = len(ids) - read
        if not self._ctx_tail and pending <= MAX_HOLD_TOKENS:
            # The common step: a window of the last emitted chunk plus the pending tokens.
            window = ids[self._start :]
            new = g.window(window)
            text = self._text
            if len(new) > len(text) and new.startswith(text):
                if new[-1] == _REPLACEMENT:
                    self._irregular = True
                    return ""  # a character is still incomplete: hold
                if len(window) == 2 and text == g.single[window[0]]:
                    # Remember this pair for the inline step in ``push_token``.
                    pairs = g.pairs
                    if len(pairs) >= _MEMO_MAX:
                        pairs.clear()
                    pairs[window[0] * g.vocab_size + window[1]] = new
                self._start = read
                self._read = len(ids)
                self._text = g.single[token_id] if pending == 1 else g.window(ids[read:])
                self._irregular = pending != 1
                if read > _TRIM_AT:
                    self._trim()
                return new[len(text) :]
        return self._emit_generic(new=new)

    def _emit_generic(self, *, final: bool = False, new: str | None = None) -> str:
        """Decode the window, emit what it adds beyond the text already out, then move the window
        to start at the tokens just consumed (one decode per token, as HF's DecodeStream does)."""
        ids = self._ids
        n = len(ids)
        if not final and self._read == n:
            return ""
        g = self._g
        assert g is not None
        decode = g.window
        if new is None:
            new = decode(ids[self._start :])
        text = self._text
        completed = False  # the prompt's unfinished character, now complete
        if not new.startswith(text) and self._ctx_tail:
            # The prompt's partial character was completed: back off to the text the prompt owns.
            text = self._prompt_owned(new, text)
            completed = True
        if not new.startswith(text):
            # Non-monotonic decode (e.g. a byte-fallback run turned invalid): the text already
            # emitted stays as it is; continue from the unread tokens alone.
            self._start = self._read
            text = ""
            new = decode(ids[self._start :])
        end = len(new)
        if not final:
            over_limit = n - self._read > MAX_HOLD_TOKENS
            if new.endswith(_REPLACEMENT):
                if not over_limit:
                    self._text = text
                    return ""
                # Held too long: emit all but a possible partial character at the very end.
                end = max(len(new.rstrip(_REPLACEMENT)), end - 3)
            elif end <= len(text) and not over_limit:
                self._text = text
                return ""
        end = max(end, len(text))
        delta = new[len(text) : end]
        self._ctx_tail = 0
        held = new[end:]
        # Slide: the tokens just consumed become the window's left context.
        start = self._read
        chunk = ids[start:]
        ctx = "" if completed else g.single[chunk[0]] if len(chunk) == 1 else decode(chunk)
        if completed:
            # The character began in the prompt: the window keeps its start this once (the
            # tokens consumed alone may not decode as they did with the prompt's bytes).
            self._text = new[:end]
        elif ctx.endswith(held):
            self._start = start
            self._text = ctx[: len(ctx) - len(held)]
        elif n - self._start > _MAX_WINDOW:
            # Cannot line the held text up with a shorter window: drop it rather than let the
            # window grow without bound (only invalid byte runs get here).
            self._start = start
            self._text = ctx
        else:
            self._text = new[:end]
        self._read = n
        self._irregular = True
        if self._start > _TRIM_AT:
            self._trim()
        return delta

    def _prompt_owned(self, new: str, text: str) -> str:
        """The longest prompt text that ``new`` (the window's decode, the prompt's unfinished
        character now completed) still starts with (``text`` if none): the prompt's text less
        some of its trailing U+FFFD, or the decode of the prompt context less its last tokens.
        (With byte fallback, a run of byte tokens that does not decode is U+FFFD throughout, its
        valid bytes too: ``<0x41><0xE4><0xBD>`` decodes as three of them, then as ``A你``.)"""
        g = self._g
        assert g is not None
        best: str | None = None
        for j in range(1, self._ctx_tail + 1):
            if new.startswith(text[:-j]):
                best = text[:-j]
                break
        ctx = self._ids[self._start : self._read]
        for k in range(1, min(len(ctx), MAX_HOLD_TOKENS) + 1):
            head = g.window(ctx[:-k])
            if best is not None and len(head) <= len(best):
                break
            if new.startswith(head):
                best = head
                break
        return text if best is None else best

    def _trim(self) -> None:
        """Drop consumed ids before the window from the id list."""
        del self._ids[: self._start]
        self._read -= self._start
        self._start = 0


class _GenericShared:
    """What every generic-path stream over one tokenizer and skip setting looks up per token."""

    __slots__ = (
        "decode",
        "known",
        "memo",
        "pairs",
        "plain",
        "single",
        "skip",
        "skipped",
        "vocab_size",
    )

    def window(self, ids: list[int]) -> str:
        """``decode(ids)``; a short window's text is memoised (it is a pure function of the ids)."""
        if len(ids) > _MEMO_WINDOW:
            return self.decode(ids, skip_special_tokens=self.skip)
        key = tuple(ids)
        text = self.memo.get(key)
        if text is None:
            text = self.decode(ids, skip_special_tokens=self.skip)
            if len(self.memo) >= _MEMO_MAX:
                self.memo.clear()
            self.memo[key] = text
        return text

    def __init__(self, tok: Tokenizer, skip: bool) -> None:
        self.skip = skip
        self.decode = tok.hf.decode
        self.vocab_size = tok.vocab_size
        self.known = tok._known
        self.skipped = tok.special_ids if skip else frozenset()
        self.memo = tok.window_memo(skip)
        #: 1 for ids the stream takes as they are (known, and not a skipped special token).
        plain = (
            bytearray(tok._known) if tok._known is not None else bytearray(b"\x01") * tok.vocab_size
        )
        for i in self.skipped:
            plain[i] = 0
        self.plain = plain
        #: decode([a, b]) by ``a * vocab_size + b``, for pairs whose decode extends decode([a])
        #: and ends on a whole character (the inline step's hit condition).
        self.pairs: dict[int, str] = {}
        self.single = tok.single_token_texts(skip)

    @staticmethod
    def of(tok: Tokenizer, skip: bool) -> _GenericShared:
        cache = tok._generic_shared
        shared = cache.get(skip)
        if shared is None or shared.decode != tok.hf.decode:
            shared = cache[skip] = _GenericShared(tok, skip)
        return shared


def _memo_step(table: DecodeTable, pending: bytes, token_id: int, step: Any) -> Any:
    """``step(pending, token bytes)``, memoised per table: an irregular step's outcome is a pure
    function of the bytes still pending and the token."""
    memo = table.feed_memo
    key = (pending, token_id)
    hit = memo.get(key)
    if hit is None:
        hit = step(pending, table.tok_bytes[token_id])
        if len(memo) >= _FEED_MEMO_MAX:
            memo.clear()
        memo[key] = hit
    return hit


def _run_step(pending: bytes, data: bytes) -> tuple[str, bytes, bool]:
    """One byte into a byte-fallback run holding ``pending``: ``(text, pending, run invalid)``."""
    buf = pending + data
    try:
        text, used = _utf8_decode(buf, "strict", False)
    except UnicodeDecodeError:
        return _REPLACEMENT * len(buf), b"", True
    return text, buf[used:], False


def _valid(data: bytes | bytearray) -> bool:
    try:
        bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
