"""The engine boundary: what tokenwire asks of an engine, and what it expects back.

An engine takes ``submit(request)`` and ``abort(rid)``, and sends its output as encoded frames
(``tokenwire.messages.frames``) to the ``output`` callback it is started with: one batch frame per
decode step, an error frame when one request fails, a result frame for control requests. The
frame codec is used even in-process, so every engine exercises the same hot path.

Token-level stops are the engine's: EOS (unless ``ignore_eos``), ``stop_token_ids``,
``max_new_tokens`` (finish reasons ``stop`` with the token ``matched``, or ``length``), never before
``min_new_tokens``. Stop token *sequences* (lists inside ``stop_token_ids``, ``matched`` the list)
only reach an engine whose ``supports_stop_token_sequences`` is True; for any other the frontend
matches them and aborts the request. Stop strings and stop regexes are the frontend's: it aborts
the request when one matches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tokenwire.messages.sampling import SamplingParams

if TYPE_CHECKING:
    from tokenwire.messages.frames import Decoded
    from tokenwire.multimodal import MMFeature

__all__ = [
    "REQUEST_FIELDS",
    "EngineRequest",
    "LoraAdapter",
    "Engine",
    "OutputCallback",
    "check_grammar",
    "RequestTimes",
    "supported_request_fields",
    "supports_stop_token_sequences",
    "supports_structured_outputs",
]

#: Receives every frame an engine emits (batch, error or result frames, tag byte first), or a
#: step an engine already decoded from its own wire format (``Decoded``: no re-encoding).
OutputCallback = Callable[["bytes | Decoded"], None]


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter, as vLLM's ``LoRARequest`` names it: a name, an id unique to the server
    (at least 1) and the folder its weights are in."""

    name: str
    id: int
    path: str


@dataclass(frozen=True)
class EngineRequest:
    """One generation: ``prompt_ids`` (validated), normalized ``params`` (``n == 1``), the
    client's scheduling ``priority`` (vLLM's sense: lower is served sooner; 0 by default), and
    what only some engines honour (see ``REQUEST_FIELDS``): the prefix cache's ``cache_salt``,
    a ``lora`` adapter, the ``data_parallel_rank`` to run on, a ``session_id``."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool = True
    priority: int = 0
    cache_salt: str | None = None
    lora: LoraAdapter | None = None
    data_parallel_rank: int | None = None
    session_id: str | None = None
    #: The prompt's media items, processed (vLLM's ``mm_features``; None: text only). Their
    #: placeholder tokens are already expanded in ``prompt_ids``.
    mm_features: tuple[MMFeature, ...] | None = None


#: Request fields only some engines honour (vLLM's names), each declared by an engine in its
#: ``supported_request_fields``; the server refuses the others with a 400 naming the field.
REQUEST_FIELDS = frozenset(
    {
        "allowed_token_ids",
        "bad_words",
        "logprob_token_ids",
        "thinking_token_budget",
        "vllm_xargs",
        "kv_transfer_params",
        "repetition_detection",
        "cache_salt",
        "lora",
        "data_parallel_rank",
        "session_id",
    }
)


@runtime_checkable
class Engine(Protocol):
    """What tokenwire drives. All methods are called from the server's event loop thread."""

    async def start(self, output: OutputCallback) -> None:
        """Begin serving; from now on every frame goes to ``output`` (on the event loop)."""

    async def close(self) -> None:
        """Stop serving and release everything."""

    def submit(self, request: EngineRequest) -> None:
        """Queue a request (``QueueFullError`` if the engine cannot take it, or is gone)."""

    def abort(self, rid: str) -> None:
        """Drop a request; unknown or finished rids are ignored."""

    @property
    def alive(self) -> bool:
        """Whether the engine can serve."""

    # Optional capability (read with ``supported_request_fields``, default none):
    # ``supported_request_fields: frozenset[str]`` -- the ``REQUEST_FIELDS`` the engine honours.
    # Optional capability (read with ``supports_structured_outputs``, default False):
    # ``supports_structured_outputs: bool`` -- the engine constrains decoding to the
    # ``SamplingParams`` fields ``json_schema``, ``regex``, ``ebnf`` and ``structural_tag``.
    # Without it the frontend refuses those requests with a 400 instead of answering them
    # unconstrained. Such an engine may also have ``async def check_grammar(params, client)``,
    # awaited before a request with a grammar is submitted: a ``ValidationError`` naming the
    # ``SamplingParams`` field when the engine's grammar library refuses it (read with
    # ``check_grammar``).
    #
    # Optional, for metrics and traces (absent: engine 0, no times):
    # ``engine_of(rid) -> int`` -- which of several engines (data-parallel rank) took a request
    # still in flight; ``pop_request_times(rid) -> RequestTimes | None`` -- when a request that
    # finished was queued, scheduled, and produced its first and last tokens (asked once, after
    # its final output).


@dataclass(frozen=True)
class RequestTimes:
    """When an engine queued a request, first scheduled it, and produced its first and last
    tokens: seconds on one clock of the engine's (only differences mean anything). vLLM's
    request phases follow from them: queue, prefill, decode and inference time."""

    queued: float
    scheduled: float
    first_token: float
    last_token: float
    #: The engine (data-parallel rank) that ran the request.
    engine: int = 0


def supports_stop_token_sequences(engine: object) -> bool:
    """Whether ``engine`` matches stop token sequences itself (an optional engine attribute,
    ``supports_stop_token_sequences``; False when absent)."""
    return getattr(engine, "supports_stop_token_sequences", False) is True


def supported_request_fields(engine: Any) -> frozenset[str]:
    """The ``REQUEST_FIELDS`` ``engine`` honours (its optional ``supported_request_fields``)."""
    fields = getattr(engine, "supported_request_fields", frozenset())
    return frozenset(fields) & REQUEST_FIELDS


def supports_structured_outputs(engine: Any) -> bool:
    """Whether ``engine`` declares that it constrains decoding (structured outputs)."""
    return getattr(engine, "supports_structured_outputs", False) is True


async def check_grammar(engine: Any, params: SamplingParams, client: str | None = None) -> None:
    """Await ``engine``'s check of a request's grammar, if it has one (see ``Engine``);
    ``client`` (an API key's id, else the peer's address) is whose turn its compile waits for."""
    if (
        params.json_schema is None
        and params.regex is None
        and params.ebnf is None
        and params.structural_tag is None
    ):
        return
    check = getattr(engine, "check_grammar", None)
    if check is not None:
        await check(params, client=client)
