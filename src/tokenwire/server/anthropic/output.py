"""What a Messages request gets back: the message object with its content blocks (``thinking``,
``text``, ``tool_use``) made from the output's reasoning, text and tool calls as the chat route's
parsers split them, its ``stop_reason`` and ``usage``, and, streamed, Anthropic's events
(``MessageEvents``)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from tokenwire.messages.finish_reason import FinishReason
from tokenwire.parsers import ToolCall
from tokenwire.parsers.output import OutputDelta

__all__ = [
    "MessageEvents",
    "content_blocks",
    "delta_usage",
    "message_object",
    "stop_fields",
    "usage",
]

#: A tool use the model made itself (not a server tool's).
_DIRECT = {"type": "direct"}

_json = msgspec.json.Encoder()


def stop_fields(
    fr: FinishReason | None, eos: tuple[int, ...], called: bool
) -> tuple[str | None, str | None]:
    """``stop_reason`` and ``stop_sequence``: ``max_tokens`` when cut by the limit, ``tool_use``
    when the model called a tool, ``stop_sequence`` (and which) for a stop sequence,
    ``end_turn`` otherwise; an aborted request has none."""
    if fr is None or fr.kind == "stop":
        if called:
            return "tool_use", None
        matched = fr.stop_reason(eos) if fr is not None else None
        if isinstance(matched, str):
            return "stop_sequence", matched
        return "end_turn", None
    if fr.kind == "length":
        return "max_tokens", None
    return None, None


def usage(input_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """Anthropic's usage: input tokens read from the prompt cache are counted apart. Every field
    Anthropic's API reference requires is there, null where there is nothing to say (no cache
    writes are made on request, no server tools, no geography or service tier)."""
    return {
        "input_tokens": input_tokens - cached_tokens,
        "cache_creation_input_tokens": None,
        "cache_read_input_tokens": cached_tokens,
        "cache_creation": None,
        "output_tokens": output_tokens,
        "output_tokens_details": None,
        "server_tool_use": None,
        "service_tier": None,
        "inference_geo": None,
    }


def delta_usage(input_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """``message_delta``'s usage (Anthropic's ``MessageDeltaUsage``: its own fields)."""
    return {
        "input_tokens": input_tokens - cached_tokens,
        "cache_creation_input_tokens": None,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens": output_tokens,
        "output_tokens_details": None,
        "server_tool_use": None,
    }


def content_blocks(reasoning: str, text: str, calls: list[ToolCall]) -> list[dict[str, Any]]:
    """A whole output's blocks: its thinking, its text (text that is only whitespace is no block
    of its own beside others), its tool uses (a call whose arguments are no JSON object, cut
    by the token limit, is left out)."""
    blocks: list[dict[str, Any]] = []
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    uses = []
    for call in calls:
        try:
            arguments = json.loads(call.arguments or "{}")
        except (ValueError, RecursionError):
            continue
        if isinstance(arguments, dict):
            uses.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": arguments,
                    "caller": _DIRECT,
                }
            )
    if text.strip() or not (blocks or uses):
        blocks.append({"type": "text", "text": text, "citations": None})
    return blocks + uses


def message_object(
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop: tuple[str | None, str | None],
    usage: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "stop_details": None,  # (a refusal's details: this server has none)
        "container": None,
        "usage": usage,
    }


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _json.encode({"type": kind, **data}) + b"\n\n"


#: Per block type: its deltas' type, and the key their piece is under.
_DELTAS = {
    "thinking": (b"thinking_delta", b"thinking"),
    "text": (b"text_delta", b"text"),
    "tool_use": (b"input_json_delta", b"partial_json"),
}


class MessageEvents:
    """The events of one streamed message, as server-sent-event bytes: each piece of thinking,
    text or tool call opens, extends or closes a content block. Text that is only whitespace
    waits for more (it becomes no block of its own before a tool use)."""

    def __init__(self, message_id: str, model: str, input_tokens: int) -> None:
        self.id = message_id
        self.model = model
        self.input_tokens = input_tokens
        self.blocks = 0  # blocks started
        self._kind: str | None = None  # the open block's type
        self._call: int | None = None  # the open tool_use block's call index
        self._head = b""  # the open block's delta events' fixed part, serialized once
        self._blank = ""
        #: Tools the server runs (``mcp_servers``): name -> its MCP server's name.
        self.mcp: dict[str, str] = {}

    def start(self) -> bytes:
        """``message_start`` and a ``ping``."""
        message = message_object(
            self.id, self.model, [], (None, None), usage(self.input_tokens, 0, 0)
        )
        return _event("message_start", {"message": message}) + _event("ping", {})

    def add(self, d: OutputDelta) -> bytes:
        """The events of one piece of output."""
        out = []
        if d.reasoning:
            out.append(self._delta("thinking", d.reasoning))
        if d.content:
            text = self._blank + d.content
            if self._kind != "text" and not text.strip():
                self._blank = text
            else:
                self._blank = ""
                out.append(self._delta("text", text))
        for call in d.tool_calls:
            if call.id is not None:
                out.append(self._stop())
                out.append(self._begin("tool_use", call.id, call.name or ""))
                self._call = call.index
            if call.arguments and self._kind == "tool_use" and self._call == call.index:
                out.append(self._piece(call.arguments))
        return b"".join(out)

    def finish(self, stop: tuple[str | None, str | None], output_tokens: int, cached: int) -> bytes:
        """The open block closed (an empty text block first when there was no output at all),
        ``message_delta`` with the stop reason and usage, ``message_stop``."""
        out = []
        if self.blocks == 0:
            out.append(self._begin("text"))
            if self._blank:
                out.append(self._piece(self._blank))
        self._blank = ""
        out.append(self._stop())
        delta = {
            "stop_reason": stop[0],
            "stop_sequence": stop[1],
            "stop_details": None,
            "container": None,
        }
        use = delta_usage(self.input_tokens, output_tokens, cached)
        out.append(_event("message_delta", {"delta": delta, "usage": use}))
        out.append(_event("message_stop", {}))
        return b"".join(out)

    # ---- blocks --------------------------------------------------------------------------------

    def _delta(self, kind: str, piece: str) -> bytes:
        out = b""
        if self._kind != kind:
            out = self._stop() + self._begin(kind)
        return out + self._piece(piece)

    def _piece(self, piece: str) -> bytes:
        """A ``content_block_delta`` of the open block (its fixed part serialized once)."""
        return self._head + _json.encode(piece) + b"}}\n\n"

    def _begin(self, kind: str, call_id: str = "", name: str = "") -> bytes:
        if kind == "thinking":
            block: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == "text":
            block = {"type": "text", "text": "", "citations": None}
        elif name in self.mcp:
            block = {
                "type": "mcp_tool_use",
                "id": call_id,
                "name": name,
                "server_name": self.mcp[name],
                "input": {},
            }
        else:
            block = {
                "type": "tool_use",
                "id": call_id,
                "name": name,
                "input": {},
                "caller": _DIRECT,
            }
        self._kind = kind
        self.blocks += 1
        delta, key = _DELTAS[kind]
        index = str(self.blocks - 1).encode()
        self._head = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
            + index
            + b',"delta":{"type":"'
            + delta
            + b'","'
            + key
            + b'":'
        )
        return _event("content_block_start", {"index": self.blocks - 1, "content_block": block})

    def block(self, block: dict[str, Any]) -> bytes:
        """A whole block the server adds (an ``mcp_tool_result``): started and stopped."""
        out = self._stop()
        self.blocks += 1
        index = self.blocks - 1
        out += _event("content_block_start", {"index": index, "content_block": block})
        return out + _event("content_block_stop", {"index": index})

    def close(self) -> bytes:
        """Stop the open block (a round of the model is over)."""
        self._blank = ""
        return self._stop()

    def _stop(self) -> bytes:
        if self._kind is None:
            return b""
        self._kind = self._call = None
        return _event("content_block_stop", {"index": self.blocks - 1})
