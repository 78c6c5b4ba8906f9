"""Where a streamed token's CPU time goes in ``tokenwire serve --engine vllm``, stage by stage.

    python bench/breakdown.py                       # completions and chat, C = 1, 8, 64, 256
    WORKLOADS=chat CONCURRENCY=64 python bench/breakdown.py
    LIVE=1 python bench/breakdown.py                # + the live server's total (needs the
                                                    #   vLLM environment: scripts/vllm_cpu_env.py)

The stages run in this process, on tokenwire's own objects, exactly as the server runs them over
a vLLM engine: a ``VllmEngine`` (its input socket a real ZMQ ROUTER with an engine's DEALER
connected), the ``Runtime`` with its shard, and per request the route's parser, its
``OpenAIStreamer`` and a ``DirectStream`` writing through a ``BodyWriter`` to a real TCP
connection's asyncio transport (the kernel's send is in the ``write`` stage). Every engine step
is a vLLM ``EngineCoreOutputs`` message (all C requests, one token each, random plain ids, the
scheduler stats an engine sends) that travels a real ZMQ PUSH/PULL pair over TCP. Each stage is
this thread's CPU time (``time.thread_time_ns``), per streamed token:

- ``recv``: ``recv_multipart`` of the step's message;
- ``decode``: ``protocol.decode_outputs`` (msgspec into ``EngineCoreOutputs``);
- ``columns``: ``protocol.to_batch`` and the engine's bookkeeping (``VllmEngine.on_message``
  less ``decode`` and less what it hands to the runtime);
- ``shard``: ``Runtime.on_output``: the shard's step (detokenization, stops, hold-back),
  delivery into the sinks, the step's metrics;
- ``wake-ups``: the event loop callbacks that hand each sink's items to its ``DirectStream``
  (the notifier, the rest, ``drain``'s ``Frame``) less the three below;
- ``parsers``: the reasoning (and tool-call) parsers (``ChoiceOutput.delta`` / ``final``);
- ``format``: ``OpenAIStreamer.feed`` less the parsers (each chunk's JSON, the final chunk,
  usage, the finish's metrics);
- ``write``: ``BodyWriter.write`` (chunk framing, ``transport.write``, the send syscall).

Intake, per request: ``body`` (JSON decode and the route's checks into a ``Plan``, less the two
next), ``template`` (``render_conversation``), ``tokenize`` (``encode_within``), ``submit``
(``Runtime.submit``: shard registration, sampling params, the ADD's encoding and its ZMQ send),
``start`` (the streamer, its head, the ``DirectStream``), and ``end`` (after the last chunk: the
stream's close, the sink's detach). ``per token`` spreads intake over the request's tokens.

``BASELINE=DIR`` runs another tree's ``src`` (``DIR``) in the same rounds, alternating;
``COMPILED=1`` runs the installed tokenwire (this Python's: a compiled build, ``pip install .``)
compiled and as plain Python (``TOKENWIRE_PURE_PYTHON=1``), alternating.

With ``LIVE=1`` the same workload runs against a live ``tokenwire serve --engine vllm`` over
``tokenwire mock-engine`` as ``bench/frontend.py`` runs it (pinned to one core, the mock and the
load generator to the other), and ``rest`` is the live server's CPU per token (all threads) less
the in-process total: the HTTP server (uvicorn's parsing, the ASGI app, response start and end,
connections), receiving on sockets with the event loop's polling, and the ZMQ I/O thread.

Environment: WORKLOADS=completions,chat, CONCURRENCY=1,8,64,256, TOKENS=128, ROUNDS=3 (the
median of each stage over rounds), LIVE=0, BASELINE, COMPILED, JSON=path (the rows as JSON
lines).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import time
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import zmq

HERE = Path(__file__).resolve().parent
# bench/ after the standard library (bench/http.py is no ``http``)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from tokenwire import Tokenizer  # noqa: E402
from tokenwire.engine.vllm import VllmEngine, VllmEngineConfig  # noqa: E402
from tokenwire.engine.vllm import client as vllm_client  # noqa: E402
from tokenwire.engine.vllm import protocol as wire  # noqa: E402
from tokenwire.messages.errors import CodecError  # noqa: E402
from tokenwire.messages.frames import encode_error_frame  # noqa: E402
from tokenwire.parsers import output as output_mod  # noqa: E402
from tokenwire.runtime import Features  # noqa: E402
from tokenwire.server import ServerConfig, create_app  # noqa: E402
from tokenwire.server import limits as limits_mod  # noqa: E402
from tokenwire.server.direct_stream import DirectStream  # noqa: E402
from tokenwire.server.openai import chat_output, parse  # noqa: E402
from tokenwire.server.openai.stream import OpenAIStreamer  # noqa: E402
from tokenwire.server.serving import BodyWriter  # noqa: E402

TOKENS = int(os.environ.get("TOKENS", "128"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
STOP = "\n\nHuman:"
CHAT_PROMPT = "Benchmark prompt: tell me a story about a fox."
PROMPT = "Benchmark prompt: tell me a story about a fox."
NAME = "tiny"
STREAM_STAGES = ("recv", "decode", "columns", "shard", "wake-ups", "parsers", "format", "write")
INTAKE_STAGES = ("body", "template", "tokenize", "submit", "start", "end")

#: This thread's CPU time (a system call: used around a step's or a request's stages) ...
_now = time.thread_time_ns
#: ``wrapper_cost()``, measured at the start.
WRAPPER_NS = 0.0
#: ... and the wall clock (cheap: around each stream's calls within a step, scaled to CPU time
#: by the step's own CPU / wall ratio, since on a shared machine wall time includes waits).
_wall = time.perf_counter_ns


class Clock:
    """Stage totals in ns: ``ns`` of CPU time, ``wall`` of per-call wall time, ``calls``."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.wall: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)

    def timed(self, stage: str, fn: Any) -> Any:
        """``fn``, its wall time counted under ``stage`` (nested timed calls are counted in
        both: the caller subtracts)."""
        wall = self.wall
        calls = self.calls

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = _wall()
            try:
                return fn(*args, **kwargs)
            finally:
                wall[stage] += _wall() - t0
                calls[stage] += 1

        return wrapper

    def timed_cpu(self, stage: str, fn: Any) -> Any:
        """``fn``, its CPU time counted under ``stage`` (for calls made once per request)."""
        ns = self.ns

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = _now()
            try:
                return fn(*args, **kwargs)
            finally:
                ns[stage] += _now() - t0

        return wrapper


def wrapper_cost() -> float:
    """CPU ns one ``Clock.timed`` wrapper adds to a call (subtracted from the stage around)."""
    clock = Clock()
    f = clock.timed("x", lambda: None)
    g = lambda: None  # noqa: E731
    n = 200_000
    t0 = _now()
    for _ in range(n):
        f()
    t1 = _now()
    for _ in range(n):
        g()
    t2 = _now()
    return max(0.0, ((t1 - t0) - (t2 - t1)) / n)


def _on_message(engine: Any, frames: list[Any]) -> None:
    """``VllmEngine.on_message`` for a baseline tree from before it (the body of its reader's
    loop then, the same steps)."""
    output = engine._output
    buf = frames[0]
    try:
        msg = wire.decode_outputs(buf)
    except CodecError as exc:
        engine._malformed(buf, exc)
        return
    core = engine._by_rank.get(msg.engine_index)
    if core is not None:
        core.heard = time.monotonic()
    if msg.outputs:
        for o in msg.outputs:
            if o.prefill_stats is not None:
                engine._prefilled(o.request_id, o.prefill_stats)
        batch = wire.to_batch(
            msg.outputs, engine._prompt_lens, engine._max_tokens, engine._logprobs or None, frames
        )
        if engine._cached:
            get = engine._cached.get
            batch.decoded.cached_tokens = [get(r, 0) for r in batch.decoded.rids]
        for rid in batch.finished:
            engine._forget(rid)
        engine._note_times(msg, batch.finished)
        output(batch.decoded)
        for rid, message in batch.errors:
            output(encode_error_frame(rid, message))
    if msg.scheduler_stats != wire._NIL:
        engine._stats(msg)


def body_of(workload: str, tokens: int) -> dict[str, Any]:
    """The request body ``bench/frontend.py`` sends."""
    usage = {"stream_options": {"include_usage": True}}
    common = {"model": NAME, "max_tokens": tokens, "ignore_eos": True, "stream": True, **usage}
    if workload == "chat":
        return {"messages": [{"role": "user", "content": CHAT_PROMPT}], "stop": [STOP], **common}
    return {"prompt": PROMPT, **common}


def _tcp_pairs(n: int) -> list[tuple[socket.socket, socket.socket]]:
    """``n`` connected loopback TCP pairs (server side, client side)."""
    with socket.create_server(("127.0.0.1", 0), backlog=n) as listener:
        port = listener.getsockname()[1]
        out = []
        for _ in range(n):
            client = socket.create_connection(("127.0.0.1", port))
            server, _ = listener.accept()
            server.setblocking(False)
            out.append((server, client))
    return out


class _Drain(asyncio.Protocol):
    pass


class _Cycle:
    """What ``BodyWriter`` reads of uvicorn's request cycle."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.flow = types.SimpleNamespace(write_paused=False)
        self.disconnected = False
        self.response_complete = False


async def one_round(
    workload: str, c: int, tokens: int, tok: Tokenizer, features: Features, seed: int
) -> tuple[dict[str, float], dict[str, float], int]:
    """One round: ``c`` requests of ``tokens`` tokens each, stage by stage. Returns the streamed
    stages (µs per token), the intake stages (µs per request), and the bytes written."""
    loop = asyncio.get_running_loop()
    clock = Clock()
    ns = clock.ns
    ctx = zmq.Context()
    # The engine side of the input socket: a DEALER with rank 0's identity, as vLLM's engine.
    engine = VllmEngine(tok, VllmEngineConfig())
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.SNDHWM, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, wire.engine_identity(0))
    dealer.setsockopt(zmq.RCVHWM, 0)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send(b"ready")
    router.recv_multipart()  # (connected both ways)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 0)
    out_port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{out_port}")
    pairs = _tcp_pairs(c)
    app = create_app(
        tok,
        engine,
        ServerConfig(model_name=NAME, features=features, max_concurrent_requests=1 << 20),
    )
    rt = app.runtime
    # The engine as started (the handshake's result), its reader left out: this loop reads.
    engine._input_sync = router
    core = vllm_client._Core(0, wire.engine_identity(0))
    engine._cores = [core]
    engine._by_rank = {0: core}
    engine._alive = True
    engine.max_model_len = 16384
    tok.max_model_len = 16384
    captured: list[Any] = []
    on_output = rt.on_output

    def timed_output(frame: Any) -> None:
        t0 = _now()
        on_output(frame)
        ns["shard"] += _now() - t0

    engine._output = timed_output

    # Stage timers on the functions the code looks up at call time.
    saved = {
        (parse, "render_conversation"): parse.render_conversation,
        (output_mod.OutputParser, "feed_plain"): getattr(
            output_mod.OutputParser, "feed_plain", None
        ),
        (OpenAIStreamer, "feed_steps"): getattr(OpenAIStreamer, "feed_steps", None),
        (parse, "encode_within"): parse.encode_within,
        (wire, "decode_outputs"): wire.decode_outputs,
        (chat_output.ChoiceOutput, "delta"): chat_output.ChoiceOutput.delta,
        (chat_output.ChoiceOutput, "final"): chat_output.ChoiceOutput.final,
        (OpenAIStreamer, "feed"): OpenAIStreamer.feed,
        (BodyWriter, "write"): BodyWriter.write,
    }
    parse.render_conversation = clock.timed_cpu("template", parse.render_conversation)
    parse.encode_within = clock.timed_cpu("tokenize", parse.encode_within)
    wire.decode_outputs = clock.timed_cpu("decode", wire.decode_outputs)
    chat_output.ChoiceOutput.delta = clock.timed("parsers", chat_output.ChoiceOutput.delta)
    chat_output.ChoiceOutput.final = clock.timed("parsers", chat_output.ChoiceOutput.final)
    OpenAIStreamer.feed = clock.timed("feed", OpenAIStreamer.feed)
    if saved[(OpenAIStreamer, "feed_steps")] is not None:  # (a baseline may not have them)
        OpenAIStreamer.feed_steps = clock.timed("feed", OpenAIStreamer.feed_steps)
    if saved[(output_mod.OutputParser, "feed_plain")] is not None:
        feed_plain = output_mod.OutputParser.feed_plain
        output_mod.OutputParser.feed_plain = clock.timed("parsers", feed_plain)
    BodyWriter.write = clock.timed("write", BodyWriter.write)
    on_message = getattr(engine, "on_message", None) or (lambda f: _on_message(engine, f))
    rows_written = 0
    transports = []
    cycles: list[_Cycle] = []  # (the writers hold them weakly)
    try:
        raw = json.dumps(body_of(workload, tokens)).encode()
        eos = tok.eos_token_ids
        streams = []
        rids = []
        for server_sock, _client in pairs:
            transport, _ = await loop.create_connection(_Drain, sock=server_sock)
            transports.append(transport)
        for k in range(c):
            t0 = _now()
            body = limits_mod.decode_json(raw)
            plan = (
                parse.parse_chat(body, tok, rt.models, features=rt.features)
                if (workload == "chat")
                else parse.parse_completion(body, tok, rt.models, features=rt.features)
            )
            t1 = _now()
            subs = rt.submit(plan)
            t2 = _now()
            streamer = OpenAIStreamer(rt, plan, subs, eos)
            cycle = _Cycle(transports[k])
            cycles.append(cycle)
            body_writer = BodyWriter(cycle)
            direct = DirectStream(subs[0][2], streamer, body_writer, streamer.head())
            task = loop.create_task(direct.wait())
            t3 = _now()
            ns["body"] += t1 - t0
            ns["submit"] += t2 - t1
            ns["start"] += t3 - t2
            streams.append((task, streamer))
            rids.append(subs[0][0])
        for _ in range(4):  # the tasks' first turn (they attach their callbacks)
            await asyncio.sleep(0)
        for _ in range(len(rids)):  # the ADDs, as the engine takes them
            dealer.recv_multipart()
        # The steps: every request one token each, the last step finishing them all.
        rng = np.random.default_rng(seed)
        specials = tok.special_ids
        plain = np.array([i for i in range(tok.vocab_size) if i not in specials], dtype=np.int64)
        picks = plain[rng.integers(0, len(plain), size=(tokens, len(rids)))].tolist()
        stats = wire.scheduler_stats_map(len(rids), 0, 0.1)
        messages = []
        for step in range(tokens):
            code = wire.FINISH_LENGTH if step == tokens - 1 else None
            rows = [(rid, [picks[step][j]], code, None) for j, rid in enumerate(rids)]
            msg = wire.outputs_for_step(0, rows, stats=stats)
            messages.append(wire.encode_outputs(msg))
        gc.collect()
        for data in messages:
            push.send(data)
            t0 = _now()
            frames = pull.recv_multipart(copy=False)
            t1 = _now()
            buffers = [f.buffer for f in frames]
            shard0 = ns["shard"]
            decode0 = ns["decode"]
            on_message(buffers)
            t2 = _now()
            ns["recv"] += t1 - t0
            ns["columns"] += (t2 - t1) - (ns["shard"] - shard0) - (ns["decode"] - decode0)
            t3 = _now()
            w3 = _wall()
            for _ in range(4):  # the notifier, the callbacks, the rests
                await asyncio.sleep(0)
            ns["pass"] += _now() - t3
            ns["pass_wall"] += _wall() - w3
        t0 = _now()
        for task, _ in streams:
            await task
        for _task, streamer in streams:
            streamer.close()
        ns["end"] += _now() - t0
        rows_written = sum(t.get_write_buffer_size() for t in transports)
        assert rows_written == 0, "the transports buffered: a stream wrote past its socket"
        captured.append(len(rt.shard))
    finally:
        for (obj, name), fn in saved.items():
            if fn is not None:
                setattr(obj, name, fn)
        for t in transports:
            t.abort()
        for _server, client in pairs:
            client.close()
        for s in (router, dealer, push, pull):
            s.close(linger=0)
        ctx.term()
    streamed = c * tokens
    # The per-call stages, as CPU time: their wall time scaled by the pass's CPU / wall.
    scale = ns["pass"] / max(ns["pass_wall"], 1)
    for stage in ("feed", "parsers", "write"):
        ns[stage] = int(clock.wall[stage] * scale)
    overhead = int(sum(clock.calls[s] for s in ("feed", "parsers", "write")) * WRAPPER_NS)
    feed = ns["feed"] - ns["parsers"]
    wakeups = ns["pass"] - ns["feed"] - ns["write"] - overhead
    per_token = {
        "recv": ns["recv"],
        "decode": ns["decode"],
        "columns": ns["columns"],
        "shard": ns["shard"],
        "wake-ups": wakeups,
        "parsers": ns["parsers"],
        "format": feed,
        "write": ns["write"],
    }
    stream_us = {k: v / streamed / 1e3 for k, v in per_token.items()}
    intake_ns = {
        "body": ns["body"] - ns["template"] - ns["tokenize"],
        "template": ns["template"],
        "tokenize": ns["tokenize"],
        "submit": ns["submit"],
        "start": ns["start"],
        "end": ns["end"],
    }
    intake_us = {k: v / c / 1e3 for k, v in intake_ns.items()}
    return stream_us, intake_us, rows_written


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def live_cpu(workload: str, c: int) -> float | None:
    """CPU µs per streamed token of a live ``tokenwire serve --engine vllm`` on this workload
    (``bench/frontend.py``'s setup, one round; None without the vLLM environment)."""
    import frontend as fe
    from loadgen import load, load_measured

    try:
        paths = fe._check("vllm_cpu_env.py", "the vLLM environment")
    except SystemExit:
        return None
    fe.raise_open_files(4 * c + 1024)
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    logdir = Path(os.environ.get("BENCH_LOGS", "bench/results/breakdown-logs"))
    logdir.mkdir(parents=True, exist_ok=True)
    servers = fe._servers(["tokenwire"], False, paths, None, logdir)
    port, procs = servers["tokenwire"]
    try:
        fe.wait_port(port, procs[0], timeout=600, path="/health")
        warm = fe.payloads(workload, port, 8, False, False)
        asyncio.run(load(port, 8, warm, fe.TOKENS, requests=16))
        batch = fe.payloads(workload, port, c, False, False)
        n = max(c, fe.MIN_REQUESTS[workload])
        pid = procs[0].pid
        runs = [
            asyncio.run(load_measured(pid, port, c, batch, TOKENS, children=True, requests=n))
            for _ in range(ROUNDS)
        ]
        return _median([r["cpu_us_per_token"] for r in runs])
    finally:
        fe._stop(procs)
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))


def _worker(workload: str, c: int, seed: int) -> None:
    """One round in this process (``--worker``): its stages as JSON on the last line."""
    global WRAPPER_NS
    WRAPPER_NS = wrapper_cost()
    tok = Tokenizer.default()
    from tokenwire.detok.tables import decode_table

    decode_table(tok, True)  # (Runtime.start builds them)
    decode_table(tok, False)
    features = Features(reasoning_parser="qwen3")
    # A first round warms the tables and caches up (the server's start does that).
    asyncio.run(one_round(workload, min(c, 8), 8, tok, features, seed=99))
    stream, intake, _ = asyncio.run(one_round(workload, c, TOKENS, tok, features, seed=seed))
    print(json.dumps({"stream": stream, "intake": intake}))


def _round(tree: dict[str, str], workload: str, c: int, seed: int) -> dict[str, dict[str, float]]:
    env = dict(os.environ, **tree)
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", workload, str(c), str(seed)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"a round failed ({tree}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    workloads = os.environ.get("WORKLOADS", "completions,chat").split(",")
    levels = [int(c) for c in os.environ.get("CONCURRENCY", "1,8,64,256").split(",")]
    live = os.environ.get("LIVE", "0") == "1"
    trees: list[tuple[str, dict[str, str]]] = [("this", {"PYTHONPATH": str(HERE.parent / "src")})]
    if os.environ.get("COMPILED") == "1":  # the installed build, compiled and as plain Python
        trees = [("compiled", {"TOKENWIRE_PURE_PYTHON": "0"})]
        trees.append(("pure", {"TOKENWIRE_PURE_PYTHON": "1"}))
    if os.environ.get("BASELINE"):
        base = str(Path(os.environ["BASELINE"]).resolve())
        trees.append(("baseline", {"PYTHONPATH": base, "TOKENWIRE_PURE_PYTHON": "1"}))
    rows = []
    for workload in workloads:
        for c in levels:
            runs: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name, _ in trees}
            for r in range(ROUNDS):  # rounds alternate between the trees, in a rotating order
                for name, tree in trees[r % len(trees) :] + trees[: r % len(trees)]:
                    runs[name].append(_round(tree, workload, c, seed=r))
            for name, _ in trees:
                got = runs[name]
                stream = {
                    k: round(_median([g["stream"][k] for g in got]), 2) for k in got[0]["stream"]
                }
                intake = {
                    k: round(_median([g["intake"][k] for g in got]), 1) for k in got[0]["intake"]
                }
                total = sum(stream.values())
                intake_total = sum(intake.values())
                row = {"code": name, "workload": workload, "C": c, "stream": stream}
                row |= {"intake": intake, "stream_total": round(total, 2)}
                row["intake_total"] = round(intake_total, 1)
                row["in_process_per_token"] = round(total + intake_total / TOKENS, 2)
                if live and name == trees[0][0]:
                    cpu = live_cpu(workload, c)
                    row["live"] = None if cpu is None else round(cpu, 2)
                    rest = None if cpu is None else round(cpu - row["in_process_per_token"], 2)
                    row["rest"] = rest
                rows.append(row)
                print(json.dumps(row), flush=True)
    out = os.environ.get("JSON")
    if out:
        with open(out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    head = " | ".join(STREAM_STAGES)
    print(f"\nµs per streamed token (CPU time, median of {ROUNDS} rounds)\n")
    extra = " | live | rest" if live else ""
    print(f"| workload | C | code | {head} | streamed | + intake / {TOKENS} | total{extra} |")
    print("|---|---:|---|" + "---:|" * (len(STREAM_STAGES) + 3 + (2 if live else 0)))
    for row in rows:
        cells = " | ".join(f"{row['stream'][k]:.2f}" for k in STREAM_STAGES)
        line = f"| {row['workload']} | {row['C']} | {row['code']} | {cells}"
        line += f" | {row['stream_total']:.2f} | {row['intake_total'] / TOKENS:.2f}"
        line += f" | {row['in_process_per_token']:.2f}"
        if live:
            line += f" | {row.get('live', '-')} | {row.get('rest', '-')}"
        print(line + " |")
    print("\nµs per request (intake)\n")
    print("| workload | C | code | " + " | ".join(INTAKE_STAGES) + " | total |")
    print("|---|---:|---|" + "---:|" * (len(INTAKE_STAGES) + 1))
    for row in rows:
        cells = " | ".join(f"{row['intake'][k]:.1f}" for k in INTAKE_STAGES)
        line = f"| {row['workload']} | {row['C']} | {row['code']} | {cells}"
        print(line + f" | {row['intake_total']:.1f} |")


if __name__ == "__main__":
    main()
