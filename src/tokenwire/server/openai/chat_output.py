"""Chat messages and stream deltas from a choice's parsed output (reasoning, content, tool calls),
in OpenAI's shapes with vLLM's field names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenwire.parsers import ToolCall, merge_tool_deltas
from tokenwire.parsers.output import OutputDelta, OutputParser, OutputSpec
from tokenwire.tokenizer import Tokenizer

__all__ = ["ChoiceOutput"]


def _tool_call_entries(deltas: list) -> list[dict[str, Any]]:
    """Delta entries, consecutive pieces of one call merged."""
    merged: list = []
    for d in deltas:
        last = merged[-1] if merged else None
        if last is not None and last.index == d.index and d.id is None:
            last.arguments += d.arguments
        else:
            merged.append(type(d)(d.index, d.id, d.name, d.arguments))
    return [d.to_openai() for d in merged]


class ChoiceOutput:
    """One choice's output through its ``OutputParser``: stream deltas, or a whole message."""

    def __init__(
        self,
        spec: OutputSpec,
        tok: Tokenizer,
        fields: Sequence[str],
        *,
        parallel: bool = True,
        hold_reasoning: bool = False,
    ) -> None:
        skip = True
        self.parallel = parallel
        #: SGLang's ``stream_reasoning: false``: the thinking goes out in one piece when it ends.
        self.hold_reasoning = hold_reasoning
        self._held = ""

        def token_chars(ids: Sequence[int]) -> list[int]:
            # (an id the tokenizer lacks, a model's padding row, has no text)
            return [len(tok.decode([i], skip)) if tok.is_known(i) else 0 for i in ids]

        self.parser: OutputParser = spec.new(token_chars)
        self.fields = tuple(fields)
        self.has_reasoning = spec.reasoning is not None

    @property
    def called(self) -> bool:
        """Whether the model called a tool."""
        return self.parser.called

    @property
    def reasoning_tokens(self) -> int:
        return self.parser.reasoning_tokens

    def _calls(self, d: OutputDelta) -> list:
        """The call deltas to pass on (only the first call's without parallel tool calls)."""
        return d.tool_calls if self.parallel else [c for c in d.tool_calls if c.index == 0]

    def _delta(self, d: OutputDelta, *, final: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        d.tool_calls = self._calls(d)
        if self.hold_reasoning:
            self._held += d.reasoning
            d.reasoning = ""
            if self._held and (d.content or d.tool_calls or final):
                d.reasoning, self._held = self._held, ""
        if d.reasoning:
            for f in self.fields:
                out[f] = d.reasoning
        if d.content:
            out["content"] = d.content
        if d.tool_calls:
            out["tool_calls"] = _tool_call_entries(d.tool_calls)
        return out

    def pieces(self, text: str, token_ids: Sequence[int], *, final: bool = False) -> OutputDelta:
        """The next piece's reasoning, content and call deltas (``final``: the output is over,
        with everything held back), as other APIs' formatters take them."""
        d = self.parser.feed(text, token_ids)
        if final:
            d.extend(self.parser.finish())
        d.tool_calls = self._calls(d)
        return d

    def parts(self, text: str, token_ids: Sequence[int]) -> tuple[str, str, list[ToolCall]]:
        """A whole output: its reasoning, its content and its calls."""
        d = self.pieces(text, token_ids, final=True)
        return d.reasoning, d.content, merge_tool_deltas(d.tool_calls)

    def delta(self, text: str, token_ids: Sequence[int]) -> dict[str, Any]:
        """The stream delta for the next piece (empty when it is all held back)."""
        return self._delta(self.parser.feed(text, token_ids))

    def final(self, text: str, token_ids: Sequence[int]) -> dict[str, Any]:
        """The last piece and everything held back."""
        d = self.parser.feed(text, token_ids)
        d.extend(self.parser.finish())
        return self._delta(d, final=True)

    def message(self, text: str, token_ids: Sequence[int]) -> dict[str, Any]:
        """The whole assistant message for a non-streamed response."""
        d = self.parser.feed(text, token_ids)
        d.extend(self.parser.finish())
        calls = merge_tool_deltas(self._calls(d))
        msg: dict[str, Any] = {"role": "assistant", "content": d.content or None, "refusal": None}
        if self.has_reasoning:
            for f in self.fields:
                msg[f] = d.reasoning or None
        if calls:
            msg["tool_calls"] = [c.to_openai() for c in calls]
        elif not d.content:
            msg["content"] = "" if not self.has_reasoning or not d.reasoning else None
        return msg
