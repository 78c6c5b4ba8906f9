"""Log probabilities in responses: the engine's per-token numbers (the batch frame's logprob
columns, decoded by the codec) shaped as OpenAI's completions and chat objects and SGLang's
``meta_info`` lists, with token strings by vLLM's rules.

A token's string is its decoded text, as vLLM writes it: a token that is only part of a UTF-8
character (a byte-level or byte-fallback piece) is ``""`` until the token that completes the
character, which carries the whole character (decoded with the tokens before it); chat's
``bytes`` are the bytes of that string. ``return_tokens_as_token_ids`` gives ``token_id:N``.
Text offsets advance by each written token's length, and each position's top logprobs list the
chosen (or prompt) token first, then the top ones, as vLLM's do. Streaming and not streaming
shape the same rows the same way (offsets and the decoding context carry over from chunk to
chunk). SGLang's ``/generate`` lists keep each token's own text (``TokenStrings.text``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenwire.detok.tables import decode_table
from tokenwire.messages.errors import ValidationError
from tokenwire.tokenizer import Tokenizer

__all__ = [
    "ChatLogprobs",
    "ChoiceLogprobs",
    "CompletionLogprobs",
    "GenerateLogprobs",
    "Row",
    "TokenStrings",
    "chat_logprobs_request",
    "completion_logprobs_request",
    "generate_logprobs_request",
    "join",
    "join_completion",
    "ranks_from_extras",
    "rows_from_extras",
    "vllm_prompt_logprobs",
]

#: One position: the chosen token id, its logprob, and the top ``(id, logprob)`` pairs.
Row = tuple[int, float, list[tuple[int, float]]]


class TokenStrings:
    """Token ids as the strings and bytes logprob objects carry."""

    def __init__(self, tok: Tokenizer, *, as_ids: bool = False) -> None:
        self.tok = tok
        self.as_ids = as_ids
        self._table = decode_table(tok, False)
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        """``(token string, its bytes)``."""
        hit = self._cache.get(token_id)
        if hit is not None:
            return hit
        raw: bytes | None = None
        table = self._table
        if table is not None and 0 <= token_id < len(table.tok_bytes):
            raw = table.tok_bytes[token_id]
        if raw is None:
            known = self.tok.is_known(token_id)
            raw = self.tok.decode([token_id], False).encode("utf-8") if known else b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        if self.as_ids:
            text = f"token_id:{token_id}"
        out = (text, list(raw))
        self._cache[token_id] = out
        return out

    def text(self, token_id: int) -> str:
        return self.get(token_id)[0]

    def _alone(self, token_id: int) -> str:
        """The token decoded alone, as a tokenizer's ``decode`` gives it (U+FFFD for a partial
        character)."""
        raw = self.get(token_id)[1]
        return bytes(raw).decode("utf-8", "replace")

    def decoded(self, token_id: int, context: Sequence[int]) -> str:
        """vLLM's decoded token: the token's text, or, when that ends in a partial character,
        what it completes given the ``context`` (the tokens before it, oldest first; up to four
        are looked at): the whole character with the text before it that earlier partial tokens
        did not show, or ``""`` while it is still incomplete."""
        text = self._alone(token_id)
        if not text.endswith(_FFFD):
            return text
        tok = self.tok
        ctx = [t for t in context[-4:] if tok.is_known(t)]
        for n in range(1, len(ctx) + 1):
            window = ctx[-n:]
            full = tok.decode([*window, token_id] if tok.is_known(token_id) else window, False)
            if full.endswith(_FFFD):
                continue
            clean = len(window)
            while clean > 0 and self._alone(window[clean - 1]).endswith(_FFFD):
                clean -= 1
            prefix = tok.decode(window[:clean], False) if clean else ""
            if full.startswith(prefix):
                return full[len(prefix) :]
            common = 0
            for a, b in zip(prefix, full):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""

    def written(self, token_id: int, context: Sequence[int]) -> tuple[str, list[int]]:
        """``(the string a logprob object writes, the bytes of the decoded token)``."""
        text = self.decoded(token_id, context)
        shown = f"token_id:{token_id}" if self.as_ids else text
        return shown, list(text.encode("utf-8"))


_FFFD = "\ufffd"


def _ranked(chosen: int, top: Sequence[tuple[int, float]], lp: float) -> list[tuple[int, float]]:
    """A position's entries as vLLM orders them: the chosen (or prompt) token first, then the
    top ones (each id once)."""
    out = [(chosen, lp)]
    seen = {chosen}
    for t, v in top:
        if t not in seen:
            seen.add(t)
            out.append((t, v))
    return out


def _families(extras: Any) -> list[dict[str, Any]]:
    if extras is None:
        return []
    return list(extras) if isinstance(extras, list) else [extras]


def rows_from_extras(extras: Any, kind: str = "out") -> list[Row]:
    """Positions of an item's (possibly merged) extras: ``kind`` ``out`` for output tokens,
    ``in`` for prompt tokens."""
    rows: list[Row] = []
    for fam in _families(extras):
        lp = fam.get(f"{kind}_lp")
        if lp is None:
            continue
        values = lp["values"].tolist()
        ids = lp["ids"].tolist()
        tops: list[list[tuple[int, float]]] = [[] for _ in values]
        topk = fam.get(f"{kind}_topk")
        if topk is not None:
            tv = topk["values"].tolist()
            ti = topk["ids"].tolist()
            pos = 0
            for k, n in enumerate(topk["poslens"].tolist()):
                if k < len(tops):
                    tops[k] = list(zip(ti[pos : pos + n], tv[pos : pos + n]))
                pos += n
        rows.extend(zip(ids, values, tops))
    return rows


def _lp(value: float) -> float:
    """A logprob as JSON can carry it (vLLM clamps -inf to -9999)."""
    return max(float(value), -9999.0)


class CompletionLogprobs:
    """``/v1/completions`` ``logprobs`` objects for one choice, chunk by chunk."""

    def __init__(self, strings: TokenStrings, top: int) -> None:
        self.strings = strings
        self.top = top
        self.offset = 0  # text offset (characters) where the next token's text starts
        #: The tokens so far (the decoding context of partial characters).
        self.context: list[int] = []

    def _advance(self, token: str) -> int:
        """The offset of a token, and the offset moved past it (by the written token's length,
        as vLLM's)."""
        at = self.offset
        self.offset += len(token)
        return at

    def shape(self, rows: Sequence[Row]) -> dict[str, Any]:
        """The object for ``rows``."""
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict[str, float] | None] = []
        offsets: list[int] = []
        written = self.strings.written
        ctx = self.context
        for tid, lp, top in rows:
            s = written(tid, ctx)[0]
            offsets.append(self._advance(s))
            tokens.append(s)
            token_logprobs.append(_lp(lp))
            entry: dict[str, float] = {}
            for t, v in _ranked(tid, top[: self.top], lp)[: self.top + 1]:
                entry.setdefault(written(t, ctx)[0], _lp(v))
            top_logprobs.append(entry)
            ctx.append(tid)
        del ctx[:-8]
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": offsets,
        }

    def first_prompt_token(self, token_id: int) -> dict[str, Any]:
        """The prompt's first token under ``echo``: its string, no logprob."""
        strings = self.strings
        # (vLLM decodes it alone: no correction, a partial character is U+FFFD)
        s = f"token_id:{token_id}" if strings.as_ids else strings._alone(token_id)
        self.context.append(token_id)
        out = {"tokens": [s], "token_logprobs": [None], "top_logprobs": [None]}
        out["text_offset"] = [self._advance(s)]
        return out

    def restart(self) -> None:
        """The echoed prompt is over: generated tokens decode with their own context (vLLM's)."""
        self.context = []


def join_completion(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One completions ``logprobs`` object from several in order."""
    out: dict[str, list] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for p in parts:
        for k in out:
            out[k].extend(p[k])
    return out


class ChatLogprobs:
    """Chat ``logprobs`` objects (``{"content": [...], "refusal": null}``) for one choice."""

    def __init__(self, strings: TokenStrings, top: int) -> None:
        self.strings = strings
        self.top = top
        self.context: list[int] = []

    def _entry(self, tid: int, lp: float, ctx: Sequence[int]) -> dict[str, Any]:
        s, raw = self.strings.written(tid, ctx)
        return {"token": s, "logprob": _lp(lp), "bytes": raw}

    def shape(self, rows: Sequence[Row]) -> dict[str, Any]:
        content = []
        ctx = self.context
        for tid, lp, top in rows:
            entry = self._entry(tid, lp, ctx)
            ranked = _ranked(tid, top[: self.top], lp)[: self.top]
            entry["top_logprobs"] = [self._entry(t, v, ctx) for t, v in ranked]
            content.append(entry)
            ctx.append(tid)
        del ctx[:-8]
        return {"content": content, "refusal": None}


# ---- request fields ------------------------------------------------------------------------------


def _count(body: Any, key: str, limit: int, vocab: int | None = None) -> int | None:
    """A logprob count field; vLLM's -1 is the whole vocabulary (``vocab``), within the limit."""
    value = body.get(key)
    if value is None:
        return None
    if value == -1 and vocab is not None and not isinstance(value, bool):
        value = vocab
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValidationError(
            f"{key} must be a non-negative integer (or -1: the whole vocabulary), got {value!r}",
            param=key,
        )
    if value > limit:
        raise ValidationError(
            f"{key}={value} is more than this server's max_logprobs ({limit}; "
            "--max-logprobs raises it)",
            param=key,
        )
    return value


def completion_logprobs_request(
    body: Any, max_logprobs: int, vocab: int | None = None
) -> tuple[int | None, bool, int | None]:
    """``/v1/completions``: ``(logprobs, echo, prompt_logprobs)`` (vLLM's ``prompt_logprobs``,
    or ``logprobs`` for the echoed prompt)."""
    if body.get("top_logprobs") is not None:
        raise ValidationError(
            "top_logprobs is a chat field; completions take logprobs: N", param="top_logprobs"
        )
    top = _count(body, "logprobs", max_logprobs, vocab)
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise ValidationError(f"echo must be a boolean, got {echo!r}", param="echo")
    prompt = _count(body, "prompt_logprobs", max_logprobs, vocab)
    if echo and top is not None and prompt is None:
        prompt = top
    return top, bool(echo), prompt


#: The strings a boolean field may be written as (vLLM's request models read them so).
_BOOL_STRINGS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def chat_logprobs_request(
    body: Any, max_logprobs: int, vocab: int | None = None
) -> tuple[int | None, int | None]:
    """``/v1/chat/completions``: ``(top count or None, prompt_logprobs)`` from ``logprobs``
    (a boolean, or one written as a string as vLLM reads it) and ``top_logprobs``."""
    flag = body.get("logprobs")
    if isinstance(flag, str) and flag.lower() in _BOOL_STRINGS:
        flag = _BOOL_STRINGS[flag.lower()]
    if flag is not None and not isinstance(flag, bool):
        raise ValidationError(f"logprobs must be a boolean, got {flag!r}", param="logprobs")
    if body.get("echo") not in (None, False) and flag:
        raise ValidationError(
            "echo with logprobs is not supported for chat completions", param="echo"
        )
    top = _count(body, "top_logprobs", max_logprobs, vocab)
    if top and not flag:
        raise ValidationError("top_logprobs needs logprobs: true", param="top_logprobs")
    prompt = _count(body, "prompt_logprobs", max_logprobs, vocab)
    return ((top or 0) if flag else None), prompt


# ---- one choice ----------------------------------------------------------------------------------


def vllm_prompt_logprobs(
    strings: TokenStrings,
    prompt: Sequence[int],
    rows: Sequence[Row],
    ranks: Sequence[int] | None = None,
) -> list:
    """vLLM's ``prompt_logprobs``: None for the first prompt token, then per token a map from
    token id to ``{"logprob", "rank", "decoded_token"}``: the prompt token first, with its rank
    (the engine's; None only where the engine did not say and it is not among the top ones),
    then the top ones (ranks 1, 2, ...)."""
    out: list[Any] = [None]
    for pos, (tid, lp, top) in enumerate(rows):
        ctx = prompt[max(0, pos - 3) : pos + 1]
        rank = _rank(ranks, pos)
        if rank is None:
            rank = next((k + 1 for k, (t, _) in enumerate(top) if t == tid), None)
        entry: dict[str, Any] = {
            str(tid): {"logprob": _lp(lp), "rank": rank, "decoded_token": strings.decoded(tid, ctx)}
        }
        for k, (t, v) in enumerate(top):
            entry.setdefault(
                str(t), {"logprob": _lp(v), "rank": k + 1, "decoded_token": strings.decoded(t, ctx)}
            )
        out.append(entry)
    return out[: len(prompt)]


def ranks_from_extras(extras: Any, kind: str = "in") -> list[int] | None:
    """The chosen (``out``) or prompt (``in``) tokens' ranks an engine reported (vLLM's do), or
    None."""
    ranks: list[int] = []
    found = False
    for fam in _families(extras):
        got = fam.get(f"{kind}_rank")
        if got is not None:
            found = True
            ranks.extend(int(r) for r in got["values"].tolist())
    return ranks if found else None


def _rank(ranks: Sequence[int] | None, pos: int) -> int | None:
    if ranks is None or pos >= len(ranks) or ranks[pos] < 0:
        return None
    return ranks[pos]


class ChoiceLogprobs:
    """One choice's logprobs, item by item: ``take`` gives the ``logprobs`` field for an item's
    tokens (the echoed prompt's first, under completions' ``echo``), and keeps vLLM's
    ``prompt_logprobs`` when the request asked for them."""

    def __init__(
        self,
        strings: TokenStrings,
        *,
        chat: bool,
        top: int | None,
        prompt: Sequence[int],
        echo: bool = False,
        prompt_top: int | None = None,
    ) -> None:
        self.top = top
        self.echo = echo and top is not None
        self.want_prompt = prompt_top is not None
        self.prompt = prompt
        self.strings = strings
        self._shaper: Any = (
            ChatLogprobs(strings, top or 0) if chat else CompletionLogprobs(strings, top or 0)
        )
        self._first = True
        #: vLLM's ``prompt_logprobs`` (None until the engine sent them, or not asked for).
        self.prompt_logprobs: list | None = None

    def take(self, token_ids: Sequence[int], extras: Any) -> dict[str, Any] | None:
        """The ``logprobs`` field for an item (None when the request asked for none)."""
        first, self._first = self._first, False
        if first and self.want_prompt:
            rows = rows_from_extras(extras, "in")
            ranks = ranks_from_extras(extras, "in")
            self.prompt_logprobs = vllm_prompt_logprobs(self.strings, self.prompt, rows, ranks)
        if self.top is None:
            return None
        rows = rows_from_extras(extras, "out")[: len(token_ids)]
        shaper = self._shaper
        if isinstance(shaper, ChatLogprobs):
            return shaper.shape(rows)
        parts = []
        if first and self.echo and self.prompt:
            parts.append(shaper.first_prompt_token(self.prompt[0]))
            parts.append(shaper.shape(rows_from_extras(extras, "in")))
            shaper.restart()
        parts.append(shaper.shape(rows))
        return parts[0] if len(parts) == 1 else join_completion(parts)


def join(values: Sequence[dict[str, Any] | None], *, chat: bool) -> dict[str, Any] | None:
    """Several items' ``logprobs`` fields as one (a non-streamed response's)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    if chat:
        return {"content": [c for v in present for c in v["content"]], "refusal": None}
    return join_completion(present)


# ---- SGLang's /generate --------------------------------------------------------------------------


def generate_logprobs_request(body: Any, max_logprobs: int) -> tuple[int, int] | None:
    """``/generate``: ``(logprob_start_len, top_logprobs_num)`` when ``return_logprob``, else
    None (the other fields are still checked)."""
    flag = body.get("return_logprob")
    if flag is not None and not isinstance(flag, bool):
        raise ValidationError("return_logprob must be a boolean", param="return_logprob")
    start = body.get("logprob_start_len")
    if start is None:
        start = -1
    if not isinstance(start, int) or isinstance(start, bool) or start < -1:
        raise ValidationError(
            f"logprob_start_len must be an integer >= -1, got {start!r}", param="logprob_start_len"
        )
    top = _count(body, "top_logprobs_num", max_logprobs) or 0
    text = body.get("return_text_in_logprobs")
    if text is not None and not isinstance(text, bool):
        raise ValidationError(
            "return_text_in_logprobs must be a boolean", param="return_text_in_logprobs"
        )
    return (start, top) if flag else None


class GenerateLogprobs:
    """One request's ``meta_info`` logprob lists, SGLang's shapes: ``[logprob, token id, text]``
    triples (text None unless ``return_text_in_logprobs``), the prompt's from
    ``logprob_start_len`` (-1: the last prompt token only; the first prompt token has no
    logprob), cumulative in every streamed chunk as SGLang's are."""

    def __init__(
        self,
        strings: TokenStrings,
        prompt: Sequence[int],
        start: int,
        top: int,
        with_text: bool,
        *,
        by_ids: bool = False,
    ) -> None:
        #: ``token_ids_logprob``: the top columns are the requested ids' (SGLang's
        #: ``output_token_ids_logprobs``).
        self.by_ids = by_ids
        self.strings = strings
        self.prompt = prompt
        self.start = len(prompt) - 1 if start < 0 else min(start, len(prompt))
        self.top = top
        self.with_text = with_text
        self.input: list[list[Any]] | None = None
        self.input_top: list[Any] = []
        self.output: list[list[Any]] = []
        self.output_top: list[list[list[Any]]] = []

    def _triple(self, lp: float | None, tid: int) -> list[Any]:
        text = self.strings.text(tid) if self.with_text else None
        return [None if lp is None else _lp(lp), tid, text]

    def take(self, token_ids: Sequence[int], extras: Any) -> None:
        if self.input is None:
            rows = rows_from_extras(extras, "in")  # positions 1.. of the prompt
            self.input = []
            for pos in range(self.start, len(self.prompt)):
                if pos == 0:
                    self.input.append(self._triple(None, self.prompt[0]))
                    self.input_top.append(None)
                elif pos - 1 < len(rows):
                    tid, lp, top = rows[pos - 1]
                    self.input.append(self._triple(lp, tid))
                    self.input_top.append([self._triple(v, t) for t, v in top[: self.top]])
        keep = None if self.by_ids else self.top
        for tid, lp, top in rows_from_extras(extras, "out")[: len(token_ids)]:
            self.output.append(self._triple(lp, tid))
            self.output_top.append([self._triple(v, t) for t, v in top[:keep]])

    def meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "input_token_logprobs": self.input or [],
            "output_token_logprobs": self.output,
        }
        if self.by_ids:
            out["output_token_ids_logprobs"] = self.output_top
        elif self.top:
            out["input_top_logprobs"] = self.input_top
            out["output_top_logprobs"] = self.output_top
        return out
