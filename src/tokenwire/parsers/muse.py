"""Muse (Muse Spark, Muse Glimmer): an output is a run of messages, each a header naming its
recipient and a body, incrementally::

    <|start|>assistant to=self<|message|>thinking<|eom|>
    <|start|>assistant to=get_weather<|message|><atem:function_calls>
    <atem:invoke name="get_weather"><atem:parameter name="city">Paris</atem:parameter>
    </atem:invoke></atem:function_calls><|eom|>
    <|start|>assistant to=user<|message|>the answer<|eot|>

The first message's header may lack ``<|start|>assistant`` (the prompt wrote it). ``to=self``
(or no recipient) is thinking, ``to=user`` and ``to=commentary`` are content, ``to=developer``
is dropped, any other recipient's body holds ATEM calls (read by the XML machine). A call
written inside a thinking or answer message is no call. The ``muse_glimmer`` reasoning parser
passes every message but the thinking on as written, for the ``muse_glimmer`` tool-call parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tokenwire.parsers.markers import find_marker
from tokenwire.parsers.reasoning import ReasoningDelta, ReasoningStream
from tokenwire.parsers.tools.base import ToolCallParser, ToolDelta
from tokenwire.parsers.tools.xml import XmlMarkup, XmlToolParser

__all__ = ["MuseReasoningParser", "MuseScanner", "MuseToolParser"]

START, MESSAGE, EOM, EOT = "<|start|>", "<|message|>", "<|eom|>", "<|eot|>"
_RECIPIENT = re.compile(r"to=([A-Za-z0-9_.\-]+)")
_CONTENT_RECIPIENTS = ("user", "commentary")
_OUT, _HEADER, _BODY = range(3)


@dataclass
class MuseEvent:
    """``open`` (a message's recipient, "" for none, and its raw header), ``body``, ``close``
    (the raw end marker, "" at the output's end)."""

    kind: str
    text: str = ""
    recipient: str = ""


class MuseScanner:
    """Message events from Muse text pieces."""

    def __init__(self) -> None:
        self._buf = ""
        self._state = _OUT
        self._head = ""
        self._first = True  # only the first message's header may lack <|start|>

    def feed(self, text: str, *, final: bool = False) -> list[MuseEvent]:
        buf = self._buf + text
        events: list[MuseEvent] = []
        while True:
            if self._state == _BODY:
                at, marker = find_marker(buf, (EOM, EOT, START), final=final)
                if at:
                    events.append(MuseEvent("body", buf[:at]))
                buf = buf[at:]
                if marker is None:
                    if final:
                        events.append(MuseEvent("close"))
                        self._state = _OUT
                    break
                if marker == START:  # a new message: its start is read as a header
                    events.append(MuseEvent("close"))
                else:
                    events.append(MuseEvent("close", marker))
                    buf = buf[len(marker) :]
                self._state = _OUT
                continue
            # _OUT / _HEADER: the header is the text up to <|message|> (from <|start|>, or
            # from the output's start for the first message)
            if self._state == _OUT and not self._first:
                at, marker = find_marker(buf, (START,), final=final)
                if at:
                    events.append(MuseEvent("text", buf[:at]))
                buf = buf[at:]
                if marker is None:
                    break
            at, marker = find_marker(buf, (START, MESSAGE), final=final)
            if marker is None:
                if final:
                    if self._head + buf:  # a header never finished: as written
                        events.append(MuseEvent("text", self._head + buf))
                    self._head, buf = "", ""
                break
            if marker == START:
                if self._head + buf[:at]:  # text between messages
                    events.append(MuseEvent("text", self._head + buf[:at]))
                self._first = False
                self._head = START
                buf = buf[at + len(START) :]
                self._state = _HEADER
                continue
            head = self._head + buf[: at + len(MESSAGE)]
            buf = buf[at + len(MESSAGE) :]
            self._head = ""
            self._first = False
            m = _RECIPIENT.search(head)
            events.append(MuseEvent("open", head, m.group(1) if m else ""))
            self._state = _BODY
        self._buf = buf
        return events


def _is_thinking(recipient: str) -> bool:
    return recipient in ("", "self")


class MuseReasoningParser(ReasoningStream):
    """``muse_glimmer``: ``to=self`` messages are the reasoning, ``to=user`` and
    ``to=commentary`` bodies the answer, ``to=developer`` ones dropped; a message to a tool
    goes on as written (for the ``muse_glimmer`` tool-call parser)."""

    name = "muse_glimmer"
    needs_special_tokens = True

    def __init__(self, *, prompt_in_reasoning: bool = False) -> None:
        self._scan = MuseScanner()
        self._mode = ""  # "reasoning", "content", "drop", "call" in a message
        self._decided = False
        self.reasoning_end: int | None = None

    @property
    def decided(self) -> bool:
        return self._decided

    @property
    def in_reasoning(self) -> bool:
        return self._mode == "reasoning"

    def _run(self, text: str, *, final: bool) -> ReasoningDelta:
        out = ReasoningDelta()
        for ev in self._scan.feed(text, final=final):
            self._decided = True
            if ev.kind == "open":
                self._mode = _mode(ev.recipient)
                if self._mode == "call":
                    out.content += f"{START}assistant to={ev.recipient}{MESSAGE}"
            elif ev.kind == "body":
                if self._mode == "reasoning":
                    out.reasoning += ev.text
                elif self._mode in ("content", "call"):
                    out.content += ev.text
            elif ev.kind == "close":
                if self._mode == "call":
                    out.content += ev.text or EOM
                self._mode = ""
            else:
                out.content += ev.text
        return out


def _mode(recipient: str) -> str:
    if _is_thinking(recipient):
        return "reasoning"
    if recipient in _CONTENT_RECIPIENTS:
        return "content"
    return "drop" if recipient == "developer" else "call"


_ATEM = XmlMarkup(
    block_open="<atem:function_calls>",
    block_close="</atem:function_calls>",
    call_open='<atem:invoke name="',
    name_end='">',
    call_close="</atem:invoke>",
    param_open='<atem:parameter name="',
    key_end='">',
    value_close="</atem:parameter>",
)


class _AtemCalls(XmlToolParser):
    markup = _ATEM


class MuseToolParser(ToolCallParser):
    """``muse_glimmer``: ATEM calls in the messages to a tool; ``to=user`` and
    ``to=commentary`` bodies are the content, ``to=developer`` ones dropped."""

    name = "muse_glimmer"
    needs_special_tokens = True

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._kw = kw
        self._scan = MuseScanner()
        self._recipient: str | None = None
        self._calls_parser: _AtemCalls | None = None

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        text, self._buf = self._buf, ""
        for ev in self._scan.feed(text, final=final):
            if ev.kind == "open":
                self._recipient = ev.recipient
                self._calls_parser = None
                if _mode(ev.recipient) == "call":
                    self._calls_parser = _AtemCalls(tools=self._tools_list())
                    self._calls_parser._calls = self._calls  # call indexes go on
                    self._calls_parser._make_id = self._make_id
            elif ev.kind == "body":
                if self._calls_parser is not None:
                    self._take(out, self._calls_parser.feed(ev.text))
                elif self._recipient != "developer":
                    out.content += ev.text
            elif ev.kind == "close":
                if self._calls_parser is not None:
                    self._take(out, self._calls_parser.finish())
                self._calls_parser = None
                self._recipient = None
            else:
                out.content += ev.text

    def _take(self, out: ToolDelta, d: ToolDelta) -> None:
        assert self._calls_parser is not None
        self._calls = self._calls_parser._calls
        out.calls.extend(d.calls)
        # text in a tool message outside the calls block carries nothing

    def _tools_list(self) -> Any:
        return self._kw.get("tools")
