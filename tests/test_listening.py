"""Where and how ``tokenwire serve`` listens, over real sockets: TLS (``--ssl-keyfile``,
``--ssl-certfile``) with client certificates (``--ssl-ca-certs``, ``--ssl-cert-reqs 2`` refuses a
client without one), a Unix socket (``--uds``), the path prefix of a proxy in front
(``--root-path``, the ASGI root path), each in one server process and under the supervisor of
``--api-server-count``; and the same flags taken from vLLM's arguments by the frontend that
``vllm serve`` starts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.entrypoints.vllm_frontend import settings_from_args
from tokenwire.server import ServerConfig, create_app
from tokenwire.server.serving import ConnectionLimits, TokenwireServer, uvicorn_config
from vllm_helpers import free_port

from conftest import REPO, real_tokenizer

MODEL = "ops-model"
BODY = {"model": MODEL, "prompt": "Hi", "max_tokens": 4}


@pytest.fixture(scope="module")
def pki() -> Iterator[dict[str, str]]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@tokenwire.test")
    other = trustme.CA().issue_cert("client@elsewhere.test")  # signed by a CA nobody trusts
    with tempfile.TemporaryDirectory() as d:
        files = {
            "ca": f"{d}/ca.pem",
            "key": f"{d}/server.key",
            "cert": f"{d}/server.pem",
            "client": f"{d}/client.pem",
            "stranger": f"{d}/stranger.pem",
        }
        ca.cert_pem.write_to_path(files["ca"])
        server.private_key_pem.write_to_path(files["key"])
        for blob in server.cert_chain_pems:
            blob.write_to_path(files["cert"], append=True)
        client.private_key_and_cert_chain_pem.write_to_path(files["client"])
        other.private_key_and_cert_chain_pem.write_to_path(files["stranger"])
        yield files


class Proc:
    """A ``tokenwire serve`` process and every line it has printed."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.banner = ""

    def wait_for(self, needle: str, timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if needle in line:
                    return line
            time.sleep(0.02)
        raise AssertionError(f"no line with {needle!r} in:\n" + "".join(self.lines[-30:]))


@contextlib.contextmanager
def serve(
    *flags: str,
    ready: str = "tokenwire: serving",
    env: dict[str, str] | None = None,
    open_files: int | None = None,
) -> Iterator[Proc]:
    """``tokenwire serve FLAGS`` (the synthetic engine at full speed; ``env``: more environment
    variables; ``open_files``: the process's open-files limit) until the block ends."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), **(env or {}))
    argv = [sys.executable, "-m", "tokenwire", "serve", "--step-time-ms", "0"]
    argv += ["--served-model-name", MODEL, *flags]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        preexec_fn=(
            None
            if open_files is None
            else lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
        ),
    )
    out = Proc(proc)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any(ready in x for x in out.lines):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start:\n" + "".join(out.lines[-30:]))
            time.sleep(0.05)
        out.banner = next(x for x in out.lines if ready in x)
        yield out
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        reader.join(5)


def tls_request(port: int, context: ssl.SSLContext, path: str = "/health") -> bytes:
    """One GET over a TLS connection made with ``context``: the raw response (b"" when the
    server closes without one)."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := tls.recv(65536):
            reply += chunk
        return reply


def client_context(pki: dict[str, str], cert: str | None = None) -> ssl.SSLContext:
    """A client's ``ssl`` context that trusts the test CA, presenting ``cert`` if given."""
    ctx = ssl.create_default_context(cafile=pki["ca"])
    if cert is not None:
        ctx.load_cert_chain(pki[cert])
    return ctx


# ---- TLS -------------------------------------------------------------------------------------


def test_tls_serves_https_and_a_plain_http_client_gets_nothing(pki):
    port = free_port()
    flags = ["--port", str(port), "--ssl-keyfile", pki["key"], "--ssl-certfile", pki["cert"]]
    with serve(*flags) as srv:
        assert f"on https://127.0.0.1:{port} " in srv.banner
        url = f"https://127.0.0.1:{port}"
        ctx = client_context(pki)
        r = httpx.post(url + "/v1/completions", json=BODY, verify=ctx, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        with httpx.stream(
            "POST", url + "/v1/completions", json={**BODY, "stream": True}, verify=ctx
        ) as s:
            assert s.read().endswith(b"data: [DONE]\n\n")
        # A client that does not trust the server's CA refuses it; plain HTTP gets no answer.
        with pytest.raises(ssl.SSLCertVerificationError):
            tls_request(port, ssl.create_default_context())
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)


def _served_within(port: int, ctx: ssl.SSLContext, seconds: float) -> float | None:
    """Seconds until a fresh TLS client gets /health answered (retrying), or None."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        with (
            contextlib.suppress(OSError, ssl.SSLError),
            socket.create_connection(("127.0.0.1", port), timeout=2) as raw,
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            if tls.recv(64).startswith(b"HTTP/1.1 200"):
                return time.monotonic() - start
        time.sleep(0.1)
    return None


def test_unfinished_tls_handshakes_are_counted_and_timed_out(pki):
    """600 TCP connections to the HTTPS port that never start their TLS handshake, against a
    server allowed 300 open files: they count against --max-connections from their accept (the
    ones past its reserve are closed at once) and are closed after --header-timeout, so a fresh
    client is served within a few seconds, as on a quiet server (on main they were outside both
    bounds, held for asyncio's 60 s, and took every descriptor: no fresh client was served)."""
    port = free_port()
    flags = ["--port", str(port), "--ssl-keyfile", pki["key"], "--ssl-certfile", pki["cert"]]
    flags += ["--max-connections", "64", "--header-timeout", "2"]
    ctx = client_context(pki)
    with serve(*flags, open_files=300) as srv:
        quiet = _served_within(port, ctx, 10)
        assert quiet is not None
        idle = []
        try:
            for _ in range(600):
                with contextlib.suppress(OSError):
                    idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            loaded = _served_within(port, ctx, 20)
            fds = len(os.listdir(f"/proc/{srv.proc.pid}/fd"))
        finally:
            for sock in idle:
                sock.close()
        assert loaded is not None, "no fresh client was served in 20 s"
        assert loaded < 2 + 6 + 5 * quiet, (quiet, loaded)  # the header timeout, and margin
        assert fds < 250  # (64 connections and a reserve of 16, not 300)


def test_client_certificates_required_refuse_a_client_without_one(pki):
    port = free_port()
    flags = ["--port", str(port), "--ssl-keyfile", pki["key"], "--ssl-certfile", pki["cert"]]
    flags += ["--ssl-ca-certs", pki["ca"], "--ssl-cert-reqs", "2"]
    with serve(*flags):
        reply = tls_request(port, client_context(pki, "client"))
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'{"status":"ok"}')
        for refused in (client_context(pki), client_context(pki, "stranger")):
            # The handshake fails (TLS 1.3 tells the client on its first read): no response.
            try:
                reply = tls_request(port, refused)
            except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
                reply = b""
            assert reply == b""


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ssl-keyfile", "{key}"], "--ssl-keyfile needs --ssl-certfile"),
        (["--ssl-ca-certs", "{ca}"], "need TLS"),
        (
            ["--ssl-keyfile", "{key}", "--ssl-certfile", "{cert}", "--ssl-cert-reqs", "2"],
            "--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs",
        ),
        (["--ssl-keyfile", "{cert}", "--ssl-certfile", "{cert}"], "TLS: "),
        (["--ssl-keyfile", "{key}", "--ssl-certfile", "/nonexistent.pem"], "TLS: "),
    ],
)
def test_tls_flags_that_cannot_work_stop_the_server_with_the_reason(pki, flags, message):
    argv = [f.format(**pki) for f in flags]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    out = subprocess.run(
        [sys.executable, "-m", "tokenwire", "serve", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode != 0 and message in out.stderr, out.stderr[-2000:]


# ---- a Unix socket and a path prefix -----------------------------------------------------------


def test_unix_socket_and_root_path_behind_a_prefix_stripping_proxy():
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/tokenwire.sock"
        with serve("--uds", path, "--root-path", "/llm/") as srv:
            assert f"on http+unix:{path} " in srv.banner
            client = httpx.Client(
                transport=httpx.HTTPTransport(uds=path), base_url="http://proxy", timeout=30
            )
            # As nginx sends it after `location /llm/ { proxy_pass http://unix:PATH:/; }`.
            r = client.post("/v1/completions", json=BODY)
            assert r.status_code == 200 and r.json()["model"] == MODEL
            assert client.get("/v1/models").json()["data"][0]["id"] == MODEL
            assert client.get("/health").status_code == 200
            # The access log says the path the client asked for, prefix included.
            srv.wait_for('"POST /llm/v1/completions HTTP/1.1" 200')
            # (The prefix is not served twice: a proxy that does not strip it gets a 404.)
            assert client.get("/llm/v1/models").status_code == 404


def test_root_path_in_the_asgi_scope_routes_with_or_without_the_prefix_in_path():
    """ASGI servers put ``root_path`` in ``path`` (uvicorn does); others leave it out: the app
    routes the rest either way."""
    tok = real_tokenizer("default")
    app = create_app(tok, SyntheticEngine(tok, SyntheticConfig(step_time=0)), ServerConfig())

    async def get(path: str) -> tuple[int, bytes]:
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": path, "root_path": "/llm"}
        scope |= {"headers": [], "query_string": b"", "http_version": "1.1"}
        await app(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    for path in ("/llm/v1/models", "/v1/models"):
        status, body = asyncio.run(get(path))
        assert status == 200 and json.loads(body)["object"] == "list", (path, body)
    assert asyncio.run(get("/llmx/v1/models"))[0] == 404


# ---- under the supervisor of --api-server-count ------------------------------------------------


def test_api_server_count_serves_tls_over_a_unix_socket(pki):
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/tw.sock"
        flags = ["--api-server-count", "2", "--uds", path, "--root-path", "/p"]
        flags += ["--ssl-keyfile", pki["key"], "--ssl-certfile", pki["cert"]]
        flags += ["--ssl-ca-certs", pki["ca"], "--ssl-cert-reqs", "2", "--disable-access-log"]
        with serve(*flags) as srv:
            assert f"on https+unix:{path} " in srv.banner
            ctx = client_context(pki, "client")
            transport = httpx.HTTPTransport(uds=path, verify=ctx)
            with httpx.Client(transport=transport, base_url="https://127.0.0.1") as client:
                for _ in range(4):
                    r = client.post("/v1/completions", json=BODY, timeout=30)
                    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
            transport = httpx.HTTPTransport(uds=path, verify=client_context(pki))
            with (
                httpx.Client(transport=transport, base_url="https://127.0.0.1") as client,
                pytest.raises(httpx.HTTPError),
            ):
                client.get("/health", timeout=10)
        assert not Path(path).exists()


# ---- vLLM's arguments, for the frontend vllm serve starts --------------------------------------


def test_the_vllm_frontend_takes_vllms_operations_flags():
    raw = {
        "model_tag": "m",
        "ssl_keyfile": "k.pem",
        "ssl_certfile": "c.pem",
        "ssl_ca_certs": "ca.pem",
        "ssl_cert_reqs": 2,
        "root_path": "/llm",
        "enable_log_requests": True,
        "enable_log_outputs": True,
        "max_log_len": 100,
        "enable_request_id_headers": True,
        "otlp_traces_endpoint": "http://collector:4318/v1/traces",
        "collect_detailed_traces": ["model"],
        "disable_uvicorn_access_log": True,
    }
    ops = settings_from_args(json.dumps(raw))["operations"]
    assert (ops.ssl_keyfile, ops.ssl_certfile, ops.ssl_ca_certs) == ("k.pem", "c.pem", "ca.pem")
    assert ops.ssl_cert_reqs == 2 and ops.root_path == "/llm"
    assert ops.enable_log_requests and ops.enable_log_outputs and ops.max_log_len == 100
    assert ops.enable_request_id_headers and ops.disable_access_log
    assert ops.otlp_traces_endpoint.endswith("/v1/traces")
    assert ops.collect_detailed_traces == ["model"]
    # vLLM sends only what differs from its defaults: the rest is off.
    ops = settings_from_args(json.dumps({"model_tag": "m"}))["operations"]
    assert ops.ssl_certfile is None and ops.ssl_cert_reqs == 0 and not ops.enable_log_requests
    assert ops.otlp_traces_endpoint is None and not ops.disable_access_log


def test_tokenwire_server_in_process_over_tls(pki):
    """``uvicorn_config`` takes the listening settings as ``tokenwire serve`` builds them."""
    from tokenwire.entrypoints.cli import build_parser
    from tokenwire.entrypoints.options import server

    args = build_parser().parse_args(
        ["serve", "--ssl-keyfile", pki["key"], "--ssl-certfile", pki["cert"]]
    )
    tok = real_tokenizer("default")
    app = create_app(tok, SyntheticEngine(tok, SyntheticConfig(step_time=0)), ServerConfig())
    config = uvicorn_config(
        app, ConnectionLimits(), **server.listen_settings(args), log_level="warning"
    )
    srv = TokenwireServer(config, app, 2.0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not srv.started and time.monotonic() < deadline:
            time.sleep(0.02)
        port = sock.getsockname()[1]
        assert tls_request(port, client_context(pki)).startswith(b"HTTP/1.1 200")
    finally:
        srv.should_exit = True
        thread.join(15)
        sock.close()
