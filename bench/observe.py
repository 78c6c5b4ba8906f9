"""What request logs, request ids and traces cost per request: tokenwire serving the synthetic
engine at step time 0 with each set of operations flags, the server's CPU time per request and
the requests per second, side by side.

    python bench/observe.py            (the whole server, per configuration)
    python bench/observe.py --micro    (what observing a request costs the serving thread)

Each server runs in its own process pinned to CPU 0 (``--cpu 0``), its log to /dev/null; this
process is the load generator: rounds of C concurrent streaming ``/v1/completions`` requests of
``TOKENS`` tokens each, one connection per request (``bench/loadgen.py``). Traces go to an
OTLP/HTTP endpoint in a process of its own that accepts and drops them. Rounds alternate
between the configurations; reported: the median round's server CPU µs per request (user +
kernel) and requests/s, and the CPU difference from the run with everything off.
Environment: CONCURRENCY=32  TOKENS=16  ROUNDS=7  BATCHES=20 (request batches per round).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench/http.py would shadow the standard library's http package: keep this folder behind it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import asyncio  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

from loadgen import cpu_times, free_port, load, request_bytes, wait_port  # noqa: E402

MODEL = "bench-model"
CONFIGS: dict[str, list[str]] = {
    "all off (default)": [],
    "--enable-request-id-headers": ["--enable-request-id-headers"],
    "--enable-log-requests": ["--enable-log-requests"],
    "... + --enable-log-outputs": ["--enable-log-requests", "--enable-log-outputs"],
    "--otlp-traces-endpoint": ["--otlp-traces-endpoint", "{otlp}"],
    "... + --collect-detailed-traces all": [
        "--otlp-traces-endpoint",
        "{otlp}",
        "--collect-detailed-traces",
        "all",
    ],
}


class _Drop(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _receiver(port: int) -> None:  # pragma: no cover - its own process
    ThreadingHTTPServer(("127.0.0.1", port), _Drop).serve_forever()


def _start(flags: list[str], port: int, otlp: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tokenwire", "serve", "--cpu", "0", "--port", str(port)]
    argv += ["--step-time-ms", "0", "--synthetic-output", "random", "--disable-access-log"]
    argv += ["--served-model-name", MODEL, *(f.format(otlp=otlp) for f in flags)]
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    wait_port(port, proc, path="/health")
    return proc


async def _round(pid: int, port: int, payload: bytes, concurrency: int, batches: int) -> dict:
    user0, sys0 = cpu_times(pid)
    elapsed = 0.0
    complete = 0
    for _ in range(batches):
        run = await load(port, concurrency, payload, 1)
        elapsed += run["elapsed"]
        complete += run["complete"]
    user1, sys1 = cpu_times(pid)
    n = max(complete, 1)
    return {"cpu_us": (user1 + sys1 - user0 - sys0) / n * 1e6, "rps": n / elapsed}


def main() -> None:
    concurrency = int(os.environ.get("CONCURRENCY", "32"))
    tokens = int(os.environ.get("TOKENS", "16"))
    rounds = int(os.environ.get("ROUNDS", "7"))
    batches = int(os.environ.get("BATCHES", "20"))
    os.sched_setaffinity(0, {1})
    otlp_port = free_port()
    receiver = subprocess.Popen(
        [sys.executable, str(HERE / "observe.py"), "--receiver", str(otlp_port)],
        stdin=subprocess.DEVNULL,
    )
    otlp = f"http://127.0.0.1:{otlp_port}/v1/traces"
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    try:
        for name, flags in CONFIGS.items():
            port = free_port()
            servers[name] = (_start(flags, port, otlp), port)
        results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
        for _ in range(rounds):
            for name, (proc, port) in servers.items():
                payload = request_bytes(port, MODEL, tokens)
                results[name].append(
                    asyncio.run(_round(proc.pid, port, payload, concurrency, batches))
                )
        base = statistics.median(r["cpu_us"] for r in results["all off (default)"])
        print(f"C={concurrency}, {tokens} tokens a request, {rounds} rounds")
        print(f"| {'flags':40} | server CPU µs/request | vs all off | requests/s |")
        print(f"|{'-' * 42}|----------------------:|-----------:|-----------:|")
        for name, runs in results.items():
            cpu = statistics.median(r["cpu_us"] for r in runs)
            rps = statistics.median(r["rps"] for r in runs)
            print(f"| {name:40} | {cpu:21.0f} | {cpu - base:+10.0f} | {rps:10.0f} |")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
        receiver.terminate()
        receiver.wait(10)


def micro(n: int = 20000) -> None:
    """The event loop's share: what observing one request costs in the serving thread (its
    record, its log lines to a handler that drops them, its span handed to the batch
    processor; the span's export runs on the SDK's own thread), µs per request."""
    import logging
    import time

    sys.path.insert(0, str(HERE.parent / "src"))
    from tokenwire.engine import RequestTimes
    from tokenwire.messages.egress import Done
    from tokenwire.messages.finish_reason import FinishReason
    from tokenwire.messages.sampling import SamplingParams
    from tokenwire.runtime import Plan
    from tokenwire.server.observe import ObserveConfig, RequestRecord
    from tokenwire.server.tracing import Tracing
    from tokenwire.tokenizer import Tokenizer

    logging.getLogger("tokenwire.requests").addHandler(logging.NullHandler())
    logging.getLogger("tokenwire.requests").propagate = False
    logging.getLogger("tokenwire.requests").setLevel(logging.INFO)
    tok = Tokenizer.default()
    port = free_port()
    receiver = subprocess.Popen(
        [sys.executable, str(HERE / "observe.py"), "--receiver", str(port)],
        stdin=subprocess.DEVNULL,
    )
    try:
        from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

        class Dropped(SpanExporter):
            def export(self, spans: object) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        tracing = Tracing(f"http://127.0.0.1:{port}/v1/traces")
        dropping = Tracing("http://unused/v1/traces", exporter=Dropped())
        scope = {
            "headers": [
                (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            ]
        }
        plan = Plan(
            "completion", [[1, 2, 3, 4]], SamplingParams(max_new_tokens=16, temperature=0.7)
        )
        subs = [("rid-0", 0, None)]
        done = Done("rid-0", [5], FinishReason.length(16), 4, "text", 16, None, 0, 0)
        times = RequestTimes(1.0, 1.1, 1.2, 1.5)
        cases = {
            "record only (request ids)": ObserveConfig(request_id_headers=True),
            "record + request log lines": ObserveConfig(log_requests=True),
            "record + request and output lines": ObserveConfig(log_requests=True, log_outputs=True),
            "record + span, exporter that drops it": ObserveConfig(tracing=dropping),
            "record + span, OTLP/HTTP export (incl.)": ObserveConfig(tracing=tracing),
        }
        print(f"| {'per request, in the serving thread':40} | µs |")
        print(f"|{'-' * 42}|---:|")
        for name, config in cases.items():
            # (Fewer than the batch processor's queue holds: none dropped; the export's own
            # thread is timed with it, to the last span sent.)
            count = 1500 if config.tracing is not None else n
            t0 = time.perf_counter()
            for _ in range(count):
                record = RequestRecord(config, scope, tok)
                record.submitted(plan, subs)
                record.first_chunk = record.received
                record.finished(done, times, "text" if config.log_outputs else None)
                if config.tracing is not None:
                    config.tracing.emit(record)
            if config.tracing is not None:
                config.tracing.flush()
            took = (time.perf_counter() - t0) / count * 1e6
            print(f"| {name:40} | {took:.1f} |")
        tracing.shutdown()
        dropping.shutdown()
    finally:
        receiver.terminate()
        receiver.wait(10)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--receiver"]:
        _receiver(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--micro"]:
        micro()
    else:
        main()
