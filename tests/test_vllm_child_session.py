"""The spawned vLLM child shares tokenwire's session, in a process group of its own.

Linux's scheduler shares CPU time between sessions first (autogroups) when other work loads the
cores: a vLLM engine in a session of its own competes with tokenwire for the CPU as a stranger,
where stock ``vllm serve``'s API server and engine share one. Its own process group is what
lets tokenwire stop the engine processes it starts. (Checked with a stand-in command, no vLLM.)
"""

from __future__ import annotations

import lzma
import os
import signal
import subprocess
import sys
from importlib import resources

import pytest

from vllm_helpers import children, free_port, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sessions")

SLEEPER = f"{sys.executable} -c 'import time; time.sleep(600)'"


def _ids(pid: int) -> tuple[int, int]:
    """A process's (process group, session)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[2]), int(fields[3])


def test_the_vllm_child_runs_in_tokenwires_session_in_a_group_of_its_own(tmp_path):
    data = resources.files("tokenwire") / "_data" / "qwen3"
    (tmp_path / "tokenizer.json").write_bytes(
        lzma.decompress(data.joinpath("tokenizer.json.xz").read_bytes())
    )
    for name in ("tokenizer_config.json", "config.json"):
        (tmp_path / name).write_bytes(data.joinpath(name).read_bytes())
    argv = [sys.executable, "-m", "tokenwire", "serve", "--engine", "vllm", "--model"]
    argv += [str(tmp_path), "--vllm-command", SLEEPER, "--port", str(free_port())]
    proc = subprocess.Popen(
        [*argv, "--engine-start-timeout", "120"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: children(proc.pid), 60, "the child")
        (child,) = children(proc.pid)
        group, session = _ids(child)
        assert group == child
        assert session == _ids(proc.pid)[1] == proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
