"""``OutputParser``: one choice's output text through the reasoning parser, then the answer
through the tool-call parser (calls after the reasoning are parsed from the answer only), with
the output tokens that went to reasoning counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mypy_extensions import mypyc_attr

from tokenwire.parsers.reasoning import ReasoningStream
from tokenwire.parsers.tools.base import ToolCall, ToolCallDelta, ToolCallParser, merge_tool_deltas

__all__ = ["OutputDelta", "OutputParser", "OutputSpec"]


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass
class OutputDelta:
    """What a piece of output adds to a chat message."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def extend(self, other: OutputDelta) -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass
class OutputSpec:
    """How one request's outputs are parsed (each choice gets its own ``OutputParser``)."""

    #: The reasoning parser class (a ``ReasoningStream``).
    reasoning: Callable[..., ReasoningStream] | None = None
    prompt_in_reasoning: bool = False
    #: The tool-call parser class (or a factory taking ``make_id`` and ``tools``).
    tools: Callable[..., ToolCallParser] | None = None
    make_id: Callable[[int], str] | None = None
    #: The request's ``tools`` (OpenAI's shape): formats whose argument values are bare text
    #: type them by these schemas.
    tool_schemas: Sequence[Mapping[str, Any]] | None = None

    def new(self, token_chars: Callable[[Sequence[int]], list[int]] | None = None) -> OutputParser:
        """A parser for one choice; ``token_chars`` gives each token's text length (to count
        reasoning tokens exactly when a piece of several tokens ends the reasoning)."""
        reasoning = (
            self.reasoning(prompt_in_reasoning=self.prompt_in_reasoning) if self.reasoning else None
        )
        tools = self.tools(make_id=self.make_id, tools=self.tool_schemas) if self.tools else None
        return OutputParser(reasoning, tools, token_chars)


@mypyc_attr(allow_interpreted_subclasses=True)
class OutputParser:
    """Reasoning, then tool calls, incrementally: ``feed(text, token_ids)``, ``finish()``."""

    def __init__(
        self,
        reasoning: ReasoningStream | None,
        tools: ToolCallParser | None,
        token_chars: Callable[[Sequence[int]], list[int]] | None = None,
    ) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self._token_chars = token_chars
        #: Output tokens that went to the reasoning (through its closing tag).
        self.reasoning_tokens = 0
        self._chars = 0  # output characters fed so far
        self._pending = 0  # tokens fed while the output's start is undecided

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> OutputDelta:
        """The next piece of output text and the tokens it came from."""
        out = OutputDelta()
        r = self.reasoning
        if r is None:
            answer = text
        else:
            ended_before = r.reasoning_end is not None
            d = r.feed(text)
            out.reasoning = d.reasoning
            answer = d.content
            if not ended_before:
                self._count(token_ids)
        self._chars += len(text)
        self._answer(out, answer)
        return out

    def feed_plain(self, text: str, n_tokens: int) -> int:
        """The fast path of ``feed`` (for ``n_tokens`` tokens): 1 when the piece is all
        reasoning, 2 when it is all content, either taken as ``feed`` takes it; 0 when ``feed``
        must take it (nothing taken). It applies while the reasoning parser's own fast path
        does (``ReasoningStream.plain``) and, for content, with no tool-call parser."""
        r = self.reasoning
        if r is None:
            if self.tools is not None:
                return 0
            kind = 2
        else:
            ended_before = r.reasoning_end is not None
            kind = r.plain(text, self.tools is None)
            if not kind:
                return 0
            if not ended_before:  # ``_count``: decided, and not ended in this piece
                if r.in_reasoning:
                    self.reasoning_tokens += self._pending + n_tokens
                self._pending = 0
        self._chars += len(text)
        return kind

    def _count(self, token_ids: Sequence[int]) -> None:
        """Count this piece's tokens that went to the reasoning (tokens whose side is not known
        yet wait in ``_pending``)."""
        r = self.reasoning
        assert r is not None
        n = len(token_ids)
        end = r.reasoning_end
        if end is not None:  # the reasoning ended within this piece
            need = end - self._chars
            k = n
            if self._token_chars is not None and n > 1:
                lengths = self._token_chars(token_ids)
                seen = k = 0
                while k < n and seen < need:
                    seen += lengths[k]
                    k += 1
            self.reasoning_tokens += self._pending + (k if need > 0 else 0)
            self._pending = 0
        elif not r.decided:
            self._pending += n
        elif r.in_reasoning:
            self.reasoning_tokens += self._pending + n
            self._pending = 0
        else:
            self._pending = 0

    def _answer(self, out: OutputDelta, answer: str, *, final: bool = False) -> None:
        if self.tools is None:
            out.content += answer
            return
        d = self.tools.feed(answer) if answer else None
        if d is not None:
            out.content += d.content
            out.tool_calls += d.calls
        if final:
            d = self.tools.finish()
            out.content += d.content
            out.tool_calls += d.calls

    def finish(self) -> OutputDelta:
        """The output is over: whatever was held back."""
        out = OutputDelta()
        answer = ""
        if self.reasoning is not None:
            d = self.reasoning.finish()
            out.reasoning = d.reasoning
            answer = d.content
        self._answer(out, answer, final=True)
        return out

    @property
    def called(self) -> bool:
        """Whether any tool call was made."""
        return self.tools is not None and self.tools.calls > 0

    def parse(self, text: str, token_ids: Sequence[int] = ()) -> tuple[str, str, list[ToolCall]]:
        """A whole output: ``(reasoning, content, calls)``."""
        out = self.feed(text, token_ids)
        out.extend(self.finish())
        return out.reasoning, out.content, merge_tool_deltas(out.tool_calls)
