"""Reasoning parsers: split a model's output into its thinking text and its answer, incrementally.

``feed(text)`` takes the next piece of output text (any split: markup may arrive across pieces)
and returns the ``ReasoningDelta`` that is certain so far; ``finish()`` releases what was held
back. The pieces concatenated equal the result of feeding the whole output at once.

- ``qwen3``: ``<think>...</think>`` at the very start of the output is reasoning. A prompt that
  already opens ``<think>`` (templates that start the thinking for the model) starts the output in
  reasoning; otherwise an output that does not begin with ``<think>`` is all answer (Qwen3 with
  ``enable_thinking: false``).
- ``deepseek_r1``: everything before ``</think>`` is reasoning (an opening ``<think>`` is
  optional: DeepSeek-R1 templates put it in the prompt); an output that never closes it is all
  reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from tokenwire.parsers.markers import find_marker

__all__ = [
    "REASONING_PARSERS",
    "DeepSeekR1ReasoningParser",
    "Qwen3ReasoningParser",
    "ReasoningDelta",
    "ReasoningParser",
    "ReasoningStream",
    "prompt_opens_reasoning",
]


@dataclass
class ReasoningDelta:
    """What a piece of output adds: thinking text and answer text."""

    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


_START, _REASONING, _CONTENT = 0, 1, 2


class ReasoningStream:
    """What every reasoning parser offers: a streamed output split into thinking and answer
    (subclasses implement ``_run``, ``decided`` and ``in_reasoning``)."""

    name: ClassVar[str] = ""
    #: The markup is special tokens: the text must keep them.
    needs_special_tokens: ClassVar[bool] = False
    #: Characters of raw output consumed through the end of the reasoning (its closing markup
    #: included), once the reasoning has ended.
    reasoning_end: int | None = None

    @property
    def decided(self) -> bool:
        """Whether the start of the output has told reasoning from answer."""
        raise NotImplementedError

    @property
    def in_reasoning(self) -> bool:
        """Whether the text fed so far is (still) thinking."""
        raise NotImplementedError

    def feed(self, text: str) -> ReasoningDelta:
        """The next piece of output."""
        return self._run(text, final=False)

    def finish(self) -> ReasoningDelta:
        """The output is over: whatever was held back."""
        return self._run("", final=True)

    def parse(self, text: str) -> ReasoningDelta:
        """A whole output at once."""
        out = self.feed(text)
        tail = self.finish()
        return ReasoningDelta(out.reasoning + tail.reasoning, out.content + tail.content)

    def _run(self, text: str, *, final: bool) -> ReasoningDelta:
        raise NotImplementedError


class ReasoningParser(ReasoningStream):
    """Base: ``<think>``/``</think>`` markup. Subclasses say where the output starts."""

    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"
    #: Whether an output that does not open with ``start_tag`` is reasoning anyway.
    implicit_start: ClassVar[bool] = False

    def __init__(self, *, prompt_in_reasoning: bool = False) -> None:
        self._buf = ""
        self._state = _START
        self._implicit = self.implicit_start or prompt_in_reasoning
        self.reasoning_end = None
        self._consumed = 0

    @property
    def decided(self) -> bool:
        """Whether the start of the output has told reasoning from answer."""
        return self._state != _START

    @property
    def in_reasoning(self) -> bool:
        """Whether the text fed so far is (still) thinking."""
        return self._state == _REASONING or (self._state == _START and self._implicit)

    def _run(self, text: str, *, final: bool) -> ReasoningDelta:
        buf = self._buf + text
        out = ReasoningDelta()
        if self._state == _START:
            tag = self.start_tag
            if buf.startswith(tag):
                self._consumed += len(tag)
                buf = buf[len(tag) :]
                self._state = _REASONING
            elif tag.startswith(buf) and not final:
                self._buf = buf  # may still become the opening tag
                return out
            else:
                self._state = _REASONING if self._implicit else _CONTENT
        if self._state == _REASONING:
            at, marker = find_marker(buf, (self.end_tag,), final=final)
            out.reasoning = buf[:at]
            self._consumed += at
            if marker is None:
                self._buf = buf[at:]
                return out
            self._consumed += len(marker)
            self.reasoning_end = self._consumed
            buf = buf[at + len(marker) :]
            self._state = _CONTENT
        out.content = buf
        self._consumed += len(buf)
        self._buf = ""
        return out


class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3 (and QwQ): ``<think>`` opens the output, or the prompt already opened it."""

    name = "qwen3"


class DeepSeekR1ReasoningParser(ReasoningParser):
    """DeepSeek-R1: reasoning until ``</think>``, opened or not."""

    name = "deepseek_r1"
    implicit_start = True


REASONING_PARSERS: dict[str, Any] = {
    cls.name: cls for cls in (Qwen3ReasoningParser, DeepSeekR1ReasoningParser)
}


def prompt_opens_reasoning(prompt_text: str, parser: Any) -> bool:
    """Whether the rendered prompt ends inside an opened, unclosed thinking block (the template
    started the model's thinking for it)."""
    if not hasattr(parser, "start_tag"):
        return False
    start = prompt_text.rfind(parser.start_tag)
    return start != -1 and prompt_text.find(parser.end_tag, start) == -1
