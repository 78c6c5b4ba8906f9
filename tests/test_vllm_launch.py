"""The spawned vLLM child lives and dies with tokenwire (checked with stand-in commands, no vLLM):
a child that fails makes startup fail with its last lines; SIGTERM during a long startup stops
both at once; a tokenwire killed outright takes its child along; the child dials the handshake
port tokenwire bound (the kernel picked it), with one API server or several."""

from __future__ import annotations

import lzma
import os
import signal
import subprocess
import sys
import textwrap
import time
from importlib import resources

import httpx
import pytest

from vllm_helpers import alive, children, free_port, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process tree")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A model directory with the bundled tokenizer (the stand-in children load no weights)."""
    out = tmp_path_factory.mktemp("model")
    data = resources.files("tokenwire") / "_data" / "qwen3"
    (out / "tokenizer.json").write_bytes(
        lzma.decompress(data.joinpath("tokenizer.json.xz").read_bytes())
    )
    for name in ("tokenizer_config.json", "config.json"):
        (out / name).write_bytes(data.joinpath(name).read_bytes())
    return str(out)


def serve(
    model: str, command: str, start_timeout: float = 120, *extra: str, port: int | None = None
) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokenwire",
            "serve",
            "--engine",
            "vllm",
            "--model",
            model,
            "--vllm-command",
            command,
            "--port",
            str(port or free_port()),
            "--engine-start-timeout",
            str(start_timeout),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


SLEEPER = f"{sys.executable} -c 'import sys,time; print(\"child up\", flush=True); time.sleep(600)'"


def test_a_child_that_fails_fails_startup_with_its_last_lines(model_dir):
    proc = serve(
        model_dir, f"{sys.executable} -c 'print(\"boom-line\", flush=True); raise SystemExit(3)'"
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    text = out.decode()
    assert "boom-line" in text and "exited with status 3" in text


def test_a_start_timeout_says_what_the_engine_was_doing_and_how_to_fix_it(model_dir):
    """A child that never says hello: the error names the stage, the child's last lines, and
    vLLM's CPU thread binding (a busy core) with the variable that fixes it."""
    proc = serve(model_dir, SLEEPER, start_timeout=3)
    out, _ = proc.communicate(timeout=120)
    text = out.decode()
    assert proc.returncode != 0, text
    assert "not ready within 3 s" in text and "had not said hello" in text, text
    assert "child up" in text and "VLLM_CPU_OMP_THREADS_BIND=nobind" in text, text
    assert "--engine-start-timeout" in text


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_long_startup_stops_tokenwire_and_its_child(model_dir, sig):
    proc = serve(model_dir, SLEEPER)
    try:
        wait_until(lambda: children(proc.pid), 60, "the child")
        (child,) = children(proc.pid)
        time.sleep(0.5)
        proc.send_signal(sig)
        proc.wait(30)
        wait_until(lambda: not alive(child), 10, "the child to go")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_killed_tokenwire_takes_its_child_along(model_dir):
    proc = serve(model_dir, SLEEPER)
    try:
        wait_until(lambda: children(proc.pid), 60, "the child")
        (child,) = children(proc.pid)
        proc.kill()
        proc.wait(10)
        wait_until(lambda: not alive(child), 10, "the child to go (parent-death signal)")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_the_start_timeout_message_names_the_stage():
    from tokenwire.engine.vllm.launch import VllmLauncher, startup_timeout_message

    launcher = VllmLauncher("m", port=1)
    launcher.tail.extend(["Loading weights", "Memory profiling takes 3 s"])
    text = startup_timeout_message(900, 2, 0, 1, launcher)
    assert "all 2 said hello but 1 did not become ready" in text
    assert "loading the model" in text and "Memory profiling takes 3 s" in text
    assert "VLLM_CPU_OMP_THREADS_BIND=nobind" in text
    assert "had not said hello" in startup_timeout_message(5, 1, 1, 1, None)


#: A stand-in for ``vllm serve MODEL --headless ...``: the mock engine, dialing the handshake port
#: the child was given, and that port written to a file.
STAND_IN = textwrap.dedent(
    """
    import os, sys
    args = sys.argv[1:]
    port = args[args.index("--data-parallel-rpc-port") + 1]
    with open(os.environ["STAND_IN_PORT_FILE"], "w") as f:
        f.write(port)
    os.execv(sys.executable, [sys.executable, "-m", "tokenwire", "mock-engine",
                              "--handshake-address", "tcp://127.0.0.1:" + port])
    """
)


@pytest.mark.parametrize("servers", [1, 2])
def test_the_child_dials_the_handshake_port_the_kernel_gave_tokenwire(
    model_dir, tmp_path, monkeypatch, servers
):
    """No port is found free and bound again later (another process may take it meanwhile):
    tokenwire binds its handshake on a port the kernel picks and tells the child that port."""
    from tokenwire.entrypoints.cli import build_parser
    from tokenwire.entrypoints.options.engine import vllm_engines

    address, launcher = vllm_engines(build_parser().parse_args(["serve", "--model", "m"]))
    assert address == "tcp://127.0.0.1:*" and launcher.port is None
    with pytest.raises(ValueError, match="port"):
        launcher.start()

    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port_file = tmp_path / "port"
    monkeypatch.setenv("STAND_IN_PORT_FILE", str(port_file))
    http = free_port()
    flags = ("--api-server-count", str(servers)) if servers > 1 else ()
    proc = serve(model_dir, f"{sys.executable} {script}", 120, *flags, port=http)
    try:

        def up() -> bool:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                return httpx.get(f"http://127.0.0.1:{http}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 120, "tokenwire over the stand-in child")
        got = httpx.post(
            f"http://127.0.0.1:{http}/v1/completions",
            json={"model": model_dir, "prompt": "hello", "max_tokens": 3},
            timeout=30,
        )
        assert got.status_code == 200, got.text
        assert got.json()["usage"]["completion_tokens"] == 3
        given = int(port_file.read_text())
        listening = {int(line.split()[1].split(":")[1], 16) for line in _tcp_listeners()}
        assert given in listening
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def _tcp_listeners() -> list[str]:
    """/proc/net/tcp's lines for sockets in LISTEN state (st 0A)."""
    with open("/proc/net/tcp") as f:
        return [line for line in f.readlines()[1:] if line.split()[3] == "0A"]
