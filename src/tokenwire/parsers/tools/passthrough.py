"""``passthrough``: no tool calls are read; the answer is content as written (smg's parser of
that name, for a model whose calls a client parses itself)."""

from __future__ import annotations

from tokenwire.parsers.tools.base import ToolCallParser, ToolDelta

__all__ = ["PassthroughToolParser"]


class PassthroughToolParser(ToolCallParser):
    """Everything is content."""

    name = "passthrough"

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        out.content += self._buf
        self._buf = ""
