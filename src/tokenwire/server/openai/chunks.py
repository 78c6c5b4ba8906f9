"""OpenAI's response shapes: the fields every response starts with, ``usage``, finish reasons
(with vLLM's ``stop_reason`` and SGLang's ``matched_stop``), and the streamed chunks of one
response, with their fixed parts serialized once (``ChunkWriter``)."""

from __future__ import annotations

from typing import Any

import msgspec
from mypy_extensions import mypyc_attr

from tokenwire.messages.finish_reason import FinishReason
from tokenwire.runtime import Plan
from tokenwire.server.http import sse
from tokenwire.server.streaming import matched_stop

__all__ = [
    "ChunkWriter",
    "delta_fields",
    "finish_fields",
    "openai_head",
    "reasoning_count",
    "text_fields",
    "usage",
]

_json = msgspec.json.Encoder()


def delta_fields(delta: dict[str, Any]) -> dict[str, Any]:
    """A streamed chat chunk's choice, after its index, while the choice goes on (the one
    place its shape is written: ``ChunkWriter``'s precomputed pieces come from it)."""
    return {"delta": delta, "logprobs": None, "finish_reason": None}


def text_fields(text: str) -> dict[str, Any]:
    """A streamed completion chunk's choice, after its index, while the choice goes on."""
    return {"text": text, "logprobs": None, "finish_reason": None}


#: A string JSON writes as it is, standing for the text in a chunk's precomputed pieces.
_SLOT = "tokenwire-text-slot"
_SLOT_JSON = _json.encode(_SLOT)


def openai_head(plan: Plan, *, chunk: bool) -> dict[str, Any]:
    """The fields every OpenAI response (or streamed chunk) of ``plan`` starts with."""
    chat = plan.route == "chat"
    if chat:
        obj = "chat.completion.chunk" if chunk else "chat.completion"
    else:
        obj = "text_completion"
    prefix = "chatcmpl-" if chat else "cmpl-"
    return {"id": prefix + plan.id, "object": obj, "created": plan.created, "model": plan.model}


def usage(
    prompt_tokens: int,
    completion_tokens: int,
    reasoning_tokens: int | None = None,
    *,
    cached_tokens: int = 0,
    cached_details: bool = False,
) -> dict[str, Any]:
    """OpenAI's usage object (``completion_tokens_details.reasoning_tokens`` when the server
    parses reasoning or the engine counts it; ``prompt_tokens_details.cached_tokens`` when the
    engine reports cached prompt tokens, or always with ``cached_details``)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens or cached_details:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def reasoning_count(engine: int, parsed: int | None) -> int | None:
    """Reasoning tokens for the usage: the engine's count when it reports one, else the server's
    parser's (None: neither, and the usage leaves it out)."""
    return engine if engine else parsed


def finish_fields(fr: FinishReason | None, eos: tuple[int, ...]) -> tuple[str | None, Any]:
    """OpenAI ``finish_reason`` and vLLM ``stop_reason``."""
    if fr is None:
        return None, None
    return fr.openai_finish_reason, fr.stop_reason(eos)


@mypyc_attr(allow_interpreted_subclasses=True)
class ChunkWriter:
    """Streaming chunks of one OpenAI response, with the fixed parts serialized once."""

    def __init__(self, plan: Plan, eos: tuple[int, ...]) -> None:
        self.plan = plan
        self.eos = eos
        chat = plan.route == "chat"
        self._head = _json.encode(openai_head(plan, chunk=True))[:-1] + b',"choices":[{"index":'
        self._tail = b',"usage":null}\n\n' if plan.include_usage else b"}\n\n"
        self._chat = chat
        self._continuous = plan.continuous_usage
        #: Per choice: ``data: `` and the head through the choice's index.
        self._before: dict[int, bytes] = {}
        #: Per tuple of delta keys (chat) or ``()`` (a completion's text): an intermediate
        #: chunk's choice body around the text (the text once per key).
        self._pieces: dict[tuple[str, ...], list[bytes]] = {}
        self._plain = ("content",) if chat else ()

    def _around(self, keys: tuple[str, ...]) -> list[bytes]:
        """The pieces of an intermediate chunk's choice body between which its text goes (the
        text under each of ``keys`` of the delta; a completion's: ``()``), from
        ``delta_fields`` / ``text_fields``."""
        pieces = self._pieces.get(keys)
        if pieces is None:
            payload = delta_fields(dict.fromkeys(keys, _SLOT)) if keys else text_fields(_SLOT)
            pieces = (b"," + _json.encode(payload)[1:-1] + b"}]").split(_SLOT_JSON)
            self._pieces[keys] = pieces
        return pieces

    def _prefix(self, index: int) -> bytes:
        before = self._before.get(index)
        if before is None:
            before = self._before[index] = b"data: " + self._head + str(index).encode()
        return before

    def text_delta(
        self, index: int, keys: tuple[str, ...], text: str, completion_tokens: int = 0
    ) -> bytes:
        """An intermediate chunk whose delta carries ``text`` under each of ``keys`` (chat: the
        content, the reasoning fields), as ``chunk`` would write it."""
        pieces = self._around(keys)
        encoded = _json.encode(text)
        body = pieces[0] + encoded + pieces[1] if len(pieces) == 2 else encoded.join(pieces)
        if self._continuous:
            return self._prefix(index) + body + self._usage_tail(index, completion_tokens)
        return self._prefix(index) + body + self._tail

    def _usage_tail(self, index: int, completion_tokens: int) -> bytes:
        """Continuous usage: the choice's prompt and its completion tokens so far (vLLM's)."""
        prompt_tokens = len(self.plan.prompts[index // self.plan.n])
        return b',"usage":' + _json.encode(usage(prompt_tokens, completion_tokens)) + b"}\n\n"

    def delta(self, index: int, text: str, completion_tokens: int = 0) -> bytes:
        """An intermediate chunk carrying ``text`` (``completion_tokens`` of the choice so far
        matter only with continuous usage)."""
        return self.text_delta(index, self._plain, text, completion_tokens)

    def role(self, index: int) -> bytes:
        """The chat stream's first chunk for a choice: the assistant role."""
        return self.chunk(index, delta_fields({"role": "assistant", "content": ""}))

    def chunk(self, index: int, payload: dict[str, Any], completion_tokens: int = 0) -> bytes:
        """A chunk for choice ``index`` with the given fields (``delta`` or ``text``,
        ``logprobs``, ``finish_reason``...); ``completion_tokens`` of the choice so far matter
        only with continuous usage."""
        body = b"," + _json.encode(payload)[1:-1] + b"}]"
        tail = self._usage_tail(index, completion_tokens) if self._continuous else self._tail
        return self._prefix(index) + body + tail

    def final(
        self,
        index: int,
        text: str,
        fr: FinishReason | None,
        completion_tokens: int = 0,
        *,
        delta: dict[str, Any] | None = None,
        reason: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> bytes:
        """The chunk that ends a choice (chat: ``delta`` replaces the plain content delta;
        ``reason`` overrides the finish reason, as ``tool_calls`` does)."""
        finish, stop_reason = finish_fields(fr, self.eos)
        if delta is None:
            delta = {"content": text} if text else {}
        payload = ({"delta": delta} if self._chat else {"text": text}) | {
            "logprobs": None,
            "finish_reason": reason or finish,
            "stop_reason": stop_reason,
            "matched_stop": matched_stop(fr),
        }
        if extra:
            payload |= extra  # logprobs, prompt_logprobs
        return self.chunk(index, payload, completion_tokens)

    def usage(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        reasoning_tokens: int | None = None,
        *,
        cached_tokens: int = 0,
    ) -> bytes:
        """The last chunk when ``include_usage``: no choices, the usage."""
        counts = usage(
            prompt_tokens,
            completion_tokens,
            reasoning_tokens,
            cached_tokens=cached_tokens,
            cached_details=self.plan.cached_details,
        )
        return sse(openai_head(self.plan, chunk=True) | {"choices": [], "usage": counts})
