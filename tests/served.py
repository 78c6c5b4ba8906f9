"""A real tokenwire server on a loopback port, in a thread, for tests that need sockets."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.server import ServerConfig, create_app
from tokenwire.server.serving import ConnectionLimits, TokenwireServer, uvicorn_config

from conftest import real_tokenizer

MODEL = "test-model"


class Served:
    def __init__(self, url: str, port: int, engine: SyntheticEngine, app, server) -> None:
        self.url = url
        self.port = port
        self.engine = engine
        self.app = app
        self.server = server
        self.thread = None

    @property
    def runtime(self):
        return self.app.state.runtime


@contextlib.contextmanager
def running(
    server: uvicorn.Server, start_timeout: float = 30
) -> Iterator[tuple[int, threading.Thread]]:
    """Run ``server`` on a loopback port in a thread until the block ends; yields the port and
    the thread (``RuntimeError`` if it does not start within ``start_timeout`` seconds)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        yield sock.getsockname()[1], thread
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


@contextlib.contextmanager
def run_app(app, start_timeout: float = 30) -> Iterator[str]:
    """An ASGI app served by plain uvicorn on a loopback port in a thread; yields its URL."""
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    with running(uvicorn.Server(config), start_timeout) as (port, _):
        yield f"http://127.0.0.1:{port}"


def tokenwire_server(
    app, limits: ConnectionLimits | None = None, shutdown_timeout: float = 2.0
) -> TokenwireServer:
    """A server for an app from ``create_app``, as ``tokenwire serve`` runs it: its connection
    protocol (which writes one-choice streams from their sinks) and its graceful shutdown."""
    uv = uvicorn_config(app, limits or ConnectionLimits(), log_level="warning", lifespan="on")
    return TokenwireServer(uv, app, shutdown_timeout=shutdown_timeout)


@contextlib.contextmanager
def run_tokenwire(app) -> Iterator[str]:
    """``tokenwire_server(app)`` on a loopback port in a thread; yields its URL."""
    with running(tokenwire_server(app)) as (port, _):
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def serve(
    config: SyntheticConfig,
    limits: ConnectionLimits | None = None,
    shutdown_timeout: float = 2.0,
    **server_kw,
) -> Iterator[Served]:
    """Serve the default tokenizer over a synthetic engine, as ``tokenwire serve`` does (its
    connection protocol and graceful shutdown), until the block ends."""
    tok = real_tokenizer("default")
    engine = SyntheticEngine(tok, config)
    app = create_app(tok, engine, ServerConfig(model_name=MODEL, **server_kw))
    server = tokenwire_server(app, limits, shutdown_timeout)
    with running(server) as (port, thread):
        served = Served(f"http://127.0.0.1:{port}", port, engine, app, server)
        served.thread = thread
        yield served


def wait_until(done, timeout: float = 10) -> bool:
    """Poll ``done()`` until it holds (or give up after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def raw_request(port: int, method: str, path: str, body: bytes = b"", *, rcvbuf: int = 0):
    """Open a connection and send one request on it (the caller reads, or does not)."""
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    s.sendall(head + body)
    return s
