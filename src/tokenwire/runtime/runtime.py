"""``Runtime``: the engine-facing half of the server.

One tokenizer, one engine and the ``DetokShard``: requests are registered with the shard (one
``EgressSink`` per choice) and submitted to the engine; the engine's frames come back on the event
loop, through the frame codec into the shard, which fills the sinks the HTTP handlers drain.
Every path that ends a request (client gone, stop string, engine error, engine death) ends it in
the shard, the sink and the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import itertools
import logging
import signal
import time
from typing import Any

from tokenwire.context_length import max_prompt_chars
from tokenwire.detok.tables import decode_table
from tokenwire.engine import (
    Engine,
    EngineRequest,
    RequestTimes,
    check_grammar,
    supported_request_fields,
    supports_stop_token_sequences,
    supports_structured_outputs,
)
from tokenwire.engine.pooling import (
    Pooled,
    PoolingRequest,
    engine_pooling_tasks,
    engine_supported_tasks,
)
from tokenwire.messages.egress import EgressSink
from tokenwire.messages.errors import (
    InternalError,
    OverloadedError,
    QueueFullError,
    TokenwireError,
    ValidationError,
)
from tokenwire.messages.finish_reason import FinishReason
from tokenwire.messages.frames import (
    EGRESS_TAG_BATCH,
    EGRESS_TAG_ERROR,
    EGRESS_TAG_RESULT,
    Decoded,
    decode_batch_frame,
    decode_error_frame,
    decode_result_frame,
)
from tokenwire.multimodal.media import MissingExtraError
from tokenwire.pooling.tasks import PoolingModel, choose_pooling_task
from tokenwire.runtime.admission import Admission
from tokenwire.runtime.config import RuntimeConfig
from tokenwire.runtime.fleet_metrics import FleetMetrics
from tokenwire.runtime.media import MediaPool, extra_installed
from tokenwire.runtime.metrics import EngineCollector, EngineSeries, Metrics, SharedMetrics
from tokenwire.runtime.models import ServedModels
from tokenwire.runtime.plan import Plan
from tokenwire.runtime.pooling import PoolingJob, PoolingPlan, PoolingRequests
from tokenwire.shard import DetokShard
from tokenwire.tokenizer import Tokenizer

__all__ = ["MAX_GATHERED_LOGPROBS", "Runtime", "check_gathered_logprobs"]

log = logging.getLogger("tokenwire.runtime")

#: The ``SamplingParams`` fields a grammar comes in (a refusal naming one is renamed to the
#: request's own field).
_GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
#: Seconds between snapshots of a worker's metrics (several API-server processes).
_METRICS_PERIOD = 1.0
#: Seconds between checks that the engine is still alive.
_WATCHDOG_PERIOD = 0.5


class Runtime:
    """Ties one tokenizer, one engine and the detok shard together (event-loop thread only)."""

    def __init__(self, tokenizer: Tokenizer, engine: Engine, config: RuntimeConfig) -> None:
        self.tokenizer = tokenizer
        self.engine = engine
        self.config = config
        #: The server's features, with what the engine can do.
        self.features = dataclasses.replace(
            config.features,
            structured_outputs=supports_structured_outputs(engine),
            engine_fields=supported_request_fields(engine),
        )
        #: The model names and LoRA adapters clients may name.
        self.models = ServedModels(
            [config.model_name, *config.served_model_names],
            config.lora_modules,
            root=config.model_root,
        )
        # The server decodes a generated padding id as no text, as stock vLLM does.
        self.shard = DetokShard(
            self._abort_in_engine, max_stall=config.stall_timeout, padding="empty"
        )
        #: Pooling inputs in flight (embeddings, scores...), and what the model pools: its
        #: tasks and the one it runs (known once the engine has started).
        self.pooling = PoolingRequests(self._abort_in_engine)
        self.supported_tasks: tuple[str, ...] = engine_supported_tasks(engine)
        self.pooling_task: str | None = None
        self.pooling_model: PoolingModel = config.pooling_model or PoolingModel()
        self.metrics = Metrics(config.model_name, tokenizer.max_model_len)
        #: The waiting queue in front of the engines.
        self.admission = Admission(
            config.max_concurrent_requests,
            lambda: len(self.shard) + len(self.pooling),
            max_waiting=config.max_waiting_requests,
            timeout=config.queue_timeout,
        )
        #: Per-choice callbacks of requests whose usage is counted as they finish (API keys'
        #: token quotas).
        self._on_finish: dict[str, Any] = {}
        collector = EngineCollector(
            engine, self.metrics.registry, config.model_name, self.admission
        )
        self.fleet_metrics = FleetMetrics(
            self.metrics.registry,
            engine,
            self.admission,
            config.model_name,
            lambda rank: self.metrics.engine(rank).generation_tokens._value.get(),
        )
        self._engine_of = getattr(engine, "engine_of", None)
        self._pop_times = getattr(engine, "pop_request_times", None)
        #: Set when several API-server processes share one /metrics.
        self.shared_metrics = (
            SharedMetrics(
                self.metrics.registry,
                config.metrics_dir,
                config.worker_index,
                collector.stats_taken_at,
            )
            if config.metrics_dir
            else None
        )
        self._metrics_task: asyncio.Task[None] | None = None
        self._ids = itertools.count()
        self._controls: dict[str, asyncio.Future[bytes]] = {}
        self._watchdog: asyncio.Task[None] | None = None
        #: Set once a graceful shutdown begins: new requests are refused.
        self.draining = False
        #: The media workers (a multimodal model only; started with the runtime).
        self.media_pool: MediaPool | None = None

    # ---- engine side -----------------------------------------------------------------------------

    async def start(self) -> None:
        decode_table(self.tokenizer, True)  # build the fast tables before the first request
        max_prompt_chars(self.tokenizer)  # (a vocabulary scan)
        decode_table(self.tokenizer, False)
        await self.engine.start(self.on_output)
        if self.features.media is not None and self.media_pool is None and extra_installed():
            self.media_pool = MediaPool(self.features.media, self.config.media_options)
        if self.models.adapters and getattr(self.engine, "supports_lora", True) is False:
            await self.engine.close()
            raise RuntimeError(
                "LoRA adapters are configured but the engine was not started with LoRA enabled "
                "(vLLM: --enable-lora)"
            )
        for e in getattr(self.engine, "engines", None) or ():
            self.metrics.engine(int(e["rank"]))  # every engine's series from the first scrape
        try:
            self._learn_tasks()
        except RuntimeError:
            await self.engine.close()
            raise
        engine_len = getattr(self.engine, "max_model_len", None)
        if isinstance(engine_len, int) and engine_len > 0:
            # The engine's context length is the one that holds (vLLM's auto-fitted one).
            current = self.tokenizer.max_model_len
            self.tokenizer.max_model_len = min(current, engine_len) if current else engine_len
        # Everything loaded so far (vocabulary tables: millions of objects) lives as long as the
        # server: keep the cyclic garbage collector from walking it on every full collection.
        gc.collect()
        gc.freeze()
        self._watchdog = asyncio.get_running_loop().create_task(self._watch_engine())
        if self.shared_metrics is not None:
            # A snapshot at once: a sibling's scrape finds this worker (its pid) from the start.
            self.shared_metrics.write()
            loop = asyncio.get_running_loop()
            self._metrics_task = loop.create_task(self._share_metrics())
            # A sibling serving a scrape asks for this worker's counts as of now.
            loop.add_signal_handler(signal.SIGUSR1, self.shared_metrics.write)

    def _learn_tasks(self) -> None:
        """What the started engine runs: its tasks, and the pooling task it serves (the pooler
        config's, else vLLM's choice among those it supports)."""
        self.supported_tasks = engine_supported_tasks(self.engine)
        own = getattr(self.engine, "pooling_model", None)
        if isinstance(own, PoolingModel):
            self.pooling_model = own
        tasks = engine_pooling_tasks(self.engine)
        configured = self.config.pooler_config.get("task")
        try:
            self.pooling_task = choose_pooling_task(tasks, self.pooling_model, configured)
        except ValueError as exc:
            raise RuntimeError(f"--pooler-config: {exc}") from None
        if self.pooling_task is not None:
            log.info("pooling task: %s (the engine supports %s)", self.pooling_task, tasks)

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._metrics_task is not None:
            self._metrics_task.cancel()
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
        await self.engine.close()
        if self.media_pool is not None:
            self.media_pool.close()
        self._fail_all(QueueFullError("the server is shutting down"))
        if self.shared_metrics is not None:
            with contextlib.suppress(OSError):
                self.shared_metrics.write()  # the last counts are not lost

    async def _share_metrics(self) -> None:
        """Keep this worker's metrics snapshot fresh for the others' scrapes."""
        assert self.shared_metrics is not None
        while True:
            await asyncio.sleep(_METRICS_PERIOD)
            try:
                self.shared_metrics.write()
            except OSError as exc:
                log.warning("cannot write the metrics snapshot: %s", exc)

    async def _watch_engine(self) -> None:
        """Should the engine die without a word, no request in flight (nor waiting for a
        place) is left waiting."""
        while True:
            await asyncio.sleep(_WATCHDOG_PERIOD)
            if not self.engine.alive and (
                len(self.shard) or len(self.pooling) or self.admission.waiting
            ):
                self._fail_all(QueueFullError("the engine is not running"))

    def _fail_all(self, error: TokenwireError) -> None:
        self.admission.fail_all(error)
        for rid in self.shard.live_rids():
            self.shard.fail(rid, error)
            self._abort_in_engine(rid)
        for rid in self.pooling.live_rids():
            self.pooling.fail(rid, error)
        self._on_finish.clear()
        self.metrics.in_flight.set(len(self.shard))

    async def drain(self, timeout: float) -> None:
        """Shutting down: refuse new requests (503), give those in flight up to ``timeout``
        seconds to finish, then end the rest with a 503 error their clients can read."""
        self.draining = True
        self.admission.fail_all(QueueFullError("the server is shutting down"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (len(self.shard) or len(self.pooling)) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if len(self.shard) or len(self.pooling):
            left = len(self.shard) + len(self.pooling)
            log.warning("shutting down: ending %d requests still in flight", left)
            self._fail_all(QueueFullError("the server is shutting down"))

    def expect_control(self, rid: str) -> asyncio.Future[bytes]:
        """A future for the payload of the engine's result frame for control request ``rid``."""
        fut = asyncio.get_running_loop().create_future()
        self._controls[rid] = fut
        return fut

    def _abort_in_engine(self, rid: str) -> None:
        with contextlib.suppress(Exception):
            self.engine.abort(rid)
        if self.admission.waiting:  # (the shard gave a request up: its place is free)
            asyncio.get_running_loop().call_soon(self.admission.poke)

    def on_output(self, frame: bytes | Decoded) -> None:
        """One frame from the engine, or one step an engine decoded from its own wire format."""
        if isinstance(frame, Pooled):
            self.pooling.on_pooled(frame)
            if self.admission.waiting:
                self.admission.poke()
            return
        if isinstance(frame, Decoded):
            t0 = time.perf_counter()
            self.shard.on_frame(frame)
            series = self.metrics.engine(frame.engine)
            series.egress_step.observe(time.perf_counter() - t0)
            series.generation_tokens.inc(len(frame.token_ids))
            if self.admission.waiting:
                self.admission.poke()
            return
        if not frame:
            return
        tag = frame[0]
        if tag == EGRESS_TAG_BATCH:
            t0 = time.perf_counter()
            decoded = decode_batch_frame(frame)
            self.shard.on_frame(decoded)
            series = self.metrics.engine(decoded.engine)
            series.egress_step.observe(time.perf_counter() - t0)
            if decoded.ok:
                series.generation_tokens.inc(len(decoded.token_ids))
        elif tag == EGRESS_TAG_ERROR:
            try:
                rid, message = decode_error_frame(frame)
            except TokenwireError:
                log.error("malformed engine error frame")
                return
            if rid in self.pooling:
                self.pooling.fail(rid, InternalError(f"engine: {message}"))
            else:
                self.shard.fail(rid, InternalError(f"engine: {message}"))
                self._on_finish.pop(rid, None)
        elif tag == EGRESS_TAG_RESULT:
            with contextlib.suppress(TokenwireError):
                rid, payload = decode_result_frame(frame)
                fut = self._controls.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(payload)
        else:
            log.error("engine frame with unknown tag %d", tag)
        if self.admission.waiting:
            self.admission.poke()

    # ---- request side ----------------------------------------------------------------------------

    async def check_grammar(self, plan: Plan, client: str | None = None) -> None:
        """Before ``submit``: the engine compiles the request's grammar (off the event loop, in
        ``client``'s turn); one its grammar library refuses is a 400 naming the request's
        field."""
        try:
            await check_grammar(self.engine, plan.params, client)
        except ValidationError as exc:
            field = plan.grammar_field
            if field is None or exc.param not in _GRAMMAR_FIELDS or field == exc.param:
                raise
            raise ValidationError(exc.detail.replace(exc.param, field, 1), param=field) from None

    async def prepare_media(self, plan: Plan) -> None:
        """Before ``submit``: a plan's media fetched and processed in the media workers (off the
        event loop), its prompts' placeholders expanded; a text-only server refuses media."""
        if not plan.media or not any(plan.media):
            return
        if self.media_pool is None:
            if self.features.media is not None:
                raise MissingExtraError("media input")
            raise ValidationError("this model is text-only; it does not accept media input")
        await self.media_pool.prepare(plan)
        limit = self.tokenizer.max_model_len
        field = "messages" if plan.route == "chat" else "prompt"
        for ids in plan.prompts:
            if limit and len(ids) >= limit:
                raise ValidationError(
                    f"the prompt with its media is {len(ids)} tokens, over the model's context "
                    f"length of {limit}",
                    param=field,
                )
            wanted = plan.params.max_new_tokens
            if limit and wanted is not None and len(ids) + wanted > limit:
                raise ValidationError(
                    f"the prompt with its media ({len(ids)} tokens) plus {wanted} output tokens "
                    f"is over the model's context length of {limit}",
                    param="max_tokens",
                )

    async def admit(
        self,
        plan: Plan,
        gone: asyncio.Future[None] | None = None,
        on_finish: Any = None,
    ) -> list[tuple[str, int, EgressSink]]:
        """``submit`` once the waiting queue lets ``plan`` in (``runtime.admission``): 429 when
        it cannot wait, 503 when it waited too long or no engine serves, ``ClientDisconnected``
        when ``gone`` (the client's disconnect) comes first. ``on_finish(done)`` hears of each
        choice that finishes."""
        self._check_serving()
        self._check_plan(plan)
        await self.admission.enter(plan.choices, plan.priority, gone)
        try:
            self._check_serving()
            out = self._submit(plan)
        finally:
            self.admission.entered(plan.choices)
        if on_finish is not None:
            for rid, _, _ in out:
                self._on_finish[rid] = on_finish
        return out

    def forget_finish(self, subs: list[tuple[str, int, EgressSink]]) -> None:
        """No more ``on_finish`` for these choices (their response is over)."""
        for rid, _, _ in subs:
            self._on_finish.pop(rid, None)

    def _check_serving(self) -> None:
        if not self.engine.alive:
            raise QueueFullError("the engine is not running")
        if self.draining:
            raise QueueFullError("the server is shutting down")
        if "generate" not in self.supported_tasks:
            raise ValidationError(
                f"this model runs the {self.pooling_task or 'no'} pooling task: it does not "
                "generate text (use its pooling routes: /v1/embeddings, /pooling, /score...)",
                param="model",
            )

    def submit(self, plan: Plan, *, past_limit: bool = False) -> list[tuple[str, int, EgressSink]]:
        """Register and submit every choice of ``plan`` now: ``(rid, prompt index, sink)``
        each (429 when the places are taken, whoever waits for them; ``past_limit``: a probe's
        request, which goes in whatever the load)."""
        self._check_serving()
        self._check_plan(plan)
        choices = plan.choices
        limit = self.config.max_concurrent_requests
        taken = len(self.shard) + len(self.pooling) + self.admission.reserved
        if (self.admission.waiting or taken + choices > limit) and not past_limit:
            raise OverloadedError(f"too many requests in flight (limit {limit})")
        return self._submit(plan)

    def _check_plan(self, plan: Plan) -> None:
        if plan.beam is not None:
            return
        if plan.media and any(plan.media) and plan.mm_features is None:
            raise RuntimeError("a plan with media was submitted before prepare_media")
        if not plan.stream:
            check_gathered_logprobs(plan, self.tokenizer.max_model_len)

    def _submit(self, plan: Plan) -> list[tuple[str, int, EgressSink]]:
        if plan.beam is not None:  # (the frontend's beam search submits each step itself)
            return []
        out: list[tuple[str, int, EgressSink]] = []
        try:
            for p, prompt in enumerate(plan.prompts):
                for i in range(plan.n):
                    if plan.rids is not None:
                        rid = plan.rids[p]
                        if rid in self.shard:
                            raise ValidationError(f"rid {rid!r} is already in use", param="rid")
                    else:
                        # (plan.id may be the client's: skip ids a /generate rid holds)
                        rid = f"{plan.id}-{next(self._ids)}"
                        while rid in self.shard:
                            rid = f"{plan.id}-{next(self._ids)}"
                    params = plan.params
                    if plan.n > 1 and params.sampling_seed is not None:
                        # n samples from one seed: each choice its own, reproducible, stream.
                        params = dataclasses.replace(params, sampling_seed=params.sampling_seed + i)
                    sink = EgressSink(self.config.sink_capacity)
                    self.shard.register(rid, sink, self.tokenizer, prompt, params)
                    out.append((rid, p, sink))
                    engine_params = params.for_engine(
                        stop_token_sequences=supports_stop_token_sequences(self.engine)
                    )
                    self.engine.submit(
                        EngineRequest(
                            rid,
                            prompt,
                            engine_params,
                            plan.stream,
                            priority=plan.priority,
                            cache_salt=plan.cache_salt,
                            lora=plan.lora,
                            data_parallel_rank=plan.data_parallel_rank,
                            session_id=plan.session_id,
                            mm_features=(tuple(plan.mm_features[p]) if plan.mm_features else None),
                        )
                    )
        except BaseException:
            for rid, _, sink in out:
                self.abort(rid, sink)
            raise
        series = self.metrics.engine(self.engine_of(out[0][0]) if out else 0)
        series.prompt_tokens.inc(plan.prompt_tokens)
        series.params_n.observe(plan.n)
        max_tokens = plan.params.max_new_tokens
        if max_tokens is not None:
            for _ in plan.prompts:
                series.params_max_tokens.observe(max_tokens)
                series.max_num_generation_tokens.observe(max_tokens)
        self.metrics.in_flight.set(len(self.shard))
        return out

    def submit_pooling(self, plan: PoolingPlan) -> PoolingJob:
        """Submit every input of ``plan`` (one engine request each, at once: the engine batches
        them); the job's future gets their outputs."""
        if not self.engine.alive:
            raise QueueFullError("the engine is not running")
        if self.draining:
            raise QueueFullError("the server is shutting down")
        count = len(plan.prompts)
        taken = len(self.shard) + len(self.pooling) + self.admission.reserved
        if taken + count > self.config.max_concurrent_requests:
            raise OverloadedError(
                f"too many requests in flight (limit {self.config.max_concurrent_requests})"
            )
        submit = getattr(self.engine, "submit_pooling", None)
        if submit is None:
            raise ValidationError("this engine does not pool", param="model")
        rids = []
        for _ in range(count):
            rid = f"{plan.id}-{next(self._ids)}"
            while rid in self.pooling or rid in self.shard:
                rid = f"{plan.id}-{next(self._ids)}"
            rids.append(rid)
        job = PoolingJob(plan, rids)
        self.pooling.add(job)
        try:
            for i, (rid, prompt) in enumerate(zip(rids, plan.prompts)):
                submit(
                    PoolingRequest(
                        rid,
                        prompt,
                        plan.params_of(i),
                        priority=plan.priority,
                        cache_salt=plan.cache_salt,
                        lora=plan.lora,
                    )
                )
        except BaseException:
            self.pooling.drop(job)
            raise
        series = self.metrics.engine(self.engine_of(rids[0]) if rids else 0)
        series.prompt_tokens.inc(plan.prompt_tokens)
        self.metrics.in_flight.set(len(self.shard) + len(self.pooling))
        return job

    def pooling_done(self, job: PoolingJob, ok: bool) -> None:
        """A pooling job is over (answered, failed, or given up: what is left of it in flight
        is dropped, here and in the engine); its inputs counted as finished requests."""
        self.pooling.drop(job)
        series = self.metrics.engine(job.engine)
        series.finished("stop" if ok else "abort", len(job.plan.prompts))
        for ids in job.plan.prompts:
            series.request_prompt_tokens.observe(len(ids))
        self.metrics.in_flight.set(len(self.shard) + len(self.pooling))

    def engine_of(self, rid: str) -> int:
        """Which engine (data-parallel rank) has request ``rid`` (0 for a single engine)."""
        return self._engine_of(rid) if self._engine_of is not None else 0

    def finished_request(self, done: Any, series: EngineSeries) -> RequestTimes | None:
        """A choice's final item (``Done``): its outcome and sizes counted, and its phases as
        the engine timed them (returned; None when the engine does not say)."""
        times = self._pop_times(done.rid) if self._pop_times is not None else None
        if self._on_finish:
            hook = self._on_finish.pop(done.rid, None)
            if hook is not None:
                hook(done)
        if times is not None and times.engine != series.label:
            series = self.metrics.engine(times.engine)
        fr = done.finish_reason
        series.finished((fr.openai_finish_reason if fr is not None else None) or "unknown")
        self.fleet_metrics.finished(series.label, done.prompt_tokens, done.cached_tokens)
        series.request_prompt_tokens.observe(done.prompt_tokens)
        series.request_generation_tokens.observe(done.completion_tokens)
        cached = max(done.cached_tokens, 0)
        series.prefill_kv_computed.observe(max(done.prompt_tokens - cached, 0))
        if cached:
            series.prompt_tokens_cached.inc(cached)
        if times is not None:
            series.queue.observe(max(0.0, times.scheduled - times.queued))
            series.prefill.observe(max(0.0, times.first_token - times.scheduled))
            decode = max(0.0, times.last_token - times.first_token)
            series.decode.observe(decode)
            series.inference.observe(max(0.0, times.last_token - times.scheduled))
            steps = done.completion_tokens - 1
            series.time_per_output_token.observe(decode / steps if steps > 0 else 0.0)
        return times

    def abort(self, rid: str, sink: EgressSink | None = None) -> None:
        """Give a request up (client gone): shard state and engine slot released at once."""
        self.shard.abort(rid)
        if sink is not None:
            sink.close()
        if self._on_finish:
            self._on_finish.pop(rid, None)
        self.metrics.in_flight.set(len(self.shard) + len(self.pooling))
        if self.admission.waiting:
            self.admission.poke()

    def abort_requests(self, rid: str, *, abort_all: bool = False) -> int:
        """SGLang's ``/abort_request``: end request ``rid`` (every choice of it: engine ids
        ``rid`` and ``rid-*``), or every request, with finish reason ``abort``; its client gets
        that final answer. Returns how many engine requests ended."""
        prefix = rid + "-"
        hits = [r for r in self.shard.live_rids() if abort_all or r == rid or r.startswith(prefix)]
        reason = FinishReason.abort("aborted by /abort_request", status_code=None)
        ended = sum(self.shard.end_aborted(r, reason) for r in hits)
        self.metrics.in_flight.set(len(self.shard))
        if self.admission.waiting:
            self.admission.poke()
        return ended

    def finished(self) -> None:
        self.metrics.in_flight.set(len(self.shard) + len(self.pooling))
        if self.admission.waiting:
            self.admission.poke()


#: Most logprob entries (positions times one plus the top alternatives) a response that is not
#: streamed may gather before it is written: past it the request is refused (a streamed one
#: sends them as they come, and keeps none). A few hundred MB at the limit (completions: 420,000
#: entries made a 12 MB body and 28 MB of RSS).
MAX_GATHERED_LOGPROBS = 4 << 20


def check_gathered_logprobs(plan: Plan, context: int | None) -> None:
    """Refuse a request whose whole response would hold more than ``MAX_GATHERED_LOGPROBS``
    logprob entries: choices times ``max_tokens`` (the rest of the context when unset) times one
    plus the top alternatives, and the prompts' when ``prompt_logprobs`` is asked."""
    params = plan.params
    if params.logprobs is None and params.prompt_logprobs is None:
        return
    longest = max((len(p) for p in plan.prompts), default=0)
    room = params.max_new_tokens
    if room is None:
        room = max(0, (context or 0) - longest) or 1 << 20
    total = 0
    if params.logprobs is not None:
        total += plan.choices * room * (1 + params.logprobs)
    if params.prompt_logprobs is not None:
        total += sum(len(p) for p in plan.prompts) * plan.n * (1 + params.prompt_logprobs)
    if total > MAX_GATHERED_LOGPROBS:
        raise ValidationError(
            f"this response would gather up to {total} logprob entries (choices {plan.choices} "
            f"x max_tokens {room} x (1 + top logprobs {params.logprobs or 0}), with the "
            f"prompt's): more than the {MAX_GATHERED_LOGPROBS} a response that is not streamed "
            "may hold; stream it, or ask for fewer choices, tokens or top logprobs",
            param="logprobs",
        )
