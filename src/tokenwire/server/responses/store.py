"""The responses a server keeps (``store``, the default): what ``GET /v1/responses/{id}`` returns
and what ``previous_response_id`` continues. Bounded: at most ``size`` responses, and at most
``max_chars`` characters in all (each response's conversation text, and what its object gives
back of its request: instructions, tools...); past either, the oldest go first. A
response is kept from its start (``in_progress``) and updated when it ends. Plain synchronous
object, one per server process."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenwire.messages.errors import TokenwireError, ValidationError

__all__ = ["DEFAULT_MAX_CHARS", "ResponseNotFoundError", "ResponseStore", "Stored"]

#: Most characters of conversation text the store keeps (about 256 MiB of text at most).
DEFAULT_MAX_CHARS = 64 << 20


class ResponseNotFoundError(TokenwireError):
    """No response with this id is kept (404, OpenAI's shape)."""

    status = 404
    prefix = "not found"
    error_type = "invalid_request_error"


@dataclass
class Stored:
    """One kept response."""

    #: The response object, as ``GET`` returns it.
    response: dict[str, Any]
    #: The conversation through this response's output (None while it runs).
    history: list[dict[str, Any]] | None = None
    #: Ends the response while it runs (background responses only).
    cancel: Callable[[], Any] | None = None
    #: Characters this entry adds to the store.
    chars: int = 0
    #: Of them, its request's (the response object gives them back).
    request_chars: int = 0

    @property
    def running(self) -> bool:
        return self.response["status"] in ("queued", "in_progress")


def _chars(messages: list[dict[str, Any]]) -> int:
    total = 0
    for m in messages:
        for key in ("content", "reasoning_content"):
            value = m.get(key)
            if isinstance(value, str):
                total += len(value)
        for call in m.get("tool_calls") or ():
            total += len(str(call.get("function", {}).get("arguments", "")))
    return total


class ResponseStore:
    """Kept responses by id, oldest evicted first past ``size`` entries or ``max_chars``."""

    def __init__(self, size: int, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        if size < 0:
            raise ValueError("the responses store size must be at least 0")
        self.size = size
        self.max_chars = max_chars
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, rid: str) -> bool:
        return rid in self._entries

    def get(self, rid: str) -> Stored:
        """The response ``rid`` (``ResponseNotFoundError`` when none is kept)."""
        entry = self._entries.get(rid)
        if entry is None:
            raise ResponseNotFoundError(f"Response with id '{rid[:80]}' not found.")
        return entry

    def history(self, rid: str) -> list[dict[str, Any]]:
        """The conversation ``previous_response_id`` ``rid`` continues: a 404 when that response
        is not kept, a 400 while it still runs."""
        entry = self._entries.get(rid)
        if entry is None:
            raise ResponseNotFoundError(
                f"Previous response with id '{rid[:80]}' not found.",
                param="previous_response_id",
            )
        if entry.history is None:
            raise ValidationError(
                f"previous response '{rid[:80]}' is still in progress",
                param="previous_response_id",
            )
        return entry.history

    def start(
        self,
        rid: str,
        response: dict[str, Any],
        cancel: Callable[[], Any] | None,
        request_chars: int = 0,
    ) -> None:
        """Keep response ``rid`` from its start (its object giving back ``request_chars``
        characters of its request)."""
        if self.size == 0:
            return
        entry = Stored(response, cancel=cancel, chars=request_chars, request_chars=request_chars)
        self._put(rid, entry)

    def finish(
        self, rid: str, response: dict[str, Any], history: list[dict[str, Any]], carried: int
    ) -> None:
        """Response ``rid`` is over: its final object, and the conversation it ends, whose first
        ``carried`` messages are its previous response's (kept there already; a response
        evicted meanwhile stays out)."""
        entry = self._entries.get(rid)
        if entry is None:
            return
        entry.response = response
        entry.history = history
        entry.cancel = None
        added = entry.request_chars + _chars(history[carried:])
        self._chars += added - entry.chars
        entry.chars = added
        self._evict()

    def delete(self, rid: str) -> Stored:
        """Forget response ``rid`` (``ResponseNotFoundError`` when none is kept)."""
        entry = self._entries.pop(rid, None)
        if entry is None:
            raise ResponseNotFoundError(f"Response with id '{rid[:80]}' not found.")
        self._chars -= entry.chars
        return entry

    def _put(self, rid: str, entry: Stored) -> None:
        old = self._entries.pop(rid, None)
        if old is not None:
            self._chars -= old.chars
        self._entries[rid] = entry
        self._chars += entry.chars
        self._evict()

    def _evict(self) -> None:
        while self._entries and (len(self._entries) > self.size or self._chars > self.max_chars):
            _, entry = self._entries.popitem(last=False)
            self._chars -= entry.chars
            if entry.cancel is not None:  # a background response nobody can read any more
                entry.cancel()
