"""The frontend side of vLLM's EngineCore protocol, recording every byte an engine sends.

``Recorder`` binds what a vLLM frontend binds (handshake ROUTER, input ROUTER, output PULL), takes
an engine through the handshake, sends requests and keeps each message the engine sends as raw
frames, so that two engines (a real vLLM one and ``tokenwire mock-engine``) can be driven through
the same script and their messages compared with vLLM's own types (``vllm_fidelity_check.py``,
run by vLLM's Python).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

_encode = msgspec.msgpack.encode
_decode = msgspec.msgpack.decode

ADD, ABORT, UTILITY = b"\x00", b"\x01", b"\x03"
IDENTITY = (0).to_bytes(2, "little")


@dataclass
class Record:
    """What one engine sent: the handshake messages and every output message (its frames, and
    the step of the script it came in)."""

    hello: bytes = b""
    ready_response: bytes = b""
    ready: bytes = b""
    outputs: list[tuple[str, list[bytes]]] = field(default_factory=list)
    #: call id -> utility method name
    calls: dict[int, str] = field(default_factory=dict)

    def dump(self) -> bytes:
        return _encode(
            {
                "hello": self.hello,
                "ready_response": self.ready_response,
                "ready": self.ready,
                "outputs": self.outputs,
                "calls": {str(k): v for k, v in self.calls.items()},
            }
        )


class Recorder:
    """One engine's frontend; see the module docstring."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.hs = self.ctx.socket(zmq.ROUTER)
        port = self.hs.bind_to_random_port("tcp://127.0.0.1")
        self.handshake_address = f"tcp://127.0.0.1:{port}"
        self.input = self.ctx.socket(zmq.ROUTER)
        self.input.bind("tcp://127.0.0.1:*")
        self.output = self.ctx.socket(zmq.PULL)
        self.output.bind("tcp://127.0.0.1:*")
        for sock in (self.hs, self.input, self.output):
            sock.setsockopt(zmq.LINGER, 0)
        self.record = Record()
        self.step = "handshake"
        self._call_id = 1000

    def close(self) -> None:
        self.ctx.destroy(linger=0)

    def handshake(self, timeout: float) -> dict[str, Any]:
        """HELLO, init, the ready response, READY: the engine's ready response."""
        identity, self.record.hello = self._recv(self.hs, timeout)
        init = {
            "addresses": {
                "inputs": [self.input.getsockopt_string(zmq.LAST_ENDPOINT)],
                "outputs": [self.output.getsockopt_string(zmq.LAST_ENDPOINT)],
                "coordinator_input": None,
                "coordinator_output": None,
                "frontend_stats_publish_address": None,
            },
            "parallel_config": {},
        }
        self.hs.send_multipart([identity, _encode(init)])
        _, self.record.ready_response = self._recv(self.input, timeout)
        _, self.record.ready = self._recv(self.hs, timeout)
        return _decode(self.record.ready_response)

    @staticmethod
    def _recv(sock: zmq.Socket, timeout: float) -> list[bytes]:
        if not sock.poll(timeout * 1000):
            raise TimeoutError("the engine did not answer")
        return sock.recv_multipart()

    def send(self, kind: bytes, payload: Any) -> None:
        self.input.send_multipart([IDENTITY, kind, _encode(payload)])

    def add(self, rid: str, prompt: list[int], sampling: dict[str, Any]) -> None:
        """An ADD with the required fields of ``EngineCoreRequest``."""
        self.send(ADD, [rid, prompt, None, sampling, None, time.time(), None, None, None])

    def abort(self, rids: list[str]) -> None:
        self.send(ABORT, rids)

    def utility(self, method: str, *args: Any, timeout: float = 30) -> list[Any]:
        """Call a utility method; the ``UtilityOutput`` that answers it (decoded)."""
        self._call_id += 1
        call_id = self._call_id
        self.record.calls[call_id] = method
        self.send(UTILITY, [0, call_id, method, list(args)])
        found: list[Any] = []

        def answered(msg: list[Any]) -> bool:
            out = msg[4] if len(msg) > 4 else None
            if isinstance(out, list) and out and out[0] == call_id:
                found.append(out)
            return bool(found)

        self.collect(answered, timeout)
        return found[0]

    def collect(self, done: Any, timeout: float, quiet: float = 0.0) -> None:
        """Record output messages until ``done(message)`` is true for one (the message decoded
        as plain msgpack), then for ``quiet`` seconds more."""
        deadline = time.monotonic() + timeout
        finished = False
        quiet_until = deadline
        while True:
            left = deadline - time.monotonic()
            if finished:
                left = min(left, quiet_until - time.monotonic())
            if left <= 0:
                if finished:
                    return
                raise TimeoutError(f"step {self.step!r}: the engine did not finish in {timeout} s")
            if not self.output.poll(left * 1000):
                continue
            frames = self.output.recv_multipart()
            self.record.outputs.append((self.step, frames))
            if not finished and done(_decode(frames[0])):
                finished = True
                quiet_until = time.monotonic() + quiet

    def run_until_finished(self, rids: set[str], timeout: float, quiet: float = 0.3) -> dict:
        """Record until each of ``rids`` has a finished output: ``{rid: [new token ids of each
        output...], ...}`` and ``{rid: (finish code, stop reason)}`` as one dict per rid."""
        tokens: dict[str, list[list[int]]] = {r: [] for r in rids}
        ends: dict[str, tuple[int, Any]] = {}

        def done(msg: list[Any]) -> bool:
            for out in msg[1] if len(msg) > 1 else []:
                rid = out[0]
                if rid in tokens:
                    tokens[rid].append(list(out[1]))
                    if len(out) > 5 and out[5] is not None:
                        ends[rid] = (out[5], out[6] if len(out) > 6 else None)
            return set(ends) >= rids

        self.collect(done, timeout, quiet)
        return {rid: {"tokens": tokens[rid], "end": ends[rid]} for rid in rids}
