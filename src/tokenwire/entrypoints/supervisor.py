"""``tokenwire serve --api-server-count N``: N API-server processes over shared engines.

vLLM's topology, on vLLM's engine protocol. The supervisor (this module, in the process the user
started) binds the HTTP socket and, per worker, an input and an output listener (Unix sockets);
starts the engines (a ``tokenwire mock-engine`` per data-parallel rank for the synthetic engine,
a headless ``vllm serve`` child for ``--model``, or none when they dial ``--handshake-address``);
starts N workers, each a ``tokenwire serve`` that adopts the shared HTTP socket and its own two
listeners; and does the engines' handshake, telling every engine every worker's addresses. Each
worker stamps its index on its requests (vLLM's ``client_index``), so every engine sends a
request's outputs back to the worker that owns it.

Lifecycle: SIGTERM or SIGINT stops the workers (each finishes gracefully), then the engines. A
worker that dies stops the whole server with a clear message rather than being restarted: its
requests in flight would go on in the engines with nobody to read or abort them, and a process
manager restarting the whole server is the safe recovery. Engines that die are each worker's
business (their requests fail, /health turns 503 when none is left).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import zmq

from tokenwire.engine.vllm import protocol as wire
from tokenwire.engine.vllm.launch import VllmLauncher, die_with_parent, port_of
from tokenwire.messages.errors import CodecError

__all__ = ["SupervisorConfig", "run_supervisor", "worker_argv"]

log = logging.getLogger("tokenwire.supervisor")


@dataclass
class SupervisorConfig:
    """What the supervisor starts."""

    #: The ``tokenwire serve`` arguments the user gave (each worker gets them, plus its own).
    serve_args: list[str]
    host: str
    port: int
    workers: int
    #: A Unix domain socket to listen on instead of ``host`` and ``port`` (``--uds``).
    uds: str | None = None
    #: Engines (data-parallel ranks).
    engines: int = 1
    #: ``synthetic`` (mock-engine processes) or ``vllm``.
    engine: str = "synthetic"
    #: Arguments for each ``tokenwire mock-engine`` (synthetic options), without the address.
    mock_args: list[str] = field(default_factory=list)
    #: A headless vLLM child to spawn (``--model``), or None.
    launcher: VllmLauncher | None = None
    #: Bind this handshake address and wait for engines started elsewhere.
    handshake_address: str | None = None
    ready_timeout: float = 900.0
    shutdown_timeout: float = 30.0


def worker_argv(
    serve_args: Sequence[str], index: int, fds: tuple[int, int, int], engines: int, metrics: str
) -> list[str]:
    """A worker's command line: the user's ``serve`` arguments, then its own (later flags win)."""
    return [
        sys.executable,
        "-m",
        "tokenwire",
        "serve",
        *(a for a in serve_args if a != "--force-supervisor"),
        "--engine",
        "vllm",
        "--api-server-count",
        "1",
        "--data-parallel-size",
        str(engines),
        "--worker-index",
        str(index),
        "--worker-fds",
        ",".join(map(str, fds)),
        "--worker-metrics-dir",
        metrics,
    ]


def _http_listener(cfg: SupervisorConfig) -> socket.socket:
    """The HTTP socket every worker adopts: TCP, or the ``--uds`` Unix socket (a stale socket
    file left there is replaced, as uvicorn does; the workers serve TLS over either)."""
    if not cfg.uds:
        return socket.create_server((cfg.host, cfg.port), backlog=4096)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.stat(cfg.uds).st_mode):
            os.unlink(cfg.uds)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(cfg.uds)
    os.chmod(cfg.uds, 0o666)
    sock.listen(4096)
    return sock


def _unix_listener(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(256)
    sock.set_inheritable(True)
    return sock


class _Stop(Exception):
    pass


class Supervisor:
    """Runs the workers and engines; see the module docstring."""

    def __init__(self, config: SupervisorConfig) -> None:
        self.config = config
        self.tmp = tempfile.mkdtemp(prefix="tokenwire-")
        self.metrics_dir = os.path.join(self.tmp, "metrics")
        os.mkdir(self.metrics_dir)
        self.workers: list[subprocess.Popen] = []
        self.mocks: list[subprocess.Popen] = []
        self._sockets: list[socket.socket] = []
        self._signal: int | None = None
        self._gone: set[int] = set()  # engine ranks (-1: the vLLM child) known to be gone

    def run(self) -> int:
        cfg = self.config
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_hup)
        ctx: zmq.Context | None = None
        hs: zmq.Socket | None = None
        try:
            http = _http_listener(cfg)
            http.set_inheritable(True)
            self._sockets.append(http)
            pairs = []
            for i in range(cfg.workers):
                a = _unix_listener(os.path.join(self.tmp, f"in-{i}.sock"))
                b = _unix_listener(os.path.join(self.tmp, f"out-{i}.sock"))
                self._sockets += [a, b]
                pairs.append((a, b))
            ctx = zmq.Context()
            hs = ctx.socket(zmq.ROUTER)
            hs.setsockopt(zmq.LINGER, 0)
            # The kernel picks the port unless the user gave one; the engines get the port bound.
            hs.bind(cfg.handshake_address or "tcp://127.0.0.1:*")
            self._start_engines(hs.getsockopt_string(zmq.LAST_ENDPOINT))
            for i, (a, b) in enumerate(pairs):
                fds = (http.fileno(), a.fileno(), b.fileno())
                argv = worker_argv(cfg.serve_args, i, fds, cfg.engines, self.metrics_dir)
                self.workers.append(
                    subprocess.Popen(
                        argv, pass_fds=fds, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent
                    )
                )
            inputs = [f"ipc://{os.path.join(self.tmp, f'in-{i}.sock')}" for i in range(cfg.workers)]
            outputs = [
                f"ipc://{os.path.join(self.tmp, f'out-{i}.sock')}" for i in range(cfg.workers)
            ]
            init = wire.encode_init(inputs, outputs)
            self._handshake(hs, init)
            log.info(
                "%d API servers over %d engine(s) on %s",
                cfg.workers,
                cfg.engines,
                f"unix:{cfg.uds}" if cfg.uds else f"{cfg.host}:{cfg.port}",
            )
            return self._watch(hs, init)
        except _Stop:
            return 0
        finally:
            self._shutdown()
            if hs is not None:
                hs.close(0)
            if ctx is not None:
                ctx.term()

    def _on_hup(self, signum: int, frame: object) -> None:
        """SIGHUP: every worker re-reads the API keys file."""
        for proc in self.workers:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGHUP)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signal = signum
        self._drain()

    def _drain(self) -> None:
        """Stop listening and tell the workers to drain, at once: once they close their copies
        of the socket too, new connections are refused instead of waiting in the backlog."""
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
        for proc in self.workers:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)

    def _check(self, *, starting: bool = False) -> None:
        """Raise ``_Stop`` on a signal, ``RuntimeError`` when a worker died (or, while starting,
        an engine); an engine that dies later is only logged: the workers fail its requests and
        take it out of rotation."""
        if self._signal is not None:
            raise _Stop
        for i, proc in enumerate(self.workers):
            if proc.poll() is not None:
                raise RuntimeError(f"API server {i} exited with status {proc.returncode}")
        for r, proc in enumerate(self.mocks):
            if proc.poll() is not None and r not in self._gone:
                if starting:
                    raise RuntimeError(f"engine {r} exited with status {proc.returncode}")
                self._gone.add(r)
                log.error("engine %d exited with status %s", r, proc.returncode)
        launcher = self.config.launcher
        if launcher is not None and launcher.returncode is not None and -1 not in self._gone:
            if starting:
                raise RuntimeError(launcher.failure_message())
            self._gone.add(-1)
            log.error("%s", launcher.failure_message())

    def _start_engines(self, address: str) -> None:
        cfg = self.config
        if cfg.engine == "synthetic":
            for rank in range(cfg.engines):
                argv = [sys.executable, "-m", "tokenwire", "mock-engine"]
                argv += ["--handshake-address", address, "--data-parallel-rank", str(rank)]
                self.mocks.append(
                    subprocess.Popen(
                        [*argv, *cfg.mock_args],
                        stdin=subprocess.DEVNULL,
                        preexec_fn=die_with_parent,
                    )
                )
        elif cfg.launcher is not None:
            cfg.launcher.port = port_of(address)
            cfg.launcher.start()

    def _handshake(self, hs: zmq.Socket, init: bytes) -> None:
        expected = {wire.engine_identity(r) for r in range(self.config.engines)}
        waiting = set(expected)
        deadline = time.monotonic() + self.config.ready_timeout
        while waiting:
            self._check(starting=True)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(waiting)} engine(s) did not become ready in time")
            if not hs.poll(50):
                continue
            identity, payload = hs.recv_multipart()
            msg = wire.decode_handshake(payload)
            if identity not in expected:
                log.warning("an engine with unexpected identity %r said %s", identity, msg)
            elif msg["status"] == "HELLO":
                hs.send_multipart((identity, init))
            else:
                waiting.discard(identity)

    def _watch(self, hs: zmq.Socket, init: bytes) -> int:
        """Until a signal or a worker's death; meanwhile an engine that comes back (a restarted
        rank) says hello again and gets the workers' addresses, as at startup."""
        expected = {wire.engine_identity(r) for r in range(self.config.engines)}
        while True:
            try:
                self._check()
            except _Stop:
                return 0
            except RuntimeError as exc:
                log.error(
                    "%s: stopping the server (a worker's requests in flight cannot be recovered; "
                    "restart the whole server)",
                    exc,
                )
                return 1
            if not hs.poll(50):
                continue
            identity, payload = hs.recv_multipart()
            try:
                msg = wire.decode_handshake(payload)
            except CodecError:
                continue
            if identity in expected and msg["status"] == "HELLO":
                log.info("engine %r says hello again", identity)
                hs.send_multipart((identity, init))

    def _shutdown(self) -> None:
        self._drain()
        deadline = time.monotonic() + self.config.shutdown_timeout + 5
        for proc in self.workers:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for proc in self.mocks:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.mocks:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self.config.launcher is not None:
            self.config.launcher.stop()
        if self.config.uds and self._sockets:
            with contextlib.suppress(OSError):
                os.unlink(self.config.uds)
        shutil.rmtree(self.tmp, ignore_errors=True)


def run_supervisor(config: SupervisorConfig) -> int:
    """Run until a signal (exit 0) or a worker's death (exit 1)."""
    return Supervisor(config).run()
