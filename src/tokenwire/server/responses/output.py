"""What a Responses request gets back: the response object, its output items (``reasoning``, a
``message`` with ``output_text``, ``function_call``s) made from the output's reasoning, text and
tool calls as the chat route's parsers split them, its ``usage``, and, streamed, the semantic
events in order with their ``sequence_number`` (``ResponseEvents``)."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from tokenwire.messages.finish_reason import FinishReason
from tokenwire.parsers import ToolCall
from tokenwire.parsers.output import OutputDelta
from tokenwire.server.responses.request import ResponsesRequest

__all__ = [
    "ResponseEvents",
    "error_object",
    "mcp_item",
    "output_items",
    "response_object",
    "status_of",
    "usage",
]

_json = msgspec.json.Encoder()


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def status_of(fr: FinishReason | None) -> tuple[str, dict[str, Any] | None]:
    """The response's ``status`` and ``incomplete_details`` for how its output ended: cut by
    the token limit, ``incomplete``; aborted (``/v1/responses/{id}/cancel``, SGLang's
    ``/abort_request``), ``cancelled``; else ``completed``."""
    kind = fr.kind if fr is not None else "stop"
    if kind == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if kind == "abort":
        return "cancelled", None
    return "completed", None


def usage(
    input_tokens: int, output_tokens: int, reasoning_tokens: int, cached_tokens: int
) -> dict[str, Any]:
    """The Responses ``usage`` object (the engine reports no cache writes: 0)."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def error_object(status: int, message: str) -> dict[str, Any]:
    """A failed response's ``error``: its code for the error's HTTP status
    (``rate_limit_exceeded`` or ``server_error``) and its message."""
    return {"code": "rate_limit_exceeded" if status == 429 else "server_error", "message": message}


def response_object(
    req: ResponsesRequest,
    model: str,
    created: int,
    *,
    status: str,
    output: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    incomplete: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object of ``req`` in its current state (``usage`` only once it is known:
    OpenAI's document has no null usage)."""
    body = {
        "id": req.id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": req.background,
        "error": error,
        "incomplete_details": incomplete,
        "model": model,
        "output": output or [],
        **req.echo,
        "store": req.store,
    }
    if usage is not None:
        body["usage"] = usage
    return body


def _message(text: str, status: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "id": item_id or _id("msg"),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _reasoning(text: str, status: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "id": item_id or _id("rs"),
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def _call(call_id: str, name: str, arguments: str, status: str, item_id: str | None = None):
    return {
        "id": item_id or _id("fc"),
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def mcp_item(
    kind: str, label: str, name: str, arguments: str, item_id: str | None = None
) -> dict[str, Any]:
    """An ``mcp_call`` (no output yet) or an ``mcp_approval_request``."""
    item: dict[str, Any] = {
        "id": item_id or _id("mcp" if kind == "mcp_call" else "mcpr"),
        "type": kind,
        "server_label": label,
        "name": name,
        "arguments": arguments,
    }
    if kind == "mcp_call":
        item |= {"output": None, "error": None, "status": "in_progress"}
    return item


def output_items(
    reasoning: str, content: str, calls: list[ToolCall], status: str
) -> list[dict[str, Any]]:
    """A whole output's items: its reasoning, its text (text that is only whitespace is no
    message of its own beside other items), its calls; the last is ``incomplete`` when the
    response is."""
    items = []
    if reasoning:
        items.append(_reasoning(reasoning, "completed"))
    if content.strip() or not (reasoning or calls):
        items.append(_message(content, "completed"))
    items += [_call(c.id, c.name, c.arguments, "completed") for c in calls]
    if status == "incomplete":
        items[-1]["status"] = "incomplete"
    return items


class _Open:
    """The output item being streamed."""

    __slots__ = ("call", "head", "id", "index", "kind", "label", "name", "pieces")

    def __init__(self, kind: str, index: int, item_id: str) -> None:
        # "message" | "reasoning" | "function_call" | "mcp_call" | "mcp_approval_request"
        self.kind = kind
        self.index = index  # its output_index
        self.id = item_id
        self.pieces: list[str] = []  # its text, or a call's arguments, as streamed
        self.call: tuple[int, str] | None = None  # a call's (parser index, call id)
        self.name = ""
        self.label = ""  # an MCP call's server
        #: Its delta events' fixed part, serialized once.
        self.head: bytes | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class ResponseEvents:
    """The events of one streamed response, as server-sent-event bytes: each piece of reasoning,
    text or tool call opens, extends or closes an output item. Text that is only whitespace
    waits for more (it becomes no message of its own before a call)."""

    def __init__(self, req: ResponsesRequest, model: str, created: int) -> None:
        self.req = req
        self.model = model
        self.created = created
        self.seq = 0
        #: The finished output items.
        self.items: list[dict[str, Any]] = []
        self._open: _Open | None = None
        self._blank = ""  # whitespace waiting to open a message
        #: Tools the server runs: name -> (MCP server label, whether a call waits for approval).
        self.mcp: dict[str, tuple[str, bool]] = {}
        #: Fields the response object adds (``truncated_items``: the oldest items dropped to
        #: fit the context, with ``truncation: "auto"``).
        self.extra: dict[str, Any] = {}

    def event(self, kind: str, **fields: Any) -> bytes:
        data = _json.encode({"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def response(self, status: str, **fields: Any) -> dict[str, Any]:
        body = response_object(self.req, self.model, self.created, status=status, **fields)
        return body | self.extra if self.extra else body

    def close(self, status: str = "completed") -> bytes:
        """Close the item being streamed (``incomplete`` when its output was cut)."""
        return self._close(status)

    def start(self) -> bytes:
        """``response.created`` and ``response.in_progress``."""
        head = self.event("response.created", response=self.response("in_progress"))
        return head + self.event("response.in_progress", response=self.response("in_progress"))

    def add(self, d: OutputDelta) -> bytes:
        """The events of one piece of output."""
        out = []
        if d.reasoning:
            out.append(self._text("reasoning", d.reasoning))
        if d.content:
            out.append(self._text("message", d.content))
        for call in d.tool_calls:
            if call.id is not None:
                out.append(self._close("completed"))
                if call.name in self.mcp:
                    out.append(self._open_mcp(call.index, call.id, call.name))
                else:
                    out.append(self._open_call(call.index, call.id, call.name or ""))
            if call.arguments:
                out.append(self._arguments(call.index, call.arguments))
        return b"".join(out)

    def finish(
        self,
        status: str,
        *,
        usage: dict[str, Any] | None = None,
        incomplete: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> bytes:
        """The last events: the open item closed, then ``response.completed``,
        ``response.incomplete`` (cut by the token limit, or cancelled) or ``response.failed``."""
        out = []
        if self._open is None and not self.items and status != "failed":
            out.append(self._begin("message"))  # no output at all: an empty message says so
            if self._blank:
                out.append(self._delta(self._blank))
        self._blank = ""
        out.append(self._close("completed" if status == "completed" else "incomplete"))
        kind = {"completed": "response.completed", "failed": "response.failed"}.get(
            status, "response.incomplete"
        )
        final = self.response(
            status, output=self.items, usage=usage, incomplete=incomplete, error=error
        )
        out.append(self.event(kind, response=final))
        return b"".join(out)

    # ---- items ---------------------------------------------------------------------------------

    def _text(self, kind: str, text: str) -> bytes:
        opened = self._open is not None and self._open.kind == kind
        out = b""
        if kind == "message" and not opened:
            if not (self._blank + text).strip():
                self._blank += text
                return b""
            text, self._blank = self._blank + text, ""
        if not opened:
            out = self._close("completed") + self._begin(kind)
        return out + self._delta(text)

    def _begin(self, kind: str) -> bytes:
        index = len(self.items)
        if kind == "message":
            item = _message("", "in_progress")
            item["content"] = []
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = _reasoning("", "in_progress")
            item["content"] = []
            part = {"type": "reasoning_text", "text": ""}
        self._open = _Open(kind, index, item["id"])
        added = self.event("response.output_item.added", output_index=index, item=item)
        return added + self.event(
            "response.content_part.added",
            item_id=item["id"],
            output_index=index,
            content_index=0,
            part=part,
        )

    def _delta(self, text: str) -> bytes:
        item = self._open
        assert item is not None
        item.pieces.append(text)
        if item.kind == "message":
            return self._piece(item, "response.output_text.delta", text, logprobs=[])
        return self._piece(item, "response.reasoning_text.delta", text)

    def _piece(self, item: _Open, kind: str, piece: str, **fixed: Any) -> bytes:
        """A delta event of ``item`` (a streamed token's cost: its fixed fields are serialized
        once, only the sequence number and the piece each time)."""
        if item.head is None:
            fields = {"type": kind, "item_id": item.id, "output_index": item.index, **fixed}
            if item.kind != "function_call":
                fields["content_index"] = 0
            head = _json.encode(fields)[:-1] + b',"sequence_number":'
            item.head = b"event: " + kind.encode() + b"\ndata: " + head
        data = item.head + str(self.seq).encode() + b',"delta":' + _json.encode(piece) + b"}\n\n"
        self.seq += 1
        return data

    def _open_call(self, index: int, call_id: str, name: str) -> bytes:
        out = self._close("completed")
        item = _call(call_id, name, "", "in_progress")
        self._open = _Open("function_call", len(self.items), item["id"])
        self._open.call = (index, call_id)
        self._open.name = name
        return out + self.event(
            "response.output_item.added", output_index=self._open.index, item=item
        )

    def _open_mcp(self, index: int, call_id: str, name: str) -> bytes:
        """A call of a tool the server runs: an ``mcp_call`` (or, when it waits for the
        client's approval, an ``mcp_approval_request``)."""
        label, approval = self.mcp[name]
        kind = "mcp_approval_request" if approval else "mcp_call"
        item = mcp_item(kind, label, name, "")
        self._open = _Open(kind, len(self.items), item["id"])
        self._open.call = (index, call_id)
        self._open.name = name
        self._open.label = label
        if approval:
            return b""  # (an approval request is added whole when its arguments are in)
        return self.event("response.output_item.added", output_index=self._open.index, item=item)

    def _arguments(self, index: int, piece: str) -> bytes:
        item = self._open
        if item is None or item.call is None or item.call[0] != index:
            # (the parsers stream one call after another: a call's arguments never follow the
            # next call's start)
            return b""
        item.pieces.append(piece)
        if item.kind == "mcp_approval_request":
            return b""
        if item.kind == "mcp_call":
            return self._piece(item, "response.mcp_call_arguments.delta", piece)
        return self._piece(item, "response.function_call_arguments.delta", piece)

    # ---- items the server adds (MCP) -------------------------------------------------------------

    def added(self, item: dict[str, Any]) -> tuple[int, bytes]:
        """A whole item the server adds, opened: its output index and its events."""
        out = self._close("completed")
        index = len(self.items)
        self.items.append(item)
        out += self.event("response.output_item.added", output_index=index, item=item)
        if item["type"] == "mcp_list_tools":
            out += self.event(
                "response.mcp_list_tools.in_progress", item_id=item["id"], output_index=index
            )
        elif item["type"] == "mcp_call":
            out += self.event(
                "response.mcp_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=item["arguments"],
            )
            out += self.event(
                "response.mcp_call.in_progress", item_id=item["id"], output_index=index
            )
        return index, out

    def done(self, index: int, **fields: Any) -> bytes:
        """Item ``index`` (an MCP listing or call) is over: ``fields`` set on it (``tools``,
        ``output``, ``error``, ``status``), its events."""
        item = self.items[index]
        item.update(fields)
        failed = item.get("error") is not None
        if item["type"] == "mcp_call":
            item["status"] = "failed" if failed else "completed"
        kind = {"mcp_list_tools": "response.mcp_list_tools", "mcp_call": "response.mcp_call"}[
            item["type"]
        ]
        out = self.event(
            f"{kind}.failed" if failed else f"{kind}.completed",
            item_id=item["id"],
            output_index=index,
        )
        return out + self.event("response.output_item.done", output_index=index, item=item)

    def _close(self, status: str) -> bytes:
        """Close the open item (``status``: ``completed``, or ``incomplete`` when the response
        ended before it did)."""
        item, self._open = self._open, None
        if item is None:
            return b""
        at = {"item_id": item.id, "output_index": item.index}
        text = item.text
        if item.kind == "mcp_call":
            # (run once the response's round is over: ``done`` ends it)
            whole = mcp_item("mcp_call", item.label, item.name, text, item.id)
            whole["status"] = "calling"
            self.items.append(whole)
            return self.event("response.mcp_call_arguments.done", **at, arguments=text) + (
                self.event("response.mcp_call.in_progress", **at)
            )
        if item.kind == "mcp_approval_request":
            whole = mcp_item("mcp_approval_request", item.label, item.name, text, item.id)
            self.items.append(whole)
            added = self.event("response.output_item.added", output_index=item.index, item=whole)
            return added + self.event(
                "response.output_item.done", output_index=item.index, item=whole
            )
        if item.kind == "function_call":
            assert item.call is not None
            whole = _call(item.call[1], item.name, text, status, item.id)
            done = self.event(
                "response.function_call_arguments.done", **at, name=item.name, arguments=text
            )
        elif item.kind == "message":
            whole = _message(text, status, item.id)
            part = whole["content"][0]
            done = self.event(
                "response.output_text.done", **at, content_index=0, text=text, logprobs=[]
            ) + self.event("response.content_part.done", **at, content_index=0, part=part)
        else:
            whole = _reasoning(text, status, item.id)
            part = whole["content"][0]
            done = self.event(
                "response.reasoning_text.done", **at, content_index=0, text=text
            ) + self.event("response.content_part.done", **at, content_index=0, part=part)
        self.items.append(whole)
        return done + self.event("response.output_item.done", output_index=item.index, item=whole)
