"""A GPU-free engine for demos, tests and frontend benchmarks (vLLM calls its own a mock engine).

Continuous batching on the event loop: every ``step_time`` seconds, up to ``max_batch_size``
running requests each get ``tokens_per_step`` tokens (more than one mimics speculative decoding),
and the step goes out as one batch frame through the real codec. Output sources:

- ``replay``: natural text in a dozen languages (packaged, permissively licensed), tokenized with
  the model's tokenizer; each request replays one passage, chosen by a hash of its prompt and
  seed, and ends it with EOS, so output reads as text and re-tokenizes to realistic counts;
- ``echo``: the prompt's token ids in order, the first ``max_new_tokens`` of them, then ``length``
  (deterministic: a test knows the exact output);
- ``random``: uniformly drawn non-special ids.

Structured outputs: a request with a grammar (``SamplingParams.json_schema``, ``regex``,
``ebnf``, ``structural_tag``) is decoded inside it: its grammar is compiled with llguidance in a
worker thread (``tokenwire.engine.grammar``; cached, and a refused one is a ``ValidationError``
from ``check_grammar``, which the server awaits before it submits), the request is not stepped
until it is, and each token is chosen among those the grammar allows, reading from the same
output source (``tokenwire.engine.constrained``).

It honours ``max_new_tokens``, ``min_new_tokens`` (no EOS or stop token before it),
``stop_token_ids`` (token id sequences too, unless configured not to), ``ignore_eos``, EOS by
probability or position, and aborts; and it can inject faults for tests: an id past the
tokenizer, a malformed frame, an engine error for a request, a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import zlib
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenwire.engine import EngineRequest, OutputCallback, RequestTimes
from tokenwire.engine.constrained import ConstrainedDecoder, TokenTables, prepare_grammar
from tokenwire.engine.grammar import Grammar, GrammarCompiler, constraint_of
from tokenwire.engine.pooling import Pooled, PoolingRequest
from tokenwire.engine.synthetic_pooling import (
    DEFAULT_EMBEDDING_DIM,
    SYNTHETIC_POOLING_TASKS,
    SyntheticPooler,
)
from tokenwire.messages.errors import QueueFullError
from tokenwire.messages.frames import (
    FRAME_LAYOUTS,
    LAYOUT_SEED,
    LAYOUT_SGLANG_0_5_23,
    encode_batch_frame,
    encode_error_frame,
)
from tokenwire.messages.sampling import MAX_STOP_TOKEN_SEQUENCE_LEN

if TYPE_CHECKING:
    from tokenwire.messages.sampling import SamplingParams
    from tokenwire.tokenizer import Tokenizer

__all__ = ["SyntheticConfig", "SyntheticEngine", "OUTPUTS", "FAULTS", "replay_passages"]

log = logging.getLogger(__name__)

OUTPUTS = ("replay", "echo", "random")
_RANDOM_BLOCK = 256
#: Requests whose times the engine keeps (finished ones whose times nobody asked for go first).
_MAX_TIMES = 1 << 16
FAULTS = ("bad_id", "malformed", "error", "crash")


@dataclass
class SyntheticConfig:
    """How the synthetic engine behaves."""

    #: Seconds per decode step (0: as fast as the frontend takes them).
    step_time: float = 0.0
    #: Requests decoded together; the rest wait.
    max_batch_size: int = 256
    #: Tokens per request per step (several mimic speculative decoding).
    tokens_per_step: int = 1
    #: ``replay``, ``echo`` or ``random``.
    output: str = "replay"
    #: Chance of EOS at each token (after ``min_new_tokens``; not with ``ignore_eos``).
    eos_prob: float = 0.0
    #: Emit EOS as this generated token (1-based), if set.
    eos_at: int | None = None
    #: ``replay`` ends each passage with EOS.
    replay_eos: bool = True
    #: Requests that may wait for a batch slot before ``submit`` answers QueueFullError.
    max_waiting: int = 100_000
    #: Base seed (a request's ``sampling_seed`` overrides it).
    seed: int = 0
    #: Match stop token sequences (lists in ``stop_token_ids``) here; if False, the frontend
    #: does (as for an engine that cannot).
    stop_token_sequences: bool = True
    #: The layout of its batch frames (``tokenwire.messages.frames.FRAME_LAYOUTS``); SGLang
    #: 0.5.23's carries ``cached_tokens`` and ``reasoning_tokens``.
    frame_layout: str = LAYOUT_SEED
    #: Prompt tokens reported as served from a prefix cache (at most each prompt's length).
    cached_tokens: int = 0
    #: The size of its embeddings (pooling requests: ``tokenwire.engine.synthetic_pooling``).
    embedding_dim: int = DEFAULT_EMBEDDING_DIM

    def __post_init__(self) -> None:
        if self.output not in OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, got {self.output!r}")
        if self.step_time < 0 or self.max_batch_size < 1 or self.tokens_per_step < 1:
            raise ValueError("step_time >= 0, max_batch_size >= 1 and tokens_per_step >= 1")
        if not 0.0 <= self.eos_prob <= 1.0:
            raise ValueError(f"eos_prob must be in [0, 1], got {self.eos_prob}")
        if self.frame_layout not in FRAME_LAYOUTS:
            raise ValueError(
                f"frame_layout must be one of {', '.join(FRAME_LAYOUTS)}, got {self.frame_layout!r}"
            )
        if self.cached_tokens < 0:
            raise ValueError(f"cached_tokens must be at least 0, got {self.cached_tokens}")
        if self.embedding_dim < 1:
            raise ValueError(f"embedding_dim must be at least 1, got {self.embedding_dim}")


_MASK64 = (1 << 64) - 1


def _splitmix64(seed: int, counter: int) -> int:
    """A well-mixed 64-bit number from ``(seed, counter)`` (SplitMix64's finalizer)."""
    z = (seed + counter * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _splitmix64_array(seed: np.uint64, counters: np.ndarray) -> np.ndarray:
    """``_splitmix64`` over an array of counters (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        z = seed + counters * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class _Seq:
    __slots__ = (
        "cursor",
        "gen",
        "limit",
        "max_new",
        "min_new",
        "params",
        "prompt_len",
        "rid",
        "draws",
        "seed",
        "source",
        "stops",
        "seqs",
        "recent",
        "reasoning",
        "thinking",
        "prompt_ids",
        "prompt_lp_sent",
        "decoder",
        "refill",
    )

    def __init__(self, req: EngineRequest, seed: int, eos: frozenset[int]) -> None:
        p = req.params
        self.rid = req.rid
        self.prompt_len = len(req.prompt_ids)
        self.params = p
        self.max_new = p.max_new_tokens
        self.limit = p.max_new_tokens if p.max_new_tokens is not None else float("inf")
        self.min_new = p.min_new_tokens
        # Tokens that end the request: EOS (unless ignored) and the stop token ids.
        singles = [t for t in p.stop_token_ids or () if not isinstance(t, list)]
        self.stops = (frozenset() if p.ignore_eos else eos) | frozenset(singles)
        # Stop token sequences (when the engine is configured to match them) and recent ids.
        self.seqs = p.stop_token_sequences
        self.recent: list[int] = []
        # Output tokens from a <think> through its </think>, and whether one is open.
        self.reasoning = 0
        self.thinking = False
        self.prompt_ids = req.prompt_ids
        self.prompt_lp_sent = req.params.prompt_logprobs is None
        self.seed = seed
        self.draws = 0  # random numbers drawn so far (the counter of the seed's stream)
        self.source: list[int] = []
        self.cursor = 0
        self.gen = 0
        #: Constrained decoding (a request with a grammar), and how its source goes on.
        self.decoder: ConstrainedDecoder | None = None
        self.refill: Any = None

    def uniform(self) -> float:
        """The next number in [0, 1) of this request's seeded stream."""
        self.draws += 1
        return _splitmix64(self.seed, self.draws) / 2.0**64

    # The source as ``constrained.TextSource`` (for a constrained request): it never runs out.
    def peek(self) -> int | None:
        if self.cursor >= len(self.source):
            self.refill(self)
            if not self.source:
                return None
        return self.source[self.cursor]

    def skip(self) -> None:
        self.cursor += 1


def _logprob_columns(rows: list[tuple[list, list]], ids: list[int]) -> tuple[list[list[int]], list]:
    """The batch frame's logprob header columns (``out_lp_lens``, ``in_lp_lens``, the top-k
    reqlens/poslens pairs, the token-ids families empty) and its data columns."""
    out_lens, in_lens, out_pos, in_pos = [], [], [], []
    cols: dict[str, list] = {
        k: [] for k in ("olv", "oli", "ilv", "ili", "otv", "oti", "itv", "iti")
    }
    for out, prompt in rows:
        out_lens.append(len(out))
        in_lens.append(len(prompt))
        for lp_key, id_key, tv, ti, pos, part in (
            ("olv", "oli", "otv", "oti", out_pos, out),
            ("ilv", "ili", "itv", "iti", in_pos, prompt),
        ):
            for chosen, chosen_lp, top_ids, top_lps in part:
                cols[lp_key].append(chosen_lp)
                cols[id_key].append(chosen)
                pos.append(len(top_ids))
                cols[ti].extend(top_ids)
                cols[tv].extend(top_lps)
    header = [out_lens, in_lens, out_lens, out_pos, in_lens, in_pos, [], [], [], [], [], []]
    f32 = np.float32
    return header, [
        ids,
        np.asarray(cols["olv"], dtype=f32),
        np.asarray(cols["oli"], dtype=np.int32),
        np.asarray(cols["ilv"], dtype=f32),
        np.asarray(cols["ili"], dtype=np.int32),
        np.asarray(cols["otv"], dtype=f32),
        np.asarray(cols["oti"], dtype=np.int32),
        np.asarray(cols["itv"], dtype=f32),
        np.asarray(cols["iti"], dtype=np.int32),
        *([np.zeros(0, dtype=np.int32)] * 5),
    ]


def replay_passages() -> list[str]:
    """The packaged natural texts ``replay`` output reads from (``_data/replay/*.txt``, one file
    per language, passages separated by blank lines; licence in ``_data/replay/NOTICE``)."""
    folder = resources.files("tokenwire") / "_data" / "replay"
    out: list[str] = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".txt"):
            text = entry.read_text(encoding="utf-8")
            out.extend(p.strip("\n") for p in text.split("\n\n") if p.strip())
    return out


class SyntheticEngine:
    """The engine; see the module docstring."""

    #: It constrains decoding to a JSON schema, regex, grammar or structural tag (llguidance).
    supports_structured_outputs = True
    #: It generates, and pools (embeddings: ``submit_pooling``).
    supported_tasks = ("generate", *SYNTHETIC_POOLING_TASKS)

    def __init__(self, tokenizer: Tokenizer, config: SyntheticConfig | None = None) -> None:
        self.tokenizer = tokenizer
        self.config = config or SyntheticConfig()
        self._output: OutputCallback | None = None
        self._waiting: deque[EngineRequest] = deque()
        self._running: dict[str, _Seq] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._alive = False
        self._faults: list[tuple[str, str | None]] = []
        self._eos = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
        self._eos_set = frozenset(tokenizer.eos_token_ids)
        specials = tokenizer.special_ids
        self._plain_arr = np.array(
            [i for i in range(tokenizer.vocab_size) if i not in specials], dtype=np.int64
        )
        self._filler = next(iter(tokenizer.encode(".", add_special_tokens=False)), 0)
        self._passages: list[list[int]] | None = None
        self._think = (tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>"))
        #: Counters for tests and metrics.
        self.stats = {"submitted": 0, "aborted": 0, "finished": 0, "steps": 0}
        #: Grammars (made on the first request with one) and the vocabulary tables they use.
        self._grammars: GrammarCompiler | None = None
        self._tables: TokenTables | None = None
        self._mask = np.zeros(0, dtype=np.int32)
        #: Requests admitted while their grammar compiles, and errors to send with the next step.
        self._compiling: dict[str, tuple[EngineRequest, Future[Grammar]]] = {}
        self._failed: list[bytes] = []

        #: Per request: when it was queued, admitted to the batch and finished (0: not yet).
        self._times: dict[str, list[float]] = {}
        #: Pooling requests waiting for the next step, and what pools them.
        self._pooling: dict[str, PoolingRequest] = {}
        self.pooler = SyntheticPooler(self.config.embedding_dim, self.config.seed, specials)

    # ---- grammars --------------------------------------------------------------------------------

    @property
    def grammars(self) -> GrammarCompiler:
        """The engine's grammar compiler (its worker thread and cache)."""
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer, prepare=self._prepare_grammar)
        return self._grammars

    def _prepare_grammar(self, grammar: Grammar) -> None:
        """In the compiler's worker: the vocabulary tables (once), the grammar's shortest finish."""
        if self._tables is None:
            self._tables = TokenTables.build(self.tokenizer)
        prepare_grammar(grammar, self._tables)

    async def check_grammar(self, params: SamplingParams) -> None:
        """Compile a request's grammar (in the worker; cached) before it is submitted:
        ``ValidationError`` naming the ``SamplingParams`` field when llguidance refuses it."""
        if constraint_of(params) is not None:
            await self.grammars.check(params)

    # ---- Engine protocol -------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def supports_stop_token_sequences(self) -> bool:
        """Whether requests may carry stop token sequences (see ``SyntheticConfig``)."""
        return self.config.stop_token_sequences

    async def start(self, output: OutputCallback) -> None:
        self._output = output
        self._alive = True
        if self.config.output == "replay":
            self._load_passages()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="synthetic-engine")

    async def close(self) -> None:
        self._alive = False
        self._wake.set()
        if self._grammars is not None:
            self._grammars.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def submit(self, request: EngineRequest) -> None:
        if not self._alive:
            raise QueueFullError("the engine is not running")
        if len(self._waiting) >= self.config.max_waiting:
            raise QueueFullError(f"the engine queue is full ({self.config.max_waiting} waiting)")
        self.stats["submitted"] += 1
        if constraint_of(request.params) is not None:
            self.grammars.compile_params(request.params)  # compiling while it waits
        self._waiting.append(request)
        times = self._times
        if len(times) >= _MAX_TIMES:  # finished requests whose times nobody asked for
            del times[next(iter(times))]
        times[request.rid] = [time.monotonic(), 0.0, 0.0]
        self._wake.set()

    @property
    def pooling_model(self) -> Any:
        """What its pooling outputs are (``tokenwire.pooling.PoolingModel``)."""
        return self.pooler.model

    def submit_pooling(self, request: PoolingRequest) -> None:
        """Queue an input to pool: it is answered with the next step, with every other input
        queued by then."""
        if not self._alive:
            raise QueueFullError("the engine is not running")
        if len(self._pooling) >= self.config.max_waiting:
            raise QueueFullError(f"the engine queue is full ({self.config.max_waiting} waiting)")
        self.stats["submitted"] += 1
        self._pooling[request.rid] = request
        self._wake.set()

    def _pool_step(self) -> Pooled:
        """Every pooling request waiting, answered at once."""
        reqs = list(self._pooling.values())
        self._pooling.clear()
        self.stats["finished"] += len(reqs)
        return Pooled([r.rid for r in reqs], self.pooler.pool(reqs))

    def abort(self, rid: str) -> None:
        self._times.pop(rid, None)
        if self._pooling.pop(rid, None) is not None:
            self.stats["aborted"] += 1
            return
        if self._running.pop(rid, None) is not None or self._compiling.pop(rid, None):
            self.stats["aborted"] += 1
            return
        for req in self._waiting:
            if req.rid == rid:
                self._waiting.remove(req)
                self.stats["aborted"] += 1
                return

    # ---- test hooks ------------------------------------------------------------------------------

    def inject(self, fault: str, rid: str | None = None) -> None:
        """Make the next step misbehave: ``bad_id`` (an id past the model's vocabulary for ``rid``,
        or for everyone), ``malformed`` (a corrupt frame), ``error`` (an engine error for ``rid``),
        ``crash`` (the engine dies)."""
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(FAULTS)}")
        self._faults.append((fault, rid))
        self._wake.set()

    @property
    def running(self) -> int:
        """Requests in the batch now."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests waiting for a batch slot."""
        return len(self._waiting)

    @property
    def kv_cache_usage(self) -> float:
        """The batch's share of its slots (the synthetic engine's KV cache: one slot a
        request)."""
        return len(self._running) / max(1, self.config.max_batch_size)

    def pop_request_times(self, rid: str) -> RequestTimes | None:
        """When a finished request was queued, admitted (its first token comes in the step that
        admits it: no prefill) and finished."""
        t = self._times.pop(rid, None)
        if t is None or not t[2]:
            return None
        return RequestTimes(queued=t[0], scheduled=t[1], first_token=t[1], last_token=t[2])

    # ---- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while self._alive:
                idle = not (
                    self._running or self._waiting or self._faults or self._failed or self._pooling
                )
                if idle:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                assert self._output is not None
                if self._pooling:
                    self._output(self._pool_step())
                if not (self._running or self._waiting or self._faults or self._failed):
                    await asyncio.sleep(self.config.step_time)
                    continue
                self._admit()
                frames = self._step()
                for frame in frames:
                    self._output(frame)
                await asyncio.sleep(self.config.step_time)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("synthetic engine crashed")
            self._alive = False
            # Nothing in flight may hang: every request learns the engine is gone.
            rids = [*self._running, *(r.rid for r in self._waiting), *self._pooling]
            self._running.clear()
            self._waiting.clear()
            self._pooling.clear()
            if self._output is not None:
                for rid in rids:
                    self._output(encode_error_frame(rid, f"the engine crashed: {exc}"))
            raise

    def _admit(self) -> None:
        """Fill free batch slots from the queue: lowest ``priority`` first, then arrival order."""
        room = self.config.max_batch_size - len(self._running)
        if 0 < room < len(self._waiting) and any(r.priority for r in self._waiting):
            self._waiting = deque(sorted(self._waiting, key=lambda r: r.priority))
        now = time.monotonic()
        times = self._times
        while room > 0 and self._waiting:
            req = self._waiting.popleft()
            t = times.get(req.rid)
            if t is not None:
                t[1] = now
            seq = _Seq(req, self._seed_for(req), self._eos_set)
            seq.source = self._source_for(seq, req)
            if constraint_of(req.params) is not None and not self._constrain(seq, req):
                continue
            self._running[req.rid] = seq
            room -= 1

    def _constrain(self, seq: _Seq, req: EngineRequest) -> bool:
        """Give a request with a grammar its decoder; False when it cannot run yet (its grammar
        still compiling: it waits aside, not stepped) or at all (refused: an error frame)."""
        fut = self.grammars.compile_params(req.params)
        assert fut is not None
        if not fut.done():
            self._compiling[req.rid] = (req, fut)
            loop = asyncio.get_running_loop()

            def ready(_fut: Future[Grammar]) -> None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(self._compiled, req.rid)

            fut.add_done_callback(ready)
            return False
        try:
            grammar = fut.result()
        except Exception as exc:
            self._failed.append(encode_error_frame(req.rid, str(exc)))
            self.stats["finished"] += 1
            return False
        tables: TokenTables = grammar.facts["tables"]
        if len(self._mask) != tables.vocab_words:
            self._mask = np.zeros(tables.vocab_words, dtype=np.int32)
        seq.decoder = ConstrainedDecoder(grammar, tables, self._mask)
        seq.refill = self._refill
        return True

    def _compiled(self, rid: str) -> None:
        """A waiting request's grammar is ready: it is admitted first."""
        got = self._compiling.pop(rid, None)
        if got is not None:
            self._waiting.appendleft(got[0])
            self._wake.set()

    def _refill(self, seq: _Seq) -> None:
        """The next stretch of a constrained request's source (replay: the next passage, echo:
        the prompt again, random: a new block)."""
        out = self.config.output
        if out == "replay":
            assert self._passages is not None
            seq.source = self._passages[int(seq.uniform() * len(self._passages))]
        elif out == "random":
            seq.source = self._random_block(seq)
        seq.cursor = 0

    def _seed_for(self, req: EngineRequest) -> int:
        seed = req.params.sampling_seed
        if seed is None:
            seed = zlib.crc32(req.rid.encode()) ^ (self.config.seed << 32)
        return seed & _MASK64

    def _source_for(self, seq: _Seq, req: EngineRequest) -> list[int]:
        out = self.config.output
        if out == "echo":
            return req.prompt_ids
        if out == "replay":
            assert self._passages is not None
            return self._passages[self._passage_index(req, seq)]
        return []

    def _passage_index(self, req: EngineRequest, seq: _Seq) -> int:
        """The first passage a request replays: a hash of its prompt and seed, so different
        prompts read differently and the same prompt and seed read the same. Without a seed, a
        greedy request (temperature 0) hashes with the engine's seed (deterministic, as greedy
        decoding is), a sampled one with its own request seed (each sample differs)."""
        p = req.params
        if p.sampling_seed is not None:
            key = p.sampling_seed
        elif p.top_k == 1:
            key = self.config.seed
        else:
            key = seq.seed
        h = hashlib.blake2b(np.asarray(req.prompt_ids, dtype=np.int64).tobytes(), digest_size=8)
        h.update((key & _MASK64).to_bytes(8, "little"))
        assert self._passages is not None
        return int.from_bytes(h.digest(), "little") % len(self._passages)

    def _load_passages(self) -> None:
        self._passages = [
            self.tokenizer.encode(p, add_special_tokens=False) for p in replay_passages()
        ]

    def _next_token(self, seq: _Seq) -> tuple[int | None, bool]:
        """The next token and whether the source says the output ends after it."""
        out = self.config.output
        src = seq.source
        if seq.cursor >= len(src):
            if out == "echo":
                return None, True
            if out == "random":
                seq.source = src = self._random_block(seq)
            else:  # replay: the passage is over; the next one follows should output go on
                assert self._passages is not None
                seq.source = src = self._passages[int(seq.uniform() * len(self._passages))]
                seq.cursor = 0
                if self.config.replay_eos and self._eos is not None:
                    return self._eos, False  # (ignore_eos, min_new_tokens: text again next)
            seq.cursor = 0
        tok = src[seq.cursor]
        seq.cursor += 1
        return tok, out == "echo" and seq.cursor >= len(src)

    def _random_block(self, seq: _Seq) -> list[int]:
        """The request's next random non-special ids (from its seed): a block of up to
        ``_RANDOM_BLOCK``, no more than it may still generate."""
        size = int(min(_RANDOM_BLOCK, max(1, seq.limit - seq.gen)))
        counters = np.arange(seq.draws + 1, seq.draws + 1 + size, dtype=np.uint64)
        seq.draws += size
        picks = _splitmix64_array(np.uint64(seq.seed), counters) % np.uint64(len(self._plain_arr))
        return self._plain_arr[picks].tolist()

    @staticmethod
    def _sequence_end(seq: _Seq, tok: int, may_stop: bool) -> list[int] | None:
        """Record ``tok``; the first stop token sequence the recent ids now end with, if the
        request may stop."""
        recent = seq.recent
        recent.append(tok)
        if len(recent) > MAX_STOP_TOKEN_SEQUENCE_LEN:
            del recent[0]
        if not may_stop:
            return None
        for stop in seq.seqs:
            if recent[-len(stop) :] == stop:
                return stop
        return None

    def _logprob_rows(self, seq: _Seq, new_ids: list[int]) -> tuple[list, list]:
        """This step's logprob rows of a request: one per new token (when it asked for
        logprobs), and one per prompt token after the first on its first step (when it asked
        for prompt logprobs)."""
        p = seq.params
        out = []
        if p.logprobs is not None:
            greedy = p.top_k == 1
            start = seq.gen - len(new_ids)
            out = [
                (t, *self.logprob_row(seq.seed, seq.prompt_len + start + k, t, greedy, p.logprobs))
                for k, t in enumerate(new_ids)
            ]
        prompt = []
        if not seq.prompt_lp_sent:
            seq.prompt_lp_sent = True
            k = p.prompt_logprobs or 0
            prompt = [
                (t, *self.logprob_row(seq.seed, pos, t, False, k))
                for pos, t in enumerate(seq.prompt_ids[1:], 1)
            ]
        return out, prompt

    def logprob_row(
        self, seed: int, position: int, chosen: int, greedy: bool, k: int
    ) -> tuple[float, list[int], list[float]]:
        """The distribution the engine "sampled" ``chosen`` from at ``position`` (seeded): the
        chosen token's logprob and the ``k`` most likely tokens with theirs, most likely first.
        The chosen token ranks first when decoding is greedy, else among the first three; the
        probabilities halve (with a seeded jitter) from rank to rank."""
        width = max(k, 3) + 1
        counters = np.arange(position * 64, position * 64 + 2 * width + 1, dtype=np.uint64)
        draws = _splitmix64_array(np.uint64(seed ^ 0x5EED10C9), counters)
        rank = 0 if greedy else int(draws[-1] % np.uint64(3))
        others = self._plain_arr[draws[:width] % np.uint64(len(self._plain_arr))].tolist()
        ranked: list[int] = []
        for t in others:
            if t != chosen and t not in ranked:
                ranked.append(t)
        ranked.insert(min(rank, len(ranked)), chosen)
        jitter = (draws[width : 2 * width] >> np.uint64(11)).astype(np.float64) / 2.0**53
        logps = (np.log(0.5) * (np.arange(width) + 1 + 0.5 * jitter[:width])).tolist()
        logps = logps[: len(ranked)]
        chosen_lp = logps[ranked.index(chosen)]
        return chosen_lp, ranked[:k], logps[:k]

    def _step(self) -> list[bytes]:
        self.stats["steps"] += 1
        faults, self._faults = self._faults, []
        frames: list[bytes] = []
        bad_ids: set[str | None] = set()
        malformed = False
        for fault, rid in faults:
            if fault == "crash":
                raise RuntimeError("injected engine crash")
            if fault == "bad_id":
                bad_ids.add(rid)
            elif fault == "malformed":
                malformed = True
            elif fault == "error" and rid is not None and self._running.pop(rid, None):
                self._times.pop(rid, None)
                frames.append(encode_error_frame(rid, "injected engine error"))
        frames.extend(self._failed)
        self._failed.clear()
        cfg = self.config
        rids: list[str] = []
        finishes: list[dict | None] = []
        prompt_tokens: list[int] = []
        tok_lens: list[int] = []
        reasoning: list[int] = []
        ids: list[int] = []
        done: list[str] = []
        echo = cfg.output == "echo"
        random_eos = self._eos is not None and (cfg.eos_prob > 0 or cfg.eos_at is not None)
        lp_rows: list[tuple[list, list]] | None = None  # per request: (output rows, prompt rows)
        for seq in self._running.values():
            n = 0
            finish = None
            first = len(ids)
            for _ in range(cfg.tokens_per_step):
                gen = seq.gen
                if gen >= seq.limit:
                    finish = {"type": "length", "length": seq.max_new}
                    break
                src = seq.source
                cursor = seq.cursor
                if seq.decoder is not None:
                    # Constrained: the grammar's choice; it says when EOS may come.
                    tok = seq.decoder.next_token(seq, seq.limit - gen)
                    source_ends = False
                    may_stop = True
                else:
                    if cursor < len(src):  # the common case, inline
                        tok = src[cursor]
                        seq.cursor = cursor + 1
                        source_ends = echo and cursor + 1 >= len(src)
                    else:
                        tok, source_ends = self._next_token(seq)  # type: ignore[assignment]
                        if tok is None:  # echo of an empty prompt
                            finish = {"type": "length", "length": gen}
                            break
                    may_stop = gen >= seq.min_new
                    if (
                        random_eos
                        and may_stop
                        and not seq.params.ignore_eos
                        and (
                            cfg.eos_at == gen + 1 or (cfg.eos_prob and seq.uniform() < cfg.eos_prob)
                        )
                    ):
                        tok = self._eos
                is_stop = tok in seq.stops
                if is_stop and not may_stop:
                    tok, is_stop = self._filler, False  # a model would not sample it yet
                if bad_ids and (None in bad_ids or seq.rid in bad_ids):
                    tok = self.tokenizer.model_vocab_size  # the first id past the model's
                ids.append(tok)
                n += 1
                seq.gen = gen + 1
                if tok == self._think[0] or seq.thinking:
                    seq.reasoning += 1
                    seq.thinking = tok != self._think[1]
                matched = self._sequence_end(seq, tok, may_stop) if seq.seqs else None
                if matched is not None:  # a sequence ending here wins over its last id
                    finish = {"type": "stop", "matched": matched}
                    break
                if is_stop:
                    finish = {"type": "stop", "matched": tok}
                    break
                if gen + 1 >= seq.limit:
                    finish = {"type": "length", "length": seq.max_new}
                    break
                if source_ends:
                    finish = {"type": "length", "length": gen + 1}
                    break
            rids.append(seq.rid)
            finishes.append(finish)
            prompt_tokens.append(seq.prompt_len)
            tok_lens.append(n)
            if seq.params.logprobs is not None or not seq.prompt_lp_sent:
                if lp_rows is None:
                    lp_rows = [([], [])] * (len(rids) - 1)
                lp_rows.append(self._logprob_rows(seq, ids[first:]))
            elif lp_rows is not None:
                lp_rows.append(([], []))
            reasoning.append(seq.reasoning)
            if finish is not None:
                done.append(seq.rid)
        if done:
            now = time.monotonic()
            times = self._times
            for rid in done:
                del self._running[rid]
                t = times.get(rid)
                if t is not None:
                    t[2] = now
        self.stats["finished"] += len(done)
        if rids:
            header = [rids, finishes, prompt_tokens, tok_lens]
            if cfg.frame_layout == LAYOUT_SGLANG_0_5_23:
                n_rows = len(rids)
                header += [
                    [min(cfg.cached_tokens, p) for p in prompt_tokens],
                    reasoning,
                    *([[]] * 12),
                    ["synthetic"] * n_rows,  # weight versions
                    [0] * n_rows,  # image, audio and video tokens
                    [0] * n_rows,
                    [0] * n_rows,
                    [cfg.step_time] * n_rows,  # decode latencies
                ]
            data: list = [ids]
            if lp_rows is not None:
                at = 6 if cfg.frame_layout == LAYOUT_SGLANG_0_5_23 else 4
                optional, data = _logprob_columns(lp_rows, ids)
                header = header[:at] + optional + header[at + len(optional) :]
            frame = encode_batch_frame(header, data, layout=cfg.frame_layout)
            if malformed:
                frame = frame[:-4] if ids else frame + b"\x00"
            frames.append(frame)
        return frames
