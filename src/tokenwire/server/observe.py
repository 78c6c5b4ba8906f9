"""What one HTTP request did, for its trace span, its request log lines and its echoed
``X-Request-Id``: a ``RequestRecord`` made per request only while one of those is on
(``--otlp-traces-endpoint``, ``--enable-log-requests``, ``--enable-request-id-headers``); with
all three off, the server checks one flag per request and nothing here runs.

Request logging is vLLM's: with ``--enable-log-requests``, one INFO line per generation request
as it is submitted (``Received request ID: ...``: route, model, sizes, the sampling parameters
that differ from their defaults), its prompt at DEBUG; with ``--enable-log-outputs`` also one
INFO line per choice when it ends (``Generated response ID: output: '...', finish_reason:
stop``). ``--max-log-len N`` cuts prompts, outputs and id lists to N characters or ids. Logger
``tokenwire.requests``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenwire.messages.sampling import SamplingParams
from tokenwire.server.security import request_key

if TYPE_CHECKING:
    from tokenwire.engine import RequestTimes
    from tokenwire.runtime import Plan
    from tokenwire.tokenizer import Tokenizer

__all__ = ["ObserveConfig", "RequestRecord", "current_record", "request_id_header"]

log = logging.getLogger("tokenwire.requests")

#: The record of the HTTP request being handled (None while observing is off).
current_record: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "tokenwire_record", default=None
)


@dataclass(frozen=True)
class ObserveConfig:
    """What is observed per request."""

    #: ``--enable-log-requests``: a line per generation request.
    log_requests: bool = False
    #: ``--enable-log-outputs``: a line per choice with its output (needs ``log_requests``).
    log_outputs: bool = False
    #: ``--max-log-len``: prompts and outputs in the log cut to this many characters (or ids).
    max_log_len: int | None = None
    #: ``--enable-request-id-headers``: every response carries ``X-Request-Id``.
    request_id_headers: bool = False
    #: The span exporter (``tokenwire.server.tracing.Tracing``), or None.
    tracing: Any = None

    @property
    def active(self) -> bool:
        """Whether requests get a record at all."""
        return self.log_requests or self.request_id_headers or self.tracing is not None


#: ``SamplingParams`` fields set by normalization, not by the client.
_INTERNAL_PARAMS = frozenset(
    {"stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len", "normalized"}
)
#: The client-settable ``SamplingParams`` fields and their defaults.
_DEFAULT_PARAMS = {
    f.name: f.default
    for f in dataclasses.fields(SamplingParams)
    if f.default is not dataclasses.MISSING and f.name not in _INTERNAL_PARAMS
}


def _params_summary(params: SamplingParams, max_len: int | None) -> str:
    """The sampling parameters that differ from their defaults, ``name=value`` each."""
    parts = []
    for name, default in _DEFAULT_PARAMS.items():
        value = getattr(params, name, default)
        if value != default:
            parts.append(f"{name}={_cut(repr(value), max_len)}")
    return ", ".join(parts)


def _cut(text: str, max_len: int | None) -> str:
    return text if max_len is None or len(text) <= max_len else text[:max_len] + "..."


def request_id_header(scope: dict[str, Any]) -> str | None:
    """The request's ``X-Request-Id`` header, if it sent one."""
    for key, value in scope.get("headers", ()):
        if key.lower() == b"x-request-id":
            return value.decode("latin-1")
    return None


class RequestRecord:
    """One HTTP request's facts as they become known: when it arrived, the plan it asked for
    (id, model, sizes, parameters), each choice's end (tokens, finish reason, the engine's
    times), the response's status and first chunk."""

    __slots__ = (
        "_index_of",
        "_texts",
        "completion_tokens",
        "config",
        "error",
        "finish_reasons",
        "first_chunk",
        "header_id",
        "id",
        "max_tokens",
        "model",
        "n",
        "prompt_tokens",
        "received",
        "received_ns",
        "route",
        "scope",
        "status",
        "submitted_at",
        "temperature",
        "times",
        "tokenizer",
        "top_p",
    )

    def __init__(self, config: ObserveConfig, scope: dict[str, Any], tokenizer: Tokenizer) -> None:
        self.config = config
        self.scope = scope
        self.tokenizer = tokenizer
        #: Arrival: ``perf_counter`` (for durations) and wall-clock nanoseconds (for the span).
        self.received = time.perf_counter()
        self.received_ns = time.time_ns()
        #: The client's ``X-Request-Id``, if it sent one.
        self.header_id = request_id_header(scope)
        #: The request's id: its ``X-Request-Id`` until a plan names it.
        self.id: str | None = self.header_id
        self.route = ""
        self.model = ""
        self.n = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.max_tokens: int | None = None
        self.temperature: float | None = None
        self.top_p: float | None = None
        self.finish_reasons: list[str] = []
        #: The engine's times of each choice that reported them.
        self.times: list[RequestTimes] = []
        #: ``perf_counter`` when the first chunk went out (0.0: none).
        self.first_chunk = 0.0
        #: ``perf_counter`` when the plan went to the engine (0.0: it did not).
        self.submitted_at = 0.0
        self.status: int | None = None
        #: The error a streamed response ended with (its type), if any.
        self.error: str | None = None
        self._texts: dict[int, list[str]] | None = None
        self._index_of: dict[str, int] = {}

    @property
    def submitted_plan(self) -> bool:
        """Whether the request reached the engine (a generation request past its checks)."""
        return bool(self.route)

    @property
    def log_outputs(self) -> bool:
        return self.config.log_outputs

    def response_id(self) -> str:
        """The id the response's ``X-Request-Id`` says: the client's, else the request's own,
        else a fresh one (a request that never became a plan)."""
        if self.header_id is not None:
            return self.header_id
        if self.id is None:
            self.id = uuid.uuid4().hex
        return self.id

    def submitted(self, plan: Plan, subs: list[Any]) -> None:
        """The request's plan reached the engine as ``subs`` (its choices)."""
        # (SGLang's /generate names a request by its rid.)
        self.id = plan.rids[0] if plan.rids is not None and len(plan.rids) == 1 else plan.id
        self.submitted_at = time.perf_counter()
        self.route = plan.route
        self.model = plan.model
        self.n = len(subs)
        self.prompt_tokens = plan.prompt_tokens
        params = plan.params
        self.max_tokens = params.max_new_tokens
        self.temperature = params.temperature
        self.top_p = params.top_p
        if self.config.log_outputs and len(subs) > 1:
            self._index_of = {rid: k for k, (rid, _, _) in enumerate(subs)}
        if self.config.log_requests and log.isEnabledFor(logging.INFO):
            max_len = self.config.max_log_len
            key = request_key(self.scope) if self.scope is not None else None
            log.info(
                "Received request %s: %s, model %r, %d prompt token(s), %d choice(s), params: %s%s",
                self.id,
                plan.route,
                plan.model,
                plan.prompt_tokens,
                len(subs),
                _params_summary(params, max_len) or "defaults",
                f", key {key.name}" if key is not None else "",
            )
            if log.isEnabledFor(logging.DEBUG):
                for k, prompt in enumerate(plan.prompts):
                    ids = prompt if max_len is None else prompt[:max_len]
                    text = self.tokenizer.decode(ids, skip_special_tokens=False)
                    log.debug(
                        "Request %s prompt %d: %r, prompt_token_ids: %s",
                        self.id,
                        k,
                        _cut(text, max_len),
                        ids,
                    )

    def watch(self, streamer: Any) -> None:
        """Keep a streamed response's output text per choice, for its log lines (only with
        ``--enable-log-outputs``): ``streamer.feed`` sees every item first."""
        texts: dict[int, list[str]] = {}
        self._texts = texts
        feed = streamer.feed

        def feed_seen(batch: list[tuple[int, Any]]) -> bytes:
            for index, item in batch:
                text = getattr(item, "text", None)
                if text:
                    texts.setdefault(index, []).append(text)
            return feed(batch)

        streamer.feed = feed_seen

    def finished(self, done: Any, times: RequestTimes | None, text: str | None) -> None:
        """A choice ended with ``done`` (its final item); ``text``: its whole output, when the
        caller has it (else what ``watch`` kept)."""
        self.completion_tokens += done.completion_tokens
        fr = done.finish_reason
        reason = (fr.openai_finish_reason if fr is not None else None) or "unknown"
        self.finish_reasons.append(reason)
        if times is not None:
            self.times.append(times)
        if self.config.log_outputs and log.isEnabledFor(logging.INFO):
            index = self._index_of.get(done.rid, 0)
            if text is None:
                kept = self._texts.get(index) if self._texts is not None else None
                text = "".join(kept) if kept else ""
            choice = f" choice {index}" if self.n > 1 else ""
            log.info(
                "Generated response %s%s: output: %r, finish_reason: %s",
                self.id,
                choice,
                _cut(text, self.config.max_log_len),
                reason,
            )
