"""``VllmLauncher``: a headless ``vllm serve`` child that lives and dies with tokenwire.

The child runs ``CMD serve MODEL --headless --data-parallel-address 127.0.0.1
--data-parallel-rpc-port P --data-parallel-size N --data-parallel-size-local N ...`` in a process
group of its own (so stopping it stops the engine processes it starts), with the parent-death
signal set (so it does not outlive a tokenwire that is killed). Its output goes to tokenwire's
log, each line prefixed, and the last lines are kept for the error message should it fail.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

__all__ = ["VllmLauncher", "die_with_parent", "port_of"]

log = logging.getLogger("tokenwire.engine.vllm.child")

#: Lines of the child's output kept for error messages.
_TAIL = 40


#: What a timed-out start says to do about it.
START_TIMEOUT_HINT = (
    "On CPU, vLLM binds each engine's OpenMP threads to cores of its choosing "
    "(VLLM_CPU_OMP_THREADS_BIND=auto); on a loaded or small machine that can pin the engine to a "
    "busy core, where it crawls. Start tokenwire with VLLM_CPU_OMP_THREADS_BIND=nobind in the "
    "environment (or a free core list, such as 0-3), or VLLM_CPU_NUM_OF_RESERVED_CPU=1 to keep a "
    "core for the frontend; or give it longer with --engine-start-timeout SECONDS."
)


def startup_timeout_message(
    timeout: float,
    engines: int,
    waiting_hello: int,
    waiting_ready: int,
    launcher: VllmLauncher | None = None,
) -> str:
    """Why ``serve --engine vllm`` gave up on its engines: what they were doing when the
    ``--engine-start-timeout`` ran out, their last lines of output, and how to fix it."""
    if waiting_hello:
        doing = (
            f"{waiting_hello} of {engines} had not said hello: the vLLM process was still "
            "starting (importing vLLM, spawning its engine processes)"
        )
    else:
        doing = (
            f"all {engines} said hello but {waiting_ready} did not become ready: they were "
            "loading the model, profiling memory, allocating the KV cache and warming up"
        )
    parts = [f"the vLLM engines were not ready within {timeout:.0f} s ({doing})."]
    if launcher is not None and launcher.tail:
        last = "\n".join(f"    {line}" for line in list(launcher.tail)[-10:])
        parts.append(f"The vLLM process's last lines:\n{last}")
    parts.append(START_TIMEOUT_HINT)
    return "\n".join(parts)


def port_of(endpoint: str) -> int:
    """The port of a bound ZMQ endpoint (``tcp://HOST:PORT``, as ``LAST_ENDPOINT`` gives it)."""
    return int(endpoint.rsplit(":", 1)[1])


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """For ``preexec_fn``: a process group of its own (so it can be stopped as a whole, and a
    terminal's Ctrl-C goes to tokenwire, which stops it), and SIGTERM when the parent dies. It
    stays in tokenwire's session: Linux shares CPU time between sessions first (autogroups), and
    an engine in a session of its own would compete with its frontend as a stranger."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class VllmLauncher:
    """Starts and stops one headless vLLM child (any number of engines inside it).

    ``port`` is the handshake port the child dials. Leave it None when tokenwire binds the
    handshake on a port the kernel picks (``tcp://127.0.0.1:*``), and set it to the bound port
    before ``start``: a port found free, closed and bound again later may be taken meanwhile."""

    def __init__(
        self,
        model: str,
        *,
        port: int | None = None,
        command: Sequence[str] = ("vllm",),
        data_parallel_size: int = 1,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self._head = [*command, "serve", model, "--headless", "--data-parallel-address", host]
        self._tail = [
            "--data-parallel-size",
            str(data_parallel_size),
            "--data-parallel-size-local",
            str(data_parallel_size),
            *extra_args,
        ]
        self.env = env
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL)
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    @property
    def argv(self) -> list[str]:
        """The child's command line (``port`` must be set)."""
        if self.port is None:
            raise ValueError("the vLLM child's handshake port is not set")
        return [*self._head, "--data-parallel-rpc-port", str(self.port), *self._tail]

    def start(self) -> None:
        """Spawn the child (``FileNotFoundError`` names the command when it does not exist)."""
        argv = self.argv
        log.info("starting: %s", shlex.join(argv))
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("VLLM_HOST_IP", "127.0.0.1")
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=die_with_parent,
        )
        self._reader = threading.Thread(target=self._pump, name="vllm-log", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self.tail.append(line)
                log.info("[vllm] %s", line)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """None while the child runs."""
        return self._proc.poll() if self._proc is not None else None

    def failure_message(self) -> str:
        """Why the child is gone, with its last lines of output."""
        code = self.returncode
        last = "\n".join(f"    {line}" for line in list(self.tail)[-15:])
        return f"the vLLM process exited with status {code}; its last lines:\n{last}"

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the child and everything it started: SIGTERM to its group, SIGKILL after
        ``timeout`` seconds."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the vLLM process did not stop in %.0f s: killing it", timeout)
        # Whatever is left of the group (engine processes included) goes now.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if self._reader is not None:
            self._reader.join(2)
