"""OpenAI's harmony format (gpt-oss), incrementally: an output is a run of messages,
``<|start|>assistant<|channel|>analysis<|message|>...<|end|>`` and so on, each with a channel
(``analysis`` thinking, ``commentary``, ``final`` answer) and maybe a recipient
(``to=functions.get_weather``), its body ending at ``<|end|>``, ``<|return|>`` or ``<|call|>``.
``HarmonyScanner`` turns text pieces into message events; the ``gpt_oss`` reasoning parser and
the ``openai`` tool-call parser are built on it. The markup is special tokens: the text must keep
them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tokenwire.parsers.markers import find_marker
from tokenwire.parsers.reasoning import ReasoningDelta, ReasoningStream
from tokenwire.parsers.tools.base import ToolCallParser, ToolDelta

__all__ = ["GptOssReasoningParser", "HarmonyEvent", "HarmonyScanner", "OpenAIToolParser"]

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, RETURN, CALL, CONSTRAIN = "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"
_BODY_ENDS = (END, RETURN, CALL, START)
_RECIPIENT = re.compile(r"to=(\S+)")

_OUT, _ROLE, _HEADER, _BODY = range(4)


@dataclass
class HarmonyEvent:
    """``text`` outside any message, a message's ``open`` (its channel and recipient), a
    ``body`` piece, or its ``close`` (the marker that ended it, "" at the end of the output)."""

    kind: str
    text: str = ""
    channel: str = ""
    recipient: str | None = None


class HarmonyScanner:
    """Message events from harmony text pieces; ``consumed`` counts the characters taken."""

    def __init__(self) -> None:
        self._buf = ""
        self._state = _OUT
        self._head = ""  # role and header text of the message being opened
        self.consumed = 0

    @property
    def in_body(self) -> bool:
        return self._state == _BODY

    def feed(self, text: str, *, final: bool = False) -> list[HarmonyEvent]:
        buf = self._buf + text
        events: list[HarmonyEvent] = []
        while True:
            state = self._state
            if state == _OUT:
                at, marker = find_marker(buf, (START, CHANNEL), final=final)
                if at:
                    events.append(HarmonyEvent("text", buf[:at]))
                self.consumed += at
                buf = buf[at:]
                if marker is None:
                    break
                self.consumed += len(marker)
                buf = buf[len(marker) :]
                self._head = "" if marker == START else " <channel>"
                self._state = _ROLE if marker == START else _HEADER
            elif state in (_ROLE, _HEADER):
                markers = (CHANNEL, MESSAGE) if state == _ROLE else (MESSAGE,)
                at, marker = find_marker(buf, markers, final=final)
                if marker is None:
                    if final:  # a header the output never finished: dropped
                        self.consumed += len(buf)
                        buf = ""
                    break
                self._head += " " + buf[:at]
                self.consumed += at + len(marker)
                buf = buf[at + len(marker) :]
                if marker == CHANNEL:
                    self._state = _HEADER
                    self._head += " <channel>"
                    continue
                events.append(self._open())
                self._state = _BODY
            else:
                at, marker = find_marker(buf, _BODY_ENDS, final=final)
                if at:
                    events.append(HarmonyEvent("body", buf[:at]))
                self.consumed += at
                buf = buf[at:]
                if marker is None:
                    if final:
                        events.append(HarmonyEvent("close"))
                        self._state = _OUT
                    break
                events.append(HarmonyEvent("close", marker))
                if marker == START:
                    self._state = _OUT  # a new message begins: its start is read in _OUT
                    continue
                self.consumed += len(marker)
                buf = buf[len(marker) :]
                self._state = _OUT
        self._buf = buf
        return events

    def _open(self) -> HarmonyEvent:
        head = self._head.replace(CONSTRAIN, " ")
        m = _RECIPIENT.search(head)
        recipient = m.group(1) if m else None
        channel = ""
        if "<channel>" in head:
            words = head.split("<channel>", 1)[1].split()
            channel = next((w for w in words if not w.startswith("to=")), "")
        return HarmonyEvent("open", channel=channel, recipient=recipient)


def _is_call(event: HarmonyEvent) -> bool:
    return event.recipient is not None and event.recipient.startswith("functions.")


class GptOssReasoningParser(ReasoningStream):
    """``gpt_oss``: the ``analysis`` channel is reasoning; the rest is the answer (a tool call's
    message is passed on as ``<|channel|>commentary to=functions.NAME<|message|>ARGS<|call|>``
    for the ``openai`` tool-call parser)."""

    name = "gpt_oss"
    needs_special_tokens = True

    def __init__(self, *, prompt_in_reasoning: bool = False) -> None:
        self._scan = HarmonyScanner()
        self._mode = ""  # "reasoning", "content", "call" while in a message body
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
            if ev.kind == "text":
                out.content += ev.text
            elif ev.kind == "open":
                if ev.channel == "analysis" and not _is_call(ev):
                    self._mode = "reasoning"
                elif _is_call(ev):
                    self._mode = "call"
                    out.content += (
                        f"{CHANNEL}{ev.channel or 'commentary'} to={ev.recipient}{MESSAGE}"
                    )
                else:
                    self._mode = "content"
            elif ev.kind == "body":
                if self._mode == "reasoning":
                    out.reasoning += ev.text
                else:
                    out.content += ev.text
            else:  # close
                if self._mode == "call":
                    out.content += CALL
                elif self._mode == "reasoning" and self.reasoning_end is None:
                    self.reasoning_end = self._scan.consumed
                self._mode = ""
        return out


class OpenAIToolParser(ToolCallParser):
    """``openai``: harmony messages to ``functions.NAME`` are calls (the body their arguments);
    the other messages' text is content."""

    name = "openai"
    needs_special_tokens = True

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._scan = HarmonyScanner()
        self._index = -1

    def _step(self, out: ToolDelta, *, final: bool) -> None:
        text, self._buf = self._buf, ""
        for ev in self._scan.feed(text, final=final):
            if ev.kind == "text":
                out.content += ev.text
            elif ev.kind == "open":
                self._index = -1
                if _is_call(ev):
                    self._index = self._new_call(out, ev.recipient.split(".", 1)[1])
            elif ev.kind == "body":
                if self._index >= 0:
                    self._add_args(out, self._index, ev.text)
                else:
                    out.content += ev.text
            else:
                self._index = -1
