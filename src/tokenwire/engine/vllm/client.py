"""``VllmEngine``: tokenwire's ``Engine`` over unmodified vLLM V1 EngineCore processes (ZMQ).

The frontend binds the handshake ROUTER (unless vLLM's supervisor did the handshake and hands
over its listeners: the ``tokenwire-vllm-frontend`` mode), the input ROUTER and the output PULL:
on the handshake's host over TCP, or (``transport="ipc"``, for engines on this host) as Unix
sockets in a private directory, as vLLM binds them when every engine is local. Each engine dials
in with its rank as identity. Requests go to the engine ``routing`` picks
(``VllmRouting``: the one holding the longest cached prefix of the prompt, within a load bound;
without it, the one with the fewest requests in flight, vLLM's rule for data parallelism);
aborts go to the engine that owns the request. Each
engine step arrives as one ``EngineCoreOutputs`` message and goes to the shard as one decoded step,
with no per-token Python work.

An engine that says ``ENGINE_CORE_DEAD``, whose connection drops, or whose process exits is out of
rotation at once: each of its requests gets an error, and with no engine left the server reports
itself unhealthy (``alive`` is False) and refuses new requests with 503. So is an engine that hangs:
with requests in flight and nothing from it for ``stall_timeout`` seconds, it is asked a utility
ping; unanswered, its requests end with an error (and are aborted), and it leaves rotation until
it says something again. The handshake stays open for the server's life: an engine that comes
back (a restarted rank) is taken in again. With ``retry_on_failure``, a request whose engine dies
before its first output is sent once to another engine in rotation, unseen by its client.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import logging
import math
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from tokenwire.engine import REQUEST_FIELDS, EngineRequest, OutputCallback, RequestTimes
from tokenwire.engine.pooling import DEFAULT_TASKS, PoolingRequest
from tokenwire.engine.vllm import pooling as pool_wire
from tokenwire.engine.vllm import protocol as wire
from tokenwire.engine.vllm.launch import port_of, startup_timeout_message
from tokenwire.engine.vllm.routing import VllmRouting
from tokenwire.engine.vllm.stats import RankStats
from tokenwire.messages.errors import CodecError, QueueFullError, ValidationError
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.messages.frames import Decoded, encode_error_frame

if TYPE_CHECKING:
    from tokenwire.engine.routing import RoutingConfig
    from tokenwire.engine.vllm.kv_events import KvEventsConfig
    from tokenwire.engine.vllm.launch import VllmLauncher
    from tokenwire.tokenizer import Tokenizer

__all__ = ["VllmEngine", "VllmEngineConfig", "check_vllm_params"]

log = logging.getLogger("tokenwire.engine.vllm")

#: How the engines may reach the input and output sockets (``VllmEngineConfig.transport``).
TRANSPORTS = ("tcp", "ipc")
#: The longest directory (bytes) the Unix sockets may go in: a socket's path holds 107 bytes on
#: Linux, ``/output`` included; past it, ``/tmp`` is used.
_LONGEST_IPC_DIR = 96
#: Seconds between checks that every engine is still connected.
_PROBE_PERIOD = 2.0
#: The output reader's shortest turn (seconds) at reading messages that are already waiting
#: before it lets the streams run; a turn lasts as long as the streams took in theirs. Each read
#: takes everything waiting (up to ``_MAX_MERGED`` messages) as one step, so a turn of no length
#: costs no throughput (when messages were read one by one, yielding after each halved it), and
#: at low load each step goes out as it comes (a turn of 1 ms made a fast engine's tokens wait
#: for it: 2.3 ms between chunks at one stream where smg has 0.3).
_READ_TURN = 0.0
#: The most messages read at once; consecutive plain steps among them reach the shard as one.
_MAX_MERGED = 64
#: The longest turn (seconds): after a long pause of the streams, reading as long would stall them.
_MAX_READ_TURN = 0.05
#: Seconds an engine with requests in flight may say nothing before it is pinged (and, when the
#: ping goes unanswered as long again, taken for hung), by default.
DEFAULT_STALL_TIMEOUT = 60.0
#: Scheduler stats of an engine that is gone: its gauges go to 0.
_GONE_STATS = {"num_running_reqs": 0, "num_waiting_reqs": 0, "kv_cache_usage": 0.0}
#: Requests whose engine times are kept (finished ones nobody asked about go first).
_MAX_TIMES = 1 << 16


@dataclass
class VllmEngineConfig:
    """How tokenwire reaches its vLLM engines."""

    #: ``tcp://HOST:PORT`` to bind the handshake ROUTER on (engines dial it); unused when
    #: ``input_fd``/``output_fd`` are given.
    handshake_address: str | None = None
    #: Engines to wait for (data-parallel size).
    data_parallel_size: int = 1
    #: The first engine rank this frontend serves (vLLM's ``--engine-start-index``).
    engine_start_index: int = 0
    #: Listener file descriptors handed over by vLLM's supervisor (it did the handshake).
    input_fd: int | None = None
    output_fd: int | None = None
    #: Seconds to wait for every engine to be ready.
    ready_timeout: float = 600.0
    #: This frontend's client index (outputs come back to it).
    client_index: int = 0
    #: A child vLLM process this engine owns (spawn mode): its exit is the engines' death.
    launcher: VllmLauncher | None = None
    #: Called with a progress line while waiting for the engines.
    progress: Callable[[str], None] | None = None
    #: Polled while waiting for the engines: True gives the startup up (the server is stopping).
    should_stop: Callable[[], bool] | None = None
    #: Seconds an engine with requests in flight may say nothing before it is pinged, and then
    #: taken for hung if the ping goes unanswered as long (None: never).
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT
    #: How requests are routed over several engines (None: fewest requests in flight).
    routing: RoutingConfig | None = None
    #: The engines' KV-cache events configuration, as they were given it (None: where their
    #: ready responses say, if they do), and the host a publisher bound to a wildcard address
    #: is reached at.
    kv_events: KvEventsConfig | None = None
    kv_events_host: str = "127.0.0.1"
    #: A request whose engine dies before its first output is sent once to another.
    retry_on_failure: bool = False
    #: How the engines reach the input and output sockets: ``"tcp"`` (on the handshake's
    #: host) or ``"ipc"`` (Unix sockets in a directory of this process's own, removed at close:
    #: the engines must run on this host, under the same user).
    transport: str = "tcp"


@dataclass
class _Core:
    """One engine (data-parallel rank)."""

    rank: int
    identity: bytes
    ready: dict[str, Any] = field(default_factory=dict)
    #: Connected (False once its process or connection is gone, until it comes back).
    alive: bool = True
    #: Answering (False while it is taken for hung: it said nothing, not even to a ping).
    healthy: bool = True
    in_flight: set[str] = field(default_factory=set)
    #: When it last sent anything (monotonic seconds).
    heard: float = field(default_factory=time.monotonic)
    #: The ping in flight while it is silent, if any.
    ping: asyncio.Task[None] | None = None

    @property
    def serving(self) -> bool:
        return self.alive and self.healthy


def check_vllm_params(req: EngineRequest) -> None:
    """What vLLM's ``SamplingParams`` refuses, refused here first (a bad request must never reach
    an engine): ``ValidationError`` naming the field."""
    p = req.params
    checks = (
        ("temperature", 0.0 <= p.temperature <= 2.0 or p.top_k == 1, "in [0, 2]"),
        ("presence_penalty", -2.0 <= p.presence_penalty <= 2.0, "in [-2, 2]"),
        ("frequency_penalty", -2.0 <= p.frequency_penalty <= 2.0, "in [-2, 2]"),
        (
            "repetition_penalty",
            math.isfinite(p.repetition_penalty) and p.repetition_penalty > 0,
            "a finite number above 0",
        ),
        ("top_p", 0.0 < p.top_p <= 1.0, "in (0, 1]"),
        ("min_p", 0.0 <= p.min_p <= 1.0, "in [0, 1]"),
    )
    for name, ok, what in checks:
        if not ok:
            raise ValidationError(
                f"{name} must be {what} for this engine, got {getattr(p, name)}", param=name
            )
    if p.max_new_tokens is not None and p.min_new_tokens > p.max_new_tokens:
        raise ValidationError(
            f"min_tokens ({p.min_new_tokens}) must not exceed max_tokens ({p.max_new_tokens})",
            param="min_tokens",
        )


class VllmEngine:
    """The engine; see the module docstring."""

    #: vLLM constrains decoding itself (``structured_outputs``).
    supports_structured_outputs = True
    #: vLLM's engine honours every engine-side request field (LoRA when it was started with
    #: ``--enable-lora``, the thinking budget with a reasoning config).
    supported_request_fields = REQUEST_FIELDS

    def __init__(self, tokenizer: Tokenizer, config: VllmEngineConfig) -> None:
        if config.transport not in TRANSPORTS:
            raise ValueError(f"the engine transport must be tcp or ipc, got {config.transport!r}")
        self.tokenizer = tokenizer
        self.config = config
        self.eos = wire.EngineEos.from_ids(tokenizer.eos_token_ids)
        self._routing = (
            VllmRouting(
                config.routing,
                config.kv_events,
                events_host=config.kv_events_host,
            )
            if config.routing is not None
            else None
        )
        #: With ``retry_on_failure``: requests with no output yet, as submitted.
        self._unstarted: dict[str, EngineRequest] = {}
        self._output: OutputCallback | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._input: zmq.asyncio.Socket | None = None
        self._input_sync: zmq.Socket | None = None
        self._output_sock: zmq.asyncio.Socket | None = None
        #: The directory of the Unix sockets (``transport="ipc"``), removed at close.
        self._ipc_dir: str | None = None
        self._cores: list[_Core] = []
        self._by_rank: dict[int, _Core] = {}
        self._handshake_sock: zmq.asyncio.Socket | None = None
        self._init: bytes = b""
        self._owner: dict[str, _Core] = {}
        self._prompt_lens: dict[str, int] = {}
        self._max_tokens: dict[str, int | None] = {}
        #: Top counts (output, prompt; -1 for none) of requests that asked for logprobs.
        self._logprobs: dict[str, tuple[int, int]] = {}
        #: Prompt tokens each running request found in the engine's prefix cache (from its
        #: first output's prefill stats), while any is above 0.
        self._cached: dict[str, int] = {}
        self._pending_aborts: dict[bytes, list[str]] = {}
        self._abort_scheduled = False
        self._utility: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        #: Requests sent again after their engine died (``retry_on_failure``).
        self.retried = 0
        self._alive = False
        self._closing = False
        self.dead_reason: str | None = None
        self.max_model_len: int | None = None
        #: The latest scheduler stats per engine rank (raw map), for /metrics.
        self._stats_decoded: dict[int, dict[str, Any]] = {}
        #: Stats not decoded yet, by rank (decoding every step's would cost every step: they
        #: are decoded when read, at a scrape).
        self._stats_raw: dict[int, Any] = {}
        #: When each rank took its latest stats, by that engine's clock: vLLM gives each step's
        #: stats to one API server only, so with several this says whose are the newest.
        self.scheduler_stats_at: dict[int, float] = {}
        #: Per request, by the engine's clock: [queued, scheduled, first token, last token, rank]
        #: (from its scheduler events and the steps' timestamps; 0.0: not known yet).
        self._times: dict[str, list[float]] = {}
        #: The tasks the engines run (vLLM's ``get_supported_tasks``, asked once they are ready),
        #: and the pooling requests in flight.
        self.supported_tasks: tuple[str, ...] = DEFAULT_TASKS
        self._pooling: set[str] = set()
        #: Per engine rank: step tokens, preemptions, prefix cache counts (``/metrics``).
        self.rank_stats: dict[int, RankStats] = {}

    # ---- Engine protocol -------------------------------------------------------------------------

    @property
    def scheduler_stats(self) -> dict[int, dict[str, Any]]:
        """The latest scheduler stats per engine rank (raw map), for /metrics."""
        if self._stats_raw:
            for rank, raw in self._stats_raw.items():
                stats = wire.decode_scheduler_stats(raw)
                if stats is not None:
                    self._stats_decoded[rank] = stats
            self._stats_raw.clear()
        return self._stats_decoded

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def cache_config(self) -> dict[int, dict[str, str]]:
        """Per rank, the KV cache's settings its ready response gave (``vllm:cache_config_info``'s
        labels, as vLLM's frontend exports them)."""
        keys = ("block_size", "num_gpu_blocks", "kv_cache_size_tokens", "kv_cache_max_concurrency")
        return {c.rank: {k: str(c.ready.get(k)) for k in keys} for c in self._cores if c.ready}

    @property
    def vllm_version(self) -> str | None:
        """The engines' vLLM version, as their ready responses say (None before, or unsaid)."""
        for core in self._cores:
            version = core.ready.get("vllm_version")
            if isinstance(version, str) and version:
                return version
        return None

    @property
    def engines(self) -> list[dict[str, Any]]:
        """Each engine: rank, alive, requests in flight, KV cache capacity in tokens (from its
        ready response; None when it did not say)."""
        return [
            {
                "rank": c.rank,
                "alive": c.serving,
                "in_flight": len(c.in_flight),
                "kv_capacity_tokens": _kv_capacity(c.ready),
                "max_num_seqs": c.ready.get("max_num_seqs"),
            }
            for c in self._cores
        ]

    async def start(self, output: OutputCallback) -> None:
        self._output = output
        cfg = self.config
        self._ctx = _context()
        ranks = range(cfg.engine_start_index, cfg.engine_start_index + cfg.data_parallel_size)
        self._cores = [_Core(r, wire.engine_identity(r)) for r in ranks]
        self._by_rank = {c.rank: c for c in self._cores}
        if cfg.input_fd is not None and cfg.output_fd is not None:
            self._input = self._adopt(zmq.ROUTER, cfg.input_fd)
            self._output_sock = self._adopt(zmq.PULL, cfg.output_fd)
            await self._wait_ready_responses(time.monotonic() + cfg.ready_timeout)
        else:
            try:
                await self._handshake()
            except BaseException:
                if cfg.launcher is not None:
                    await asyncio.to_thread(cfg.launcher.stop)
                self._remove_ipc_dir()
                raise
        self._input_sync = zmq.Socket.shadow(self._input.underlying)
        self._input_sync.setsockopt(zmq.ROUTER_MANDATORY, 1)
        lens = [c.ready.get("max_model_len") for c in self._cores]
        known = [x for x in lens if isinstance(x, int) and x > 0]
        self.max_model_len = min(known) if known else None
        self._alive = True
        if self._routing is not None:
            self._routing.start(self._ctx, self._cores)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._read_outputs(), name="vllm-outputs"),
            loop.create_task(self._watch_connections(), name="vllm-connections"),
            loop.create_task(self._read_inputs(), name="vllm-inputs"),
        ]
        if self._handshake_sock is not None:
            self._tasks.append(loop.create_task(self._serve_handshake(), name="vllm-handshake"))
        if cfg.stall_timeout is not None:
            self._tasks.append(loop.create_task(self._watch_stalls(), name="vllm-stalls"))
        if cfg.launcher is not None:
            self._tasks.append(loop.create_task(self._watch_launcher(), name="vllm-process"))
        await self._learn_supported_tasks()
        log.info(
            "vLLM engines ready: %s (max_model_len %s)",
            ", ".join(f"rank {c.rank}" for c in self._cores),
            self.max_model_len,
        )

    async def close(self) -> None:
        self._closing = True
        self._alive = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        for fut in self._utility.values():
            if not fut.done():
                fut.set_exception(QueueFullError("the engine is shutting down"))
        if self._handshake_sock is not None:
            self._handshake_sock.close(linger=0)
            self._handshake_sock = None
        if self._routing is not None:
            await self._routing.close()
        if self.config.launcher is not None:
            await asyncio.to_thread(self.config.launcher.stop)
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None
        self._remove_ipc_dir()

    def _remove_ipc_dir(self) -> None:
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            self._ipc_dir = None

    def _endpoints(self, host: str) -> tuple[str, str]:
        """Where the input and output sockets bind (``config.transport``)."""
        if self.config.transport == "ipc":
            folder = tempfile.mkdtemp(prefix="tokenwire-engine-")  # (mode 0700)
            if len(os.fsencode(folder)) > _LONGEST_IPC_DIR:  # (a long TMPDIR)
                os.rmdir(folder)
                folder = tempfile.mkdtemp(prefix="tokenwire-engine-", dir="/tmp")
            self._ipc_dir = folder
            return f"ipc://{folder}/input", f"ipc://{folder}/output"
        return f"tcp://{host}:*", f"tcp://{host}:*"

    def submit(self, request: EngineRequest) -> None:
        if not self._alive:
            raise QueueFullError(f"the engine is not running ({self.dead_reason or 'not started'})")
        check_vllm_params(request)
        p = request.params
        if p.max_new_tokens == 0 and p.prompt_logprobs is None:
            self._finish_locally(request)
            return
        if request.data_parallel_rank is not None:
            core = next(
                (c for c in self._cores if c.serving and c.rank == request.data_parallel_rank), None
            )
            if core is None:
                raise ValidationError(
                    f"no live engine has data-parallel rank {request.data_parallel_rank}",
                    param="data_parallel_rank",
                )
        else:
            core = self._pick(request)
        self._send_add(core, request, retry=self.config.retry_on_failure)

    def _pick(self, request: EngineRequest) -> _Core:
        """The engine in rotation that takes ``request``."""
        serving = [c for c in self._cores if c.serving]
        if not serving:
            raise QueueFullError(f"no engine is in rotation ({self.dead_reason or 'none ready'})")
        if self._routing is None or len(serving) == 1:
            return min(serving, key=lambda c: len(c.in_flight))
        rank = self._routing.pick(request, [(c.rank, len(c.in_flight)) for c in serving])
        return self._by_rank[rank]

    def _send_add(self, core: _Core, request: EngineRequest, *, retry: bool = False) -> None:
        """Send ``request`` to ``core`` and keep what its outputs are read with (``retry``:
        until its first output, it may go to another engine should this one die)."""
        rid = request.rid
        p = request.params
        sampling = wire.sampling_params_map(
            request.params, len(request.prompt_ids), self.max_model_len, self.eos
        )
        aux: list[Any] = [b""]
        payload = wire.encode_add(
            request,
            sampling,
            client_index=self.config.client_index,
            priority=getattr(request, "priority", 0) or 0,
            aux=aux,
        )
        assert self._input_sync is not None
        try:
            if len(aux) > 1:  # (a multimodal request's tensors: side buffers, not copied)
                frames = (core.identity, wire.ADD, payload, *aux[1:])
                self._input_sync.send_multipart(frames, copy=False)
            else:
                _send(self._input_sync, core.identity, wire.ADD, payload)
        except zmq.ZMQError as exc:
            self._core_died(core, f"cannot reach engine rank {core.rank}: {exc}")
            raise QueueFullError(f"the engine is not reachable ({exc})") from None
        if not core.in_flight:
            core.heard = time.monotonic()  # (silence before it had work is no stall)
        core.in_flight.add(rid)
        self._owner[rid] = core
        self._prompt_lens[rid] = len(request.prompt_ids)
        self._max_tokens[rid] = (
            p.max_new_tokens if p.max_new_tokens == 0 else sampling["max_tokens"]
        )
        if p.logprobs is not None or p.prompt_logprobs is not None:
            lp = p.logprobs if p.logprobs is not None else -1
            self._logprobs[rid] = (lp, p.prompt_logprobs if p.prompt_logprobs is not None else -1)
        if retry:
            self._unstarted[rid] = request

    async def _learn_supported_tasks(self) -> None:
        """Ask the first engine which tasks it runs (what vLLM's frontend asks at startup)."""
        try:
            tasks = await asyncio.wait_for(self.call_utility("get_supported_tasks"), 60)
        except (asyncio.TimeoutError, RuntimeError, QueueFullError, zmq.ZMQError) as exc:
            log.warning("the engine did not say which tasks it supports (%s): generation", exc)
            return
        if isinstance(tasks, (list, tuple)) and all(isinstance(t, str) for t in tasks):
            self.supported_tasks = tuple(tasks)

    def submit_pooling(self, request: PoolingRequest) -> None:
        """Send one input to pool to the engine with the fewest requests in flight."""
        if not self._alive:
            raise QueueFullError(f"the engine is not running ({self.dead_reason or 'not started'})")
        rid = request.rid
        core = min((c for c in self._cores if c.serving), key=lambda c: len(c.in_flight))
        payload = pool_wire.encode_pooling_add(request, client_index=self.config.client_index)
        assert self._input_sync is not None
        try:
            self._input_sync.send_multipart((core.identity, wire.ADD, payload))
        except zmq.ZMQError as exc:
            self._core_died(core, f"cannot reach engine rank {core.rank}: {exc}")
            raise QueueFullError(f"the engine is not reachable ({exc})") from None
        if not core.in_flight:
            core.heard = time.monotonic()
        core.in_flight.add(rid)
        self._owner[rid] = core
        self._prompt_lens[rid] = len(request.prompt_ids)
        self._max_tokens[rid] = None
        self._pooling.add(rid)

    def _take_pooled(self, msg: wire.EngineCoreOutputs, frames: list[Any]) -> list[Any]:
        """A message's pooling outputs, sent on as one ``Pooled``; its other outputs returned."""
        rest, pooled = pool_wire.pooled_outputs(
            msg.outputs, frames, self._pooling, msg.engine_index
        )
        if pooled is not None:
            for rid in pooled.rids:
                self._forget(rid)
            for rid, _ in pooled.errors:
                self._forget(rid)
            assert self._output is not None
            self._output(pooled)
        return rest

    def abort(self, rid: str) -> None:
        self._times.pop(rid, None)
        core = self._forget(rid)
        if core is None or not core.alive:
            return
        # Aborts of one loop iteration go out together, one message per engine.
        self._pending_aborts.setdefault(core.identity, []).append(rid)
        if not self._abort_scheduled:
            self._abort_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_aborts)

    def engine_of(self, rid: str) -> int:
        """The rank of the engine that has request ``rid`` (the first one's when none has)."""
        core = self._owner.get(rid)
        return core.rank if core is not None else self.config.engine_start_index

    def pop_request_times(self, rid: str) -> RequestTimes | None:
        """When a finished request was queued, scheduled, and produced its first and last tokens
        (None when the engine did not say: its stats are off)."""
        t = self._times.pop(rid, None)
        if t is None or not all(t[:4]):
            return None
        return RequestTimes(t[0], t[1], t[2], t[3], engine=int(t[4]))

    async def call_utility(self, method: str, *args: Any, rank: int | None = None) -> Any:
        """Call a utility method on an engine (the first live one unless ``rank``)."""
        core = next(
            (c for c in self._cores if c.serving and (rank is None or c.rank == rank)), None
        )
        if core is None:
            raise QueueFullError("no live engine to call")
        return await self._call(core, method, *args)

    async def _call(self, core: _Core, method: str, *args: Any) -> Any:
        call_id = next(self._call_ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._utility[call_id] = fut
        payload = wire.encode_utility(self.config.client_index, call_id, method, args)
        assert self._input_sync is not None
        try:
            _send(self._input_sync, core.identity, wire.UTILITY, payload)
            return await fut
        finally:
            self._utility.pop(call_id, None)  # (answered, or given up: a ping timed out)

    # ---- internals -------------------------------------------------------------------------------

    def _adopt(self, kind: int, fd: int) -> zmq.asyncio.Socket:
        """A ZMQ socket over a listener file descriptor vLLM's supervisor bound."""
        assert self._ctx is not None
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.USE_FD, fd)
        _tune(sock)
        if kind == zmq.ROUTER:
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted engine takes its identity
        family = socket.AF_UNIX
        probe = socket.socket(fileno=fd)
        try:
            family = probe.family
            name = probe.getsockname()
        finally:
            probe.detach()
        if family == socket.AF_UNIX:
            endpoint = "ipc://" + (name.decode() if isinstance(name, bytes) else name)
        else:
            endpoint = f"tcp://{name[0]}:{name[1]}"
        sock.bind(endpoint)
        return sock

    async def _handshake(self) -> None:
        cfg = self.config
        assert self._ctx is not None and cfg.handshake_address is not None
        deadline = time.monotonic() + cfg.ready_timeout
        host = _host_of(cfg.handshake_address)
        if not _is_loopback(host):
            log.warning(
                "the handshake address %s is not a loopback address: whoever can reach it can "
                "speak for an engine (vLLM's engine protocol has no authentication); keep it on "
                "a trusted network",
                cfg.handshake_address,
            )
        hs = self._ctx.socket(zmq.ROUTER)
        _tune(hs)
        hs.bind(cfg.handshake_address)
        if cfg.launcher is not None:  # (the handshake may be on a port the kernel picked)
            cfg.launcher.port = port_of(hs.getsockopt_string(zmq.LAST_ENDPOINT))
        input_at, output_at = self._endpoints(host)
        self._input = self._ctx.socket(zmq.ROUTER)
        _tune(self._input)
        self._input.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted engine takes its identity
        self._input.bind(input_at)
        self._output_sock = self._ctx.socket(zmq.PULL)
        _tune(self._output_sock)
        self._output_sock.bind(output_at)
        if cfg.launcher is not None:
            cfg.launcher.start()
        init = wire.encode_init(
            [self._input.getsockopt_string(zmq.LAST_ENDPOINT)],
            [self._output_sock.getsockopt_string(zmq.LAST_ENDPOINT)],
        )
        by_identity = {c.identity: c for c in self._cores}
        waiting_hello = set(by_identity)
        waiting_ready = set(by_identity)
        ready_task = asyncio.ensure_future(self._wait_ready_responses(deadline))
        try:
            started = time.monotonic()
            next_note = started + 10
            while waiting_ready:
                self._check_launcher()
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        startup_timeout_message(
                            cfg.ready_timeout,
                            len(self._cores),
                            len(waiting_hello),
                            len(waiting_ready),
                            cfg.launcher,
                        )
                    )
                if time.monotonic() > next_note:
                    next_note += 10
                    self._note(
                        f"waiting for {len(waiting_hello)} engine(s) to say hello and "
                        f"{len(waiting_ready)} to be ready ({time.monotonic() - started:.0f} s)"
                    )
                if not await hs.poll(500):
                    continue
                got = _handshake_message(await hs.recv_multipart())
                if got is None:
                    continue
                identity, msg = got
                if identity not in by_identity:
                    log.warning("an engine with unexpected identity %r said %s", identity, msg)
                    continue
                if msg["status"] == "HELLO":
                    waiting_hello.discard(identity)
                    self._note(f"engine rank {by_identity[identity].rank} said hello")
                    await hs.send_multipart((identity, init))
                else:
                    waiting_ready.discard(identity)
            await ready_task
        except BaseException:
            hs.close(linger=0)
            raise
        finally:
            ready_task.cancel()
        # Kept open for the server's life: an engine that comes back says hello again.
        self._handshake_sock = hs
        self._init = init

    async def _wait_ready_responses(self, deadline: float) -> None:
        """Each engine's ready response, on the input socket (needed before it can be routed to)."""
        assert self._input is not None
        by_identity = {c.identity: c for c in self._cores}
        waiting = set(by_identity)
        while waiting:
            self._check_launcher()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    startup_timeout_message(
                        self.config.ready_timeout,
                        len(self._cores),
                        0,
                        len(waiting),
                        self.config.launcher,
                    )
                )
            if not await self._input.poll(500):
                continue
            identity, *rest = await self._input.recv_multipart()
            core = by_identity.get(identity)
            if core is None:
                continue
            try:
                core.ready = wire.decode_ready_response(rest[0] if rest else b"")
            except CodecError as exc:
                log.warning("engine rank %d sent a bad ready response: %s", core.rank, exc)
                continue
            waiting.discard(identity)

    def _malformed(self, buf: Any, exc: Exception, rank: int | None = None) -> None:
        """An output message that does not decode: every request in flight on its engine fails,
        here and in the engine (the message may have carried any of their tokens, so none of
        their counts can be trusted; no request may keep running with nobody to read it). When
        the message does not say its engine, every engine's requests fail. The engine stays in
        rotation: its later messages may decode."""
        if rank is None:
            rank = wire.engine_index_in(buf)
        core = self._by_rank.get(rank) if rank is not None else None
        cores = [core] if core is not None else self._cores
        rids = [rid for c in cores for rid in c.in_flight]
        rids += [rid for rid in wire.request_ids_in(buf) if rid in self._owner and rid not in rids]
        where = f"engine rank {rank}" if core is not None else "an unknown engine"
        log.error(
            "undecodable output message from %s (%s): failing its %d request(s) in flight",
            where,
            exc,
            len(rids),
        )
        assert self._output is not None
        for rid in rids:
            self.abort(rid)
            self._output(encode_error_frame(rid, "malformed engine output"))

    def _check_launcher(self) -> None:
        if self.config.should_stop is not None and self.config.should_stop():
            raise RuntimeError("startup interrupted: the server is stopping")
        launcher = self.config.launcher
        if launcher is not None and launcher.returncode is not None:
            raise RuntimeError(launcher.failure_message())

    def _note(self, line: str) -> None:
        if self.config.progress is not None:
            self.config.progress(line)
        else:
            log.info("%s", line)

    async def _read_outputs(self) -> None:
        """Read the output socket until cancelled. It waits on the socket's file descriptor
        itself (a loop reader and one future a wait) rather than through pyzmq's asyncio
        ``poll`` (a poller and futures a wait): at one or a few streams every engine step is a
        wait of its own. Once woken it reads what is waiting (``_read_waiting``)."""
        assert self._output_sock is not None and self._output is not None
        sync = zmq.Socket.shadow(self._output_sock.underlying)
        loop = asyncio.get_running_loop()
        fd = sync.getsockopt(zmq.FD)
        wake: list[asyncio.Future[None] | None] = [None]

        def readable() -> None:
            # The descriptor signals that the socket's state may have changed; whether a message
            # is waiting is for the socket to say (asking it also clears the signal).
            waiter = wake[0]
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

        on_message = self.on_message
        on_messages = self.on_messages
        loop.add_reader(fd, readable)
        try:
            turn_ends = time.perf_counter() + _READ_TURN
            while True:
                waiting = _read_waiting(sync, _MAX_MERGED)
                if len(waiting) == 1:
                    on_message(waiting[0])
                elif waiting:
                    on_messages(waiting)
                if len(waiting) < _MAX_MERGED:
                    # The socket had nothing more: wait for its descriptor (what came since
                    # signals it). Each question to the socket is a system call or two.
                    waiter = wake[0] = loop.create_future()
                    await waiter
                    wake[0] = None
                    turn_ends = time.perf_counter() + _READ_TURN
                elif (now := time.perf_counter()) >= turn_ends:
                    # More may be waiting, and the turn is over: the streams run first.
                    await asyncio.sleep(0)
                    # The next turn lasts as long as the others took (within bounds).
                    after = time.perf_counter()
                    turn_ends = after + min(max(_READ_TURN, after - now), _MAX_READ_TURN)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the socket broke: nothing more can arrive
            if not self._closing:
                log.exception("reading engine outputs failed")
                for core in self._cores:
                    self._core_died(core, f"engine output socket failed: {exc}")
        finally:
            with contextlib.suppress(Exception):
                loop.remove_reader(fd)

    def on_message(self, frames: list[Any]) -> None:
        """One message from the output socket (its frames' buffers): an engine step's outputs
        to the shard as one decoded step, utility results, scheduler stats, or an engine's
        death (plain, synchronous: the reader above only receives)."""
        msg = self._decode(frames)
        if msg is not None:
            self._on_decoded(msg, frames)

    def on_messages(self, messages: list[list[Any]]) -> None:
        """Several messages read together, in order, as ``on_message`` takes each, except that
        consecutive steps of one engine whose outputs are plain (no logprobs, pooling or side
        frames) reach the shard as one step: a request in several of them gets its tokens
        together, as from one multi-token step. Each message's own bookkeeping (its step's
        counts, its requests' times, its scheduler stats) stays its own."""
        merging = _MergedSteps()
        for frames in messages:
            msg = self._decode(frames, merging)
            if msg is None:
                continue
            side = len(frames) != 1 or msg.utility_output is not None
            if side or self._pooling or self._logprobs:
                self._flush_merged(merging)
                self._on_decoded(msg, frames)
                continue
            if not merging.fits(msg):
                self._flush_merged(merging)
            self._heard(msg)
            if msg.outputs:
                finished, tokens, first = merging.add(msg, self._max_tokens)
                for o in first:
                    tokens += self._prefilled(o.request_id, o.prefill_stats)
                self._rank_stats(msg.engine_index).step(tokens)
                self._note_times(msg, finished)
            if msg.scheduler_stats != wire._NIL:
                self._stats(msg)
        self._flush_merged(merging)

    def _flush_merged(self, merging: _MergedSteps) -> None:
        """The steps merged so far to the shard as one step (then none are)."""
        outputs = merging.take()
        if outputs:
            self._hand_over(outputs, merging.engine_index, [])

    def _decode(
        self, frames: list[Any], pending: _MergedSteps | None = None
    ) -> wire.EngineCoreOutputs | None:
        """A message decoded (None: it was the engine's death notice, or malformed: handled,
        after the steps ``pending`` holds are delivered)."""
        buf = frames[0]
        if len(frames) == 1 and buf == wire.ENGINE_CORE_DEAD:
            if pending is not None:
                self._flush_merged(pending)
            self._engine_dead_message()
            return None
        try:
            return wire.decode_outputs(buf)
        except CodecError as exc:
            if pending is not None:
                self._flush_merged(pending)
            self._malformed(buf, exc)
            return None

    def _heard(self, msg: wire.EngineCoreOutputs) -> None:
        core = self._by_rank.get(msg.engine_index)
        if core is not None:
            core.heard = time.monotonic()
            if not core.healthy:
                self._answers_again(core)

    def _on_decoded(self, msg: wire.EngineCoreOutputs, frames: list[Any]) -> None:
        """One decoded message's work (``on_message``)."""
        self._heard(msg)
        if self._pooling and msg.outputs:
            msg.outputs = self._take_pooled(msg, frames)
        if msg.outputs:
            prefilled = 0
            for o in msg.outputs:
                if o.prefill_stats is not None:
                    prefilled += self._prefilled(o.request_id, o.prefill_stats)
            batch = self._hand_over(msg.outputs, msg.engine_index, frames)
            if batch is None:
                return
            self._rank_stats(msg.engine_index).step(prefilled + len(batch.decoded.token_ids))
            self._note_times(msg, batch.finished)
        if msg.utility_output is not None:
            self._utility_result(msg.utility_output)
        if msg.scheduler_stats != wire._NIL:
            self._stats(msg)

    def _hand_over(
        self, outputs: list[wire.EngineCoreOutput], engine_index: int, frames: list[Any]
    ) -> wire.OutputBatch | None:
        """A step's outputs to the shard as one decoded step, and its finished requests
        forgotten (None: the outputs were malformed, which ends the engine's requests)."""
        output = self._output
        assert output is not None
        try:
            batch = wire.to_batch(
                outputs, self._prompt_lens, self._max_tokens, self._logprobs or None, frames
            )
        except CodecError as exc:
            self._malformed(frames[0] if frames else b"", exc, engine_index)
            return None
        if self._cached:
            get = self._cached.get
            batch.decoded.cached_tokens = [get(r, 0) for r in batch.decoded.rids]
        for rid in batch.finished:
            self._forget(rid)
        if engine_index:
            batch.decoded.engine = engine_index
        output(batch.decoded)
        for rid, message in batch.errors:
            output(encode_error_frame(rid, message))
        return batch

    async def _watch_connections(self) -> None:
        """Find engines whose connection dropped: after every disconnect on the input socket, and
        every ``_PROBE_PERIOD`` seconds, each live engine gets an empty ABORT (a no-op), which the
        ROUTER cannot route to an identity that is gone."""
        assert self._input is not None
        monitor = self._input.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            while True:
                if await monitor.poll(_PROBE_PERIOD * 1000):
                    await monitor.recv_multipart()
                self._probe()
        finally:
            with contextlib.suppress(zmq.ZMQError):
                self._input.disable_monitor()
            monitor.close(linger=0)

    async def _serve_handshake(self) -> None:
        """After startup: an engine of one of this server's ranks that dials in again (a
        restarted engine) gets the same addresses; its ready response comes on the input
        socket (``_read_inputs``)."""
        hs = self._handshake_sock
        assert hs is not None
        while True:
            got = _handshake_message(await hs.recv_multipart())
            if got is None:
                continue
            identity, msg = got
            core = next((c for c in self._cores if c.identity == identity), None)
            if core is None:
                log.warning("an engine with unexpected identity %r said %.200s", identity, msg)
            elif msg["status"] == "HELLO":
                if core.serving and await self._answers(core):
                    log.warning(
                        "an engine says hello as rank %d, which is serving and answering: "
                        "refused (is a second engine started with the same rank?)",
                        core.rank,
                    )
                    continue
                log.info("engine rank %d says hello again", core.rank)
                await hs.send_multipart((identity, self._init))

    async def _answers(self, core: _Core) -> bool:
        """Whether an engine taken to be serving answers a question now (within the stall
        timeout, or 5 s)."""
        timeout = min(self.config.stall_timeout or 5.0, 5.0)
        try:
            await asyncio.wait_for(self._call(core, "is_sleeping"), timeout)
        except RuntimeError:  # it answered, with an error
            return True
        except (asyncio.TimeoutError, zmq.ZMQError, QueueFullError):
            return False
        return True

    async def _read_inputs(self) -> None:
        """After startup, what engines send on the input socket: the ready response of an engine
        that came back, which puts it in rotation again."""
        assert self._input is not None
        while True:
            identity, *rest = await self._input.recv_multipart()
            core = next((c for c in self._cores if c.identity == identity), None)
            if core is None:
                continue
            try:
                ready = wire.decode_ready_response(rest[0] if rest else b"")
            except CodecError as exc:
                log.warning("engine rank %d sent a bad ready response: %s", core.rank, exc)
                continue
            self._rejoined(core, ready)

    def _rejoined(self, core: _Core, ready: dict[str, Any]) -> None:
        for rid in list(core.in_flight):  # (whatever the engine ran before is gone with it)
            self._forget(rid)
            if self._output is not None:
                self._output(encode_error_frame(rid, f"engine rank {core.rank} restarted"))
        core.ready = ready
        core.alive = core.healthy = True
        core.heard = time.monotonic()
        if self._routing is not None:
            self._routing.back(core.rank, ready)
        log.info("vLLM engine rank %d is back", core.rank)
        self._refresh_alive()

    async def _watch_stalls(self) -> None:
        """Ping every engine that has requests in flight and has said nothing for the stall
        timeout."""
        stall = self.config.stall_timeout
        assert stall is not None
        while True:
            await asyncio.sleep(min(1.0, stall / 4))
            now = time.monotonic()
            for core in self._cores:
                if (
                    core.serving
                    and core.in_flight
                    and core.ping is None
                    and now - core.heard > stall
                ):
                    core.ping = asyncio.get_running_loop().create_task(self._ping(core, stall))

    async def _ping(self, core: _Core, timeout: float) -> None:
        """Ask a silent engine a question; unanswered within ``timeout``, it is hung."""
        try:
            with contextlib.suppress(RuntimeError, QueueFullError):
                await asyncio.wait_for(self._call(core, "is_sleeping"), timeout)
        except asyncio.TimeoutError:
            if core.serving and time.monotonic() - core.heard > timeout:
                self._hung(core, timeout)
        except zmq.ZMQError as exc:
            self._core_died(core, f"cannot reach engine rank {core.rank}: {exc}")
        finally:
            core.ping = None

    def _hung(self, core: _Core, timeout: float) -> None:
        core.healthy = False
        reason = (
            f"engine rank {core.rank} is not answering: nothing from it for "
            f"{time.monotonic() - core.heard:.0f} s with requests in flight, and no answer to a "
            f"ping in {timeout:g} s"
        )
        log.error("%s; taking it out of rotation until it answers", reason)
        rids = list(core.in_flight)
        for rid in rids:
            self.abort(rid)  # (should it wake up, it drops them)
        self._refresh_alive(reason)
        if self._output is not None:
            for rid in rids:
                self._output(encode_error_frame(rid, reason))

    def _answers_again(self, core: _Core) -> None:
        core.healthy = True
        log.warning("vLLM engine rank %d answers again: back in rotation", core.rank)
        self._refresh_alive()

    def _refresh_alive(self, reason: str | None = None) -> None:
        """``alive``: some engine serves (and the server is not closing)."""
        self._alive = not self._closing and any(c.serving for c in self._cores)
        if not self._alive and reason is not None:
            self.dead_reason = reason

    def _probe(self) -> None:
        if self._input_sync is None or self._closing:
            return
        empty = wire.encode_abort([])
        for core in self._cores:
            if not core.alive:
                continue
            try:
                _send(self._input_sync, core.identity, wire.ABORT, empty)
            except zmq.ZMQError as exc:
                self._core_died(core, f"engine rank {core.rank} disconnected ({exc})")

    async def _watch_launcher(self) -> None:
        launcher = self.config.launcher
        assert launcher is not None
        while launcher.returncode is None:
            await asyncio.sleep(0.2)
        if not self._closing:
            for core in self._cores:
                self._core_died(core, launcher.failure_message())

    def _engine_dead_message(self) -> None:
        # ENGINE_CORE_DEAD names no engine: with one engine it is that one; with several, the
        # connection watcher tells which ones went away. Be safe: a lone engine dies here.
        live = [c for c in self._cores if c.alive]
        if len(live) == 1:
            self._core_died(live[0], f"engine rank {live[0].rank} reported ENGINE_CORE_DEAD")
        else:
            log.error("an engine reported ENGINE_CORE_DEAD")

    def _core_died(self, core: _Core, reason: str) -> None:
        if not core.alive:
            return
        core.alive = False
        log.error("vLLM engine rank %d is gone: %s", core.rank, reason)
        rids = list(core.in_flight)
        unstarted = self._unstarted
        retry = {rid: unstarted[rid] for rid in rids if rid in unstarted}
        for rid in rids:
            self._forget(rid)
        if core.rank in self.scheduler_stats:  # its gauges go to 0
            self._stats_decoded[core.rank] = dict(_GONE_STATS)
            self.scheduler_stats_at[core.rank] = time.monotonic()
        if self._routing is not None:
            self._routing.gone(core.rank)
        self._refresh_alive(reason)
        if self._output is not None:
            for rid in rids:
                request = retry.get(rid)
                if request is not None and self._retry(request, core):
                    continue
                self._output(encode_error_frame(rid, f"the engine died: {reason}"))

    def _retry(self, request: EngineRequest, dead: _Core) -> bool:
        """Send a request whose engine died before its first output to another (once)."""
        if not self._alive or request.data_parallel_rank is not None:
            return False
        try:
            core = self._pick(request)
            self._send_add(core, request)
        except (QueueFullError, ValidationError):
            return False
        self.retried += 1
        log.warning(
            "request %s: engine rank %d died before its first output; sent to rank %d",
            request.rid,
            dead.rank,
            core.rank,
        )
        return True

    def _forget(self, rid: str) -> _Core | None:
        core = self._owner.pop(rid, None)
        if core is not None:
            core.in_flight.discard(rid)
            del self._prompt_lens[rid]
            del self._max_tokens[rid]
            self._logprobs.pop(rid, None)
            self._pooling.discard(rid)
            if self._unstarted:
                self._unstarted.pop(rid, None)
            if self._cached:
                self._cached.pop(rid, None)
        return core

    def _prefilled(self, rid: str, stats: Any) -> int:
        """A request's prefill stats (its first output): it has started, its cached tokens
        kept; the prompt tokens the engine computed returned."""
        if self._unstarted:
            self._unstarted.pop(rid, None)
        if not isinstance(stats, dict):
            return 0
        cached = stats.get("num_cached_tokens")
        if isinstance(cached, int) and cached > 0 and rid in self._owner:
            self._cached[rid] = cached
        computed = stats.get("num_computed_tokens")
        return computed if isinstance(computed, int) and computed > 0 else 0

    def _rank_stats(self, rank: int) -> RankStats:
        got = self.rank_stats.get(rank)
        if got is None:
            got = self.rank_stats[rank] = RankStats()
        return got

    def fold_rank_stats(self) -> dict[int, RankStats]:
        """Every rank's counters, with their pending scheduler stats folded in (a scrape)."""
        for stats in self.rank_stats.values():
            stats.fold(wire.prefix_cache_increments)
        return self.rank_stats

    @property
    def routing_decisions(self) -> dict[str, int] | None:
        """Prefix routing's choices so far (None: no router)."""
        return self._routing.router.decisions if self._routing is not None else None

    @property
    def kv_event_batches(self) -> dict[int, int] | None:
        """KV-cache event batches received per engine rank (None: not subscribed)."""
        routing = self._routing
        if routing is None or routing.subscriber is None:
            return None
        return dict(routing.subscriber.batches)

    @property
    def max_loras(self) -> int | None:
        """Adapters each engine holds at once (its ready response's ``max_loras``)."""
        values = [c.ready.get("max_loras") for c in self._cores]
        known = [v for v in values if isinstance(v, int)]
        return min(known) if known else None

    @property
    def supports_lora(self) -> bool:
        """Whether every engine was started with LoRA enabled (its ready response says so)."""
        return bool(self._cores) and all(c.ready.get("supports_lora") for c in self._cores)

    async def call_all(self, method: str, *args: Any) -> list[Any]:
        """A utility method on every live engine, their results in rank order (vLLM's
        ``call_utility_all``)."""
        ranks = [c.rank for c in self._cores if c.alive]
        if not ranks:
            raise QueueFullError("no live engine to call")
        return list(
            await asyncio.gather(*(self.call_utility(method, *args, rank=r) for r in ranks))
        )

    def _flush_aborts(self) -> None:
        self._abort_scheduled = False
        pending, self._pending_aborts = self._pending_aborts, {}
        if self._input_sync is None:
            return
        for identity, rids in pending.items():
            with contextlib.suppress(zmq.ZMQError):
                _send(self._input_sync, identity, wire.ABORT, wire.encode_abort(rids))

    def _finish_locally(self, request: EngineRequest) -> None:
        """A request that asks for no tokens: done without the engine (vLLM refuses it)."""
        assert self._output is not None
        decoded = Decoded(
            True,
            [request.rid],
            [0],
            None,
            [FinishReason.length(0)],
            [len(request.prompt_ids)],
        )
        asyncio.get_running_loop().call_soon(self._output, decoded)

    def _utility_result(self, out: wire.UtilityOutput) -> None:
        fut = self._utility.pop(out.call_id, None)
        if fut is None or fut.done():
            return
        if out.failure_message is not None:
            fut.set_exception(RuntimeError(out.failure_message))
        else:
            result = out.result
            fut.set_result(result[1] if isinstance(result, list) and len(result) == 2 else result)

    def _note_times(self, msg: wire.EngineCoreOutputs, finished: list[str]) -> None:
        """Requests' scheduler events (with their first output) and last outputs."""
        timed = [o for o in msg.outputs if o.events is not None]
        if not timed and not finished:
            return
        at = msg.timestamp or time.monotonic()
        times = self._times
        preempted = 0
        for out in timed:
            preempted += wire.preemptions(out.events)
            queued, scheduled = wire.event_times(out.events)
            t = times.get(out.request_id)
            if t is None:
                if len(times) >= _MAX_TIMES:
                    del times[next(iter(times))]
                t = times[out.request_id] = [0.0, 0.0, 0.0, 0.0, float(msg.engine_index)]
            t[0] = t[0] or queued
            t[1] = t[1] or scheduled
            if out.new_token_ids and not t[2]:
                t[2] = at
        for rid in finished:
            t = times.get(rid)
            if t is not None:
                t[3] = at
        if preempted:
            self._rank_stats(msg.engine_index).preemptions += preempted

    def _stats(self, msg: wire.EngineCoreOutputs) -> None:
        """Keep a message's scheduler stats, undecoded until they are read."""
        self._stats_raw[msg.engine_index] = msg.scheduler_stats
        self._rank_stats(msg.engine_index).scheduler_stats(
            msg.scheduler_stats, wire.prefix_cache_increments
        )
        # An engine that does not stamp its messages: when they arrive (the API servers share
        # one host's monotonic clock).
        self.scheduler_stats_at[msg.engine_index] = msg.timestamp or time.monotonic()


class _MergedSteps:
    """Consecutive steps of one engine, merged into one step's outputs: a request's tokens in
    order, its finish (from its last step) and its first output's prefill stats."""

    __slots__ = ("_by_rid", "_finished", "engine_index")

    def __init__(self) -> None:
        self._by_rid: dict[str, wire.EngineCoreOutput] = {}
        #: Requests that finished in a step taken: nothing may follow them.
        self._finished: set[str] = set()
        self.engine_index = 0

    def fits(self, msg: wire.EngineCoreOutputs) -> bool:
        """Whether ``msg`` can join the steps taken (same engine; no output for a request that
        finished in them)."""
        if not self._by_rid:
            return True
        if msg.engine_index != self.engine_index:
            return False
        done = self._finished
        return not done or not any(o.request_id in done for o in msg.outputs)

    def add(
        self, msg: wire.EngineCoreOutputs, max_tokens: dict[str, int | None]
    ) -> tuple[list[str], int, list[wire.EngineCoreOutput]]:
        """Take ``msg``'s outputs; returns the requests it finished, its tokens that reach the
        shard (``to_batch`` leaves out a failed request's, and those of one that asked for none)
        and its outputs with prefill stats."""
        by_rid = self._by_rid
        if not by_rid:
            self.engine_index = msg.engine_index
        finished: list[str] = []
        first: list[wire.EngineCoreOutput] = []
        tokens = 0
        for o in msg.outputs:
            rid = o.request_id
            code = o.finish_reason
            if code is not None:
                finished.append(rid)
                self._finished.add(rid)
            if (code is None or code in wire.ENDS) and max_tokens.get(rid, 1) != 0:
                tokens += len(o.new_token_ids)
            if o.prefill_stats is not None:
                first.append(o)
            before = by_rid.get(rid)
            if before is None:
                by_rid[rid] = o
            else:
                # In place: the earlier step's output is this merge's own (its message's
                # bookkeeping is done), and a copy per step made merging quadratic.
                before.new_token_ids += o.new_token_ids
                before.finish_reason = code
                before.stop_reason = o.stop_reason
        return finished, tokens, first

    def take(self) -> list[wire.EngineCoreOutput]:
        """The merged outputs (then none are kept)."""
        out = list(self._by_rid.values())
        self._by_rid = {}
        self._finished = set()
        return out


def _kv_capacity(ready: dict[str, Any]) -> int | None:
    tokens = ready.get("kv_cache_size_tokens")
    if isinstance(tokens, int):
        return tokens
    blocks, size = ready.get("num_gpu_blocks"), ready.get("block_size")
    if isinstance(blocks, int) and isinstance(size, int) and blocks > 0:
        return blocks * size
    return None


#: ``zmq.SNDMORE`` as a plain int: ``send_multipart`` combines enum flags in Python per frame,
#: which costs more than the three sends.
_MORE = int(zmq.SNDMORE)


#: ``zmq.NOBLOCK``, ``zmq.EVENTS`` and ``zmq.POLLIN`` as plain ints (pyzmq converts an enum
#: argument or result on each call).
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


def _read_waiting(sock: zmq.Socket, most: int) -> list[list[Any]]:
    """Up to ``most`` messages waiting on ``sock``, each as its frames' buffers. The socket is
    asked (``EVENTS``) whether one waits at all, which is cheap when its descriptor woke the
    reader for none; then messages are read until none is left (``Again``: a read that finds
    none also clears the descriptor's signal, as ``EVENTS`` does). A frame's ``more`` flag says
    where its message ends. ``recv_multipart`` and an ``EVENTS`` question before each message
    ask the socket once a frame and once a message (a system call and an enum conversion each
    in pyzmq), which costs more than the reads."""
    waiting: list[list[Any]] = []
    if not sock.getsockopt(_EVENTS) & _POLLIN:
        return waiting
    recv = sock.recv
    try:
        while len(waiting) < most:
            frame = recv(_NOBLOCK, copy=False)
            frames = [frame.buffer]
            while frame.more:  # (a message arrives whole: its other frames are there)
                frame = recv(_NOBLOCK, copy=False)
                frames.append(frame.buffer)
            waiting.append(frames)
    except zmq.Again:
        pass
    return waiting


def _send(sock: zmq.Socket, identity: bytes, kind: bytes, payload: bytes) -> None:
    """One ``[identity, type, payload]`` message on a ROUTER (``send_multipart``'s frames: an
    identity it cannot route fails on the first)."""
    sock.send(identity, _MORE)
    sock.send(kind, _MORE)
    sock.send(payload)


def _context() -> zmq.asyncio.Context:
    """The engine sockets' ZMQ context, its I/O thread under Linux's ``SCHED_BATCH`` policy
    (libzmq's ``ZMQ_THREAD_SCHED_POLICY``; where the policy does not exist, as it is): on a core
    it shares with the event loop, the thread's wake-ups (one per message sent or received) do
    not preempt the loop, so it runs when the loop waits or its turn comes, and moves every
    message queued by then in one go."""
    ctx = zmq.asyncio.Context()
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is not None:
        try:
            ctx.set(zmq.THREAD_SCHED_POLICY, policy)
        except (zmq.ZMQError, AttributeError) as exc:  # (a libzmq without the option)
            log.debug("the ZMQ I/O thread keeps the default scheduling policy: %s", exc)
    return ctx


def _tune(sock: zmq.Socket) -> None:
    """vLLM's settings for these sockets (unbounded queues), and no linger on close."""
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)


def _handshake_message(frames: list[bytes]) -> tuple[bytes, dict[str, Any]] | None:
    """A handshake ROUTER's message as ``(identity, HELLO or READY)``; anything else (another
    number of frames, a payload that does not decode) is logged and dropped (None)."""
    if len(frames) != 2:
        log.warning(
            "a handshake message of %d frames from %r: dropped", len(frames) - 1, frames[0][:32]
        )
        return None
    identity, payload = frames
    try:
        return identity, wire.decode_handshake(payload)
    except CodecError as exc:
        log.warning("a bad handshake message from %r: %s", identity[:32], exc)
        return None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_of(address: str) -> str:
    if not address.startswith("tcp://") or ":" not in address[6:]:
        raise ValueError(f"the handshake address must be tcp://HOST:PORT, got {address!r}")
    return address[6:].rsplit(":", 1)[0]
