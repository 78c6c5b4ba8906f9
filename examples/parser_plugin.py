"""A parser plugin: the tool calls and the thinking of a model tokenwire has no parser for.

    tokenwire serve ... --tool-parser-plugin examples/parser_plugin.py \
        --enable-auto-tool-choice --tool-call-parser acme --reasoning-parser acme

The model thinks in ``<reflect>...</reflect>`` and writes each call as ``<call>{"name": ...,
"arguments": {...}}</call>`` (the JSON shape Hermes uses, in its own tags), or one call a line as
``>>> NAME {JSON arguments}``.
"""

from __future__ import annotations

import json
from typing import Any

from tokenwire.parsers import (
    JsonMarkup,
    JsonToolParser,
    ReasoningParser,
    ToolCallParser,
    ToolDelta,
    register_reasoning_parser,
    register_tool_parser,
)


@register_tool_parser("acme")
class AcmeToolParser(JsonToolParser):
    """``<call>{"name": ..., "arguments": {...}}</call>``: a family's shared parser, with the
    markup as data."""

    markup = JsonMarkup({"<call>": "</call>"}, body="object")


@register_reasoning_parser("acme")
class AcmeReasoningParser(ReasoningParser):
    """Thinking between ``<reflect>`` and ``</reflect>`` at the start of the output."""

    start_tags = ("<reflect>",)
    end_tags = ("</reflect>",)


@register_tool_parser("acme_lines")
class AcmeLineToolParser(ToolCallParser):
    """``>>> NAME {JSON arguments}``, one call a line: a parser of its own. ``_step`` takes
    ``self._buf`` (the text not consumed yet) as far as it is certain and adds content and calls
    to ``out``; ``final``: the output is over."""

    prompt = ">>> "

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._in_text = False  # the current line is text: it did not start as a call

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        while self._buf:
            line, newline, rest = self._buf.partition("\n")
            if self._in_text or not line.startswith(self.prompt[: len(line)]):
                out.content += line + newline  # no call: the text goes out at once
                self._in_text = not newline
            elif not newline and not final:
                return  # a call (or the start of one) being written: wait for the line's end
            elif (call := self._call(line)) is not None:
                self._whole_call(out, *call)  # its name and arguments at once
            else:
                out.content += line + newline
            self._buf = rest

    def _call(self, line: str) -> tuple[str, str] | None:
        if not line.startswith(self.prompt):
            return None
        name, _, args = line[len(self.prompt) :].strip().partition(" ")
        try:
            arguments = json.loads(args or "{}")
        except ValueError:
            return None
        if not name.isidentifier() or not isinstance(arguments, dict):
            return None
        return name, json.dumps(arguments, ensure_ascii=False)
