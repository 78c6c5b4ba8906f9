"""The spawned vLLM child lives and dies with tokenwire (checked with stand-in commands, no vLLM):
a child that fails makes startup fail with its last lines; SIGTERM during a long startup stops
both at once; a tokenwire killed outright takes its child along."""

from __future__ import annotations

import lzma
import os
import signal
import subprocess
import sys
import time
from importlib import resources

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


def serve(model: str, command: str, start_timeout: float = 120) -> subprocess.Popen:
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
            str(free_port()),
            "--engine-start-timeout",
            str(start_timeout),
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
