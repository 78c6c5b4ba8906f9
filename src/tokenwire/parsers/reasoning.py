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

The other families differ only in their markers (``ReasoningParser``'s class attributes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mypy_extensions import mypyc_attr

from tokenwire.parsers.markers import find_marker

__all__ = [
    "REASONING_PARSERS",
    "DeepSeekR1ReasoningParser",
    "DeepSeekV3ReasoningParser",
    "Ernie45ReasoningParser",
    "Glm45ReasoningParser",
    "GraniteReasoningParser",
    "HunyuanA13BReasoningParser",
    "KimiK2ReasoningParser",
    "MinimaxM2ReasoningParser",
    "MistralReasoningParser",
    "Olmo3ReasoningParser",
    "Qwen3ReasoningParser",
    "SeedOssReasoningParser",
    "Step3ReasoningParser",
    "ReasoningDelta",
    "ReasoningParser",
    "ReasoningStream",
    "prompt_opens_reasoning",
]


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass
class ReasoningDelta:
    """What a piece of output adds: thinking text and answer text."""

    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


_START, _REASONING, _ANSWER_OPEN, _ANSWER, _CONTENT = range(5)


@mypyc_attr(allow_interpreted_subclasses=True)
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

    def plain(self, text: str, content_ok: bool = True) -> int:
        """The fast path of ``feed``: 1 when ``text`` is certainly all thinking, 2 when it is
        certainly all answer (only if ``content_ok``), each taken as ``feed`` would take it;
        0 when ``feed`` must look at it (nothing taken). A parser without a fast path answers
        0 always."""
        return 0

    def parse(self, text: str) -> ReasoningDelta:
        """A whole output at once."""
        out = self.feed(text)
        tail = self.finish()
        return ReasoningDelta(out.reasoning + tail.reasoning, out.content + tail.content)

    def _run(self, text: str, *, final: bool) -> ReasoningDelta:
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)
class ReasoningParser(ReasoningStream):
    """Thinking between markers, described by data (subclasses set the class attributes): the
    output opens with one of ``start_tags`` (or is thinking from its start: ``implicit_start``,
    or a prompt that opened it), and thinking ends at one of ``end_tags``. A tag in
    ``end_keep_tags`` (a tool-call opener that is a special token) also ends it, and stays in the
    answer for the tool-call parser. ``answer_tags``: markup around the answer, dropped."""

    #: Markers that open the thinking at the start of the output (the first is the canonical).
    start_tags: ClassVar[tuple[str, ...]] = ("<think>",)
    #: Markers that end it.
    end_tags: ClassVar[tuple[str, ...]] = ("</think>",)
    #: Markers that end it and belong to the answer.
    end_keep_tags: ClassVar[tuple[str, ...]] = ()
    #: Tags around the answer (open, close), dropped.
    answer_tags: ClassVar[tuple[str, str] | None] = None
    #: Whether an output that does not open with a start tag is reasoning anyway.
    implicit_start: ClassVar[bool] = False

    #: The canonical markers (the first of each).
    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.start_tag = cls.start_tags[0]
        cls.end_tag = cls.end_tags[0]

    def __init__(self, *, prompt_in_reasoning: bool = False) -> None:
        self._buf = ""
        self._state = _START
        self._implicit = self.implicit_start or prompt_in_reasoning
        self.reasoning_end = None
        self._consumed = 0
        self._ends = self.end_tags + self.end_keep_tags
        #: The characters a marker that ends the thinking starts with (text without any of
        #: them cannot hold one, nor the start of one).
        self._end_firsts: tuple[str, ...] | None = (
            None if not all(self._ends) else tuple(sorted({m[0] for m in self._ends}))
        )

    def plain(self, text: str, content_ok: bool = True) -> int:
        """The fast path of ``feed``: a piece that holds no character a closing marker starts
        with, in thinking, is thinking; any piece once the answer has begun (no answer markup
        left) is answer; nothing held back either way."""
        if self._buf:
            return 0
        state = self._state
        if state == _CONTENT:
            return 2 if content_ok else 0
        if state == _REASONING and self._end_firsts is not None:
            for c in self._end_firsts:
                if c in text:
                    return 0
            self._consumed += len(text)
            return 1
        return 0

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
        self._buf = ""
        out = ReasoningDelta()
        while True:
            state = self._state
            if state == _START:
                tag = next((t for t in self.start_tags if buf.startswith(t)), None)
                if tag is not None:
                    self._consumed += len(tag)
                    buf = buf[len(tag) :]
                    self._state = _REASONING
                elif not final and any(t.startswith(buf) for t in self.start_tags):
                    self._buf = buf  # may still become an opening tag
                    return out
                else:
                    self._state = _REASONING if self._implicit else self._answer_state()
            elif state == _REASONING:
                at, marker = find_marker(buf, self._ends, final=final)
                out.reasoning += buf[:at]
                self._consumed += at
                if marker is None:
                    self._buf = buf[at:]
                    return out
                if marker in self.end_tags:
                    self._consumed += len(marker)
                    buf = buf[at + len(marker) :]
                else:  # a call's opener: the answer starts with it
                    buf = buf[at:]
                self.reasoning_end = self._consumed
                self._state = self._answer_state()
            elif state == _ANSWER_OPEN:
                assert self.answer_tags is not None
                opener = self.answer_tags[0]
                s = buf.lstrip()
                if s.startswith(opener):
                    buf = s[len(opener) :]
                    self._state = _ANSWER
                elif not final and (not s or opener.startswith(s)):
                    self._buf = buf
                    return out
                else:
                    self._state = _CONTENT
            elif state == _ANSWER:
                assert self.answer_tags is not None
                at, marker = find_marker(buf, (self.answer_tags[1],), final=final)
                out.content += buf[:at]
                if marker is None:
                    self._buf = buf[at:]
                    return out
                buf = buf[at + len(marker) :]
                self._state = _CONTENT
            else:
                out.content += buf
                return out

    def _answer_state(self) -> int:
        return _ANSWER_OPEN if self.answer_tags else _CONTENT


@mypyc_attr(allow_interpreted_subclasses=True)
class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3 (and QwQ): ``<think>`` opens the output, or the prompt already opened it."""

    name = "qwen3"


@mypyc_attr(allow_interpreted_subclasses=True)
class DeepSeekR1ReasoningParser(ReasoningParser):
    """DeepSeek-R1: reasoning until ``</think>``, opened or not."""

    name = "deepseek_r1"
    implicit_start = True


@mypyc_attr(allow_interpreted_subclasses=True)
class DeepSeekV3ReasoningParser(ReasoningParser):
    """DeepSeek-V3.1/V3.2: thinking only when the request turns it on, which its template does
    by opening ``<think>`` in the prompt."""

    name = "deepseek_v3"


@mypyc_attr(allow_interpreted_subclasses=True)
class Glm45ReasoningParser(ReasoningParser):
    """GLM-4.5/4.6/4.7: ``<think>`` opens the output (``enable_thinking: false`` closes it in the
    prompt); a ``<tool_call>`` ends unclosed thinking."""

    name = "glm45"
    needs_special_tokens = True
    end_keep_tags = ("<tool_call>",)


@mypyc_attr(allow_interpreted_subclasses=True)
class GraniteReasoningParser(ReasoningParser):
    """Granite 3.2+: ``Here is my thought process:`` ... ``Here is my response:`` (or
    ``Here's``), plain text."""

    name = "granite"
    start_tags = ("Here is my thought process:", "Here's my thought process:")
    end_tags = ("Here is my response:", "Here's my response:")


@mypyc_attr(allow_interpreted_subclasses=True)
class HunyuanA13BReasoningParser(ReasoningParser):
    """Hunyuan-A13B: ``<think>`` ... ``</think>``, the answer in ``<answer>`` tags."""

    name = "hunyuan_a13b"
    answer_tags = ("<answer>", "</answer>")


@mypyc_attr(allow_interpreted_subclasses=True)
class MistralReasoningParser(ReasoningParser):
    """Magistral (Mistral tokenizer v13+): ``[THINK]`` ... ``[/THINK]`` special tokens; a
    ``[TOOL_CALLS]`` ends unclosed thinking."""

    name = "mistral"
    needs_special_tokens = True
    start_tags = ("[THINK]",)
    end_tags = ("[/THINK]",)
    end_keep_tags = ("[TOOL_CALLS]",)


@mypyc_attr(allow_interpreted_subclasses=True)
class Step3ReasoningParser(ReasoningParser):
    """Step-3: thinking until ``</think>`` (its template opens it)."""

    name = "step3"
    implicit_start = True


@mypyc_attr(allow_interpreted_subclasses=True)
class SeedOssReasoningParser(ReasoningParser):
    """Seed-OSS: ``<seed:think>`` ... ``</seed:think>``; a ``<seed:tool_call>`` ends unclosed
    thinking."""

    name = "seed_oss"
    needs_special_tokens = True
    start_tags = ("<seed:think>",)
    end_tags = ("</seed:think>",)
    end_keep_tags = ("<seed:tool_call>",)


@mypyc_attr(allow_interpreted_subclasses=True)
class MinimaxM2ReasoningParser(ReasoningParser):
    """MiniMax-M2: thinking until ``</think>`` (the template opens it); a
    ``<minimax:tool_call>`` ends unclosed thinking."""

    name = "minimax_m2"
    needs_special_tokens = True
    implicit_start = True
    end_keep_tags = ("<minimax:tool_call>",)


@mypyc_attr(allow_interpreted_subclasses=True)
class KimiK2ReasoningParser(ReasoningParser):
    """Kimi K2 (Thinking): ``<think>`` ... ``</think>``; a tool-calls section ends unclosed
    thinking."""

    name = "kimi_k2"
    needs_special_tokens = True
    end_keep_tags = ("<|tool_calls_section_begin|>",)


@mypyc_attr(allow_interpreted_subclasses=True)
class Ernie45ReasoningParser(ReasoningParser):
    """ERNIE-4.5 thinking models: thinking until ``</think>``, the answer in ``<response>``
    tags."""

    name = "ernie45"
    implicit_start = True
    answer_tags = ("<response>", "</response>")


@mypyc_attr(allow_interpreted_subclasses=True)
class Olmo3ReasoningParser(ReasoningParser):
    """OLMo 3 Think: thinking until ``</think>`` (``<think>`` optional, plain text)."""

    name = "olmo3"
    implicit_start = True


REASONING_PARSERS: dict[str, Any] = {
    cls.name: cls
    for cls in (
        Qwen3ReasoningParser,
        DeepSeekR1ReasoningParser,
        DeepSeekV3ReasoningParser,
        Glm45ReasoningParser,
        GraniteReasoningParser,
        HunyuanA13BReasoningParser,
        MistralReasoningParser,
        Step3ReasoningParser,
        SeedOssReasoningParser,
        MinimaxM2ReasoningParser,
        KimiK2ReasoningParser,
        Ernie45ReasoningParser,
        Olmo3ReasoningParser,
    )
}


def prompt_opens_reasoning(prompt_text: str, parser: Any) -> bool:
    """Whether the rendered prompt ends inside an opened, unclosed thinking block (the template
    started the model's thinking for it)."""
    starts = getattr(parser, "start_tags", None)
    if not starts:
        return False
    start = max(prompt_text.rfind(tag) for tag in starts)
    if start == -1:
        return False
    ends = tuple(getattr(parser, "end_tags", ())) + tuple(getattr(parser, "end_keep_tags", ()))
    return not any(prompt_text.find(tag, start) != -1 for tag in ends)
