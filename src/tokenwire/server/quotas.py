"""Per-key quotas: requests per minute, tokens per minute, requests at once (no I/O).

Each rate is a bucket that refills continuously (a full minute's worth at most): a generation
request takes one request and its prompt's tokens when it is admitted, and its output tokens as
each choice finishes (so a bucket may go below zero, and the key then waits until it refills). A
key past a quota gets OpenAI's 429 (``{"error": {"message": "Rate limit reached ...", "type":
"requests" | "tokens" | "concurrent_requests", "code": "rate_limit_exceeded"}}``) with
``retry-after``; every answer to a limited key carries OpenAI's ``x-ratelimit-limit-requests``,
``x-ratelimit-remaining-requests``, ``x-ratelimit-reset-requests`` (and ``-tokens``) headers, the
reset as a duration (``1s``, ``6m0s``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenwire.messages.errors import RateLimitError
from tokenwire.server.keys import KeyLimits, KeyRing
from tokenwire.server.security import ApiKey

__all__ = ["Quotas", "Ticket", "duration"]


def duration(seconds: float) -> str:
    """A duration as OpenAI's rate-limit headers write it: ``20ms``, ``1.5s``, ``6m0s``,
    ``1h2m3s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    if seconds < 60:
        text = f"{seconds:.3f}".rstrip("0").rstrip(".")
        return f"{text}s"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + f"{minutes}m{secs}s"


class _Bucket:
    """``per_minute`` units, refilled continuously."""

    __slots__ = ("at", "capacity", "level", "rate")

    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.level = self.capacity
        self.at = now

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` can be taken."""
        return max(0.0, (amount - self.level) / self.rate)

    def reset(self) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.capacity - self.level) / self.rate)

    def resize(self, per_minute: int) -> None:
        self.level = min(self.level, float(per_minute))
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0


@dataclass
class _KeyState:
    requests: _Bucket | None = None
    tokens: _Bucket | None = None
    in_flight: int = 0
    limits: KeyLimits = field(default_factory=KeyLimits)


class Ticket:
    """One admitted request of a limited key: its output tokens are charged as its choices
    finish (``charge``), and its place at once is given back once (``close``)."""

    __slots__ = ("_closed", "_quotas", "_state", "key")

    def __init__(self, quotas: Quotas, key: ApiKey, state: _KeyState) -> None:
        self._quotas = quotas
        self.key = key
        self._state = state
        self._closed = False

    def charge(self, done: Any) -> None:
        """A choice finished (its ``Done``): its output tokens come off the key's bucket."""
        tokens = self._state.tokens
        if tokens is not None:
            tokens.refill(self._quotas.clock())
            tokens.level -= getattr(done, "completion_tokens", 0)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._state.in_flight -= 1

    def headers(self) -> list[tuple[bytes, bytes]]:
        return self._quotas.headers(self.key)


class Quotas:
    """Every key's buckets; the limits come from the ``KeyRing`` (so a reload applies to the
    next request, with the buckets kept)."""

    def __init__(self, keys: KeyRing, clock: Callable[[], float] = time.monotonic) -> None:
        self.keys = keys
        self.clock = clock
        self._state: dict[str, _KeyState] = {}
        #: Requests refused, by key name and quota (for /metrics).
        self.refused: dict[tuple[str, str], int] = {}

    def _of(self, key: ApiKey) -> _KeyState:
        limits = self.keys.limits(key)
        st = self._state.get(key.id)
        if st is None:
            st = self._state[key.id] = _KeyState()
        if st.limits != limits:
            now = self.clock()
            st.limits = limits
            st.requests = _sized(st.requests, limits.requests_per_minute, now)
            st.tokens = _sized(st.tokens, limits.tokens_per_minute, now)
        return st

    def limits(self, key: ApiKey | None) -> KeyLimits:
        return self.keys.limits(key)

    def admit(self, key: ApiKey, prompt_tokens: int) -> Ticket:
        """Take one request and ``prompt_tokens`` tokens of ``key``'s quotas, and a place at
        once (``RateLimitError`` when one is used up; nothing is taken then)."""
        st = self._of(key)
        limits = st.limits
        now = self.clock()
        for bucket in (st.requests, st.tokens):
            if bucket is not None:
                bucket.refill(now)
        most = limits.max_concurrent_requests
        if most is not None and st.in_flight >= most:
            self._refuse(
                key,
                "concurrent_requests",
                f"Rate limit reached for key {key.name!r} on requests at once: Limit {most}, "
                f"Running {st.in_flight}. Please try again when one of them has finished.",
                1.0,
            )
        if st.requests is not None and st.requests.level < 1:
            wait = st.requests.wait_for(1)
            self._refuse(
                key,
                "requests",
                f"Rate limit reached for key {key.name!r} on requests per min (RPM): Limit "
                f"{limits.requests_per_minute}, Used {limits.requests_per_minute}, Requested 1. "
                f"Please try again in {duration(wait)}.",
                wait,
            )
        if st.tokens is not None:
            if prompt_tokens > st.tokens.capacity:
                self._refuse(
                    key,
                    "tokens",
                    f"Request too large for key {key.name!r} on tokens per min (TPM): Limit "
                    f"{limits.tokens_per_minute}, Requested {prompt_tokens}.",
                    60.0,
                )
            if st.tokens.level < prompt_tokens:
                wait = st.tokens.wait_for(prompt_tokens)
                used = max(0, round(st.tokens.capacity - st.tokens.level))
                self._refuse(
                    key,
                    "tokens",
                    f"Rate limit reached for key {key.name!r} on tokens per min (TPM): Limit "
                    f"{limits.tokens_per_minute}, Used {used}, Requested {prompt_tokens}. "
                    f"Please try again in {duration(wait)}.",
                    wait,
                )
        if st.requests is not None:
            st.requests.level -= 1
        if st.tokens is not None:
            st.tokens.level -= prompt_tokens
        st.in_flight += 1
        return Ticket(self, key, st)

    def headers(self, key: ApiKey) -> list[tuple[bytes, bytes]]:
        """OpenAI's ``x-ratelimit-*`` headers for ``key`` now (none for a key without rates)."""
        st = self._of(key)
        now = self.clock()
        out: list[tuple[bytes, bytes]] = []
        for name, bucket in (("requests", st.requests), ("tokens", st.tokens)):
            if bucket is None:
                continue
            bucket.refill(now)
            out += [
                (f"x-ratelimit-limit-{name}".encode(), b"%d" % bucket.capacity),
                (f"x-ratelimit-remaining-{name}".encode(), b"%d" % max(0, int(bucket.level))),
                (f"x-ratelimit-reset-{name}".encode(), duration(bucket.reset()).encode()),
            ]
        return out

    def _refuse(self, key: ApiKey, kind: str, message: str, wait: float) -> None:
        self.refused[(key.name, kind)] = self.refused.get((key.name, kind), 0) + 1
        retry = max(wait, 0.001)
        headers = (
            *self.headers(key),
            (b"retry-after", str(max(1, math.ceil(retry))).encode()),
            (b"retry-after-ms", str(max(1, math.ceil(retry * 1000))).encode()),
        )
        raise RateLimitError(message, kind=kind, headers=headers)


def _sized(bucket: _Bucket | None, per_minute: int | None, now: float) -> _Bucket | None:
    if per_minute is None:
        return None
    if bucket is None:
        return _Bucket(per_minute, now)
    bucket.refill(now)
    bucket.resize(per_minute)
    return bucket
