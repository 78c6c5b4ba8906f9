"""Requests of the other conversational APIs (OpenAI's Responses API, Anthropic's Messages API)
read as the chat completions request they amount to: ``parse_chat`` turns that into the same
``Plan`` a chat request gets, so the template, the limits, the checks, the defaults, the tool
choice and the output parsers are the chat route's. Errors name the fields as the client spelled
them (``RENAMES`` of each API)."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tokenwire.context_length import encode_within
from tokenwire.messages.errors import TokenwireError
from tokenwire.parsers import ToolCall
from tokenwire.parsers.output import OutputDelta
from tokenwire.runtime import DEFAULT_FEATURES, Features, Plan
from tokenwire.server.config import DEFAULT_LIMITS, RequestLimits
from tokenwire.server.fields import check_text_length
from tokenwire.server.openai.chat_output import ChoiceOutput
from tokenwire.server.openai.chunks import reasoning_count
from tokenwire.server.openai.parse import parse_chat, render_conversation
from tokenwire.tokenizer import Tokenizer

if TYPE_CHECKING:
    from tokenwire.runtime.models import ServedModels

__all__ = ["Renames", "SplitOutput", "count_chat_tokens", "parse_as_chat", "renamed"]


class Renames:
    """Chat field names, as they appear in error messages and ``param``, replaced by another
    API's (whole names only: ``stop`` is renamed, ``stop_token_ids`` is not)."""

    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = dict(names)
        keys = sorted(self.names, key=len, reverse=True)
        self._pattern = (
            re.compile("|".join(rf"(?<!\w){re.escape(k)}(?!\w)" for k in keys)) if keys else None
        )

    def __call__(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self.names[m.group(0)], text)


def renamed(err: TokenwireError, names: Renames) -> TokenwireError:
    """``err`` with the fields it names spelled as ``names`` says."""
    detail = names(err.detail)
    param = names(err.param) if err.param is not None else None
    if detail == err.detail and param == err.param:
        return err
    out = copy.copy(err)
    out.detail = detail
    out.param = param
    out.args = (detail,)
    return out


def parse_as_chat(
    chat: dict[str, Any],
    tok: Tokenizer,
    model: str | ServedModels,
    names: Renames,
    *,
    limits: RequestLimits = DEFAULT_LIMITS,
    features: Features = DEFAULT_FEATURES,
) -> Plan:
    """The ``Plan`` of a chat completions request ``chat`` (translated from another API, whose
    field names ``names`` gives back in errors)."""
    try:
        return parse_chat(chat, tok, model, limits=limits, features=features)
    except TokenwireError as err:
        raise renamed(err, names) from None


def count_chat_tokens(
    chat: dict[str, Any], tok: Tokenizer, names: Renames, features: Features = DEFAULT_FEATURES
) -> int:
    """How many tokens the prompt of chat request ``chat`` has, rendered as ``parse_chat``
    renders it; one past the context length is refused as the chat route refuses it (after
    tokenizing a bounded part of it), so what a count costs is bounded as a generation's is."""
    where = "the rendered conversation"
    try:
        text, _ = render_conversation(chat, tok, features)
        check_text_length(text, tok, where, "messages")
        ids = encode_within(tok, text, add_special_tokens=False, where=where, field="messages")
    except TokenwireError as err:
        raise renamed(err, names) from None
    return len(ids)


class SplitOutput:
    """One choice's output split as the chat route splits it (reasoning, text, tool calls: its
    ``ChoiceOutput``), or all text when the plan parses nothing (no tools, no reasoning
    parser)."""

    def __init__(self, plan: Plan, tok: Tokenizer) -> None:
        self.plan = plan
        self.parsed = (
            ChoiceOutput(plan.output, tok, plan.reasoning_fields, parallel=plan.parallel_tool_calls)
            if plan.output is not None
            else None
        )

    def pieces(self, text: str, token_ids: Any, *, final: bool = False) -> OutputDelta:
        """The next piece's reasoning, text and call deltas (``final``: and what was held)."""
        if self.parsed is None:
            return OutputDelta(content=text)
        return self.parsed.pieces(text, token_ids, final=final)

    def whole(self, text: str, token_ids: Any) -> tuple[str, str, list[ToolCall]]:
        """A whole output: its reasoning, its text and its calls."""
        if self.parsed is None:
            return "", text, []
        return self.parsed.parts(text, token_ids)

    @property
    def called(self) -> bool:
        """Whether the model called a tool."""
        return self.parsed is not None and self.parsed.called

    def reasoning_tokens(self, engine: int) -> int:
        """Output tokens spent reasoning: the engine's count, else the reasoning parser's."""
        spec = self.plan.output
        parsed = self.parsed
        mine = parsed.reasoning_tokens if parsed is not None and spec and spec.reasoning else None
        return reasoning_count(engine, mine) or 0
