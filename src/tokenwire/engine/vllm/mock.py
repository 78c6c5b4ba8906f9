"""``tokenwire mock-engine``: the synthetic engine behind the engine side of vLLM's protocol.

It does what a headless vLLM engine does on the wire: dials the frontend's handshake address,
says HELLO, takes the init metadata, connects a DEALER to every input address and a PUSH to every
output address, sends its ready response on each, says READY; then serves ADD, ABORT and UTILITY
and sends ``EngineCoreOutputs`` with vLLM's layout, one message per step per frontend with outputs
in it, the step's scheduler stats on one of them only (as vLLM's scheduler does). Any vLLM
frontend can drive it: tokenwire's own, or stock ``vllm serve`` waiting for a remote engine, so
both are measured over the same engine with no GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

import zmq
import zmq.asyncio

from tokenwire.engine import EngineRequest
from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.engine.vllm import protocol as wire
from tokenwire.messages.errors import CodecError
from tokenwire.messages.frames import (
    EGRESS_TAG_BATCH,
    EGRESS_TAG_ERROR,
    decode_batch_frame,
    decode_error_frame,
)
from tokenwire.tokenizer import Tokenizer

__all__ = ["MockEngine"]

log = logging.getLogger("tokenwire.mock_engine")

#: Utility methods stock vLLM frontends call, and the answers of an engine that only generates.
_UTILITY_RESULTS: dict[str, Any] = {
    "get_supported_tasks": ["generate"],
    "is_sleeping": False,
    "reset_prefix_cache": True,
    "reset_mm_cache": None,
    "reset_encoder_cache": None,
    "list_loras": [],
    "profile": None,
}


class MockEngine:
    """One mock engine (one data-parallel rank)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: SyntheticConfig,
        handshake_address: str,
        *,
        rank: int = 0,
        max_model_len: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.synthetic = SyntheticEngine(tokenizer, config)
        self.handshake_address = handshake_address
        self.rank = rank
        self.identity = wire.engine_identity(rank)
        self.max_model_len = max_model_len or tokenizer.max_model_len or 4096
        self.max_batch_size = config.max_batch_size
        self._ctx: zmq.asyncio.Context | None = None
        self._inputs: list[zmq.asyncio.Socket] = []
        self._outputs: list[zmq.Socket] = []
        self._clients: dict[str, int] = {}  # rid -> client index
        self._eos: dict[str, int | None] = {}  # rid -> the EOS id its frontend gave
        self.stats = {"added": 0, "aborted": 0}

    async def run(self, *, ready: asyncio.Event | None = None) -> None:
        """Handshake, then serve until cancelled."""
        self._ctx = zmq.asyncio.Context()
        try:
            await self._handshake()
            await self.synthetic.start(self._on_frame)
            if ready is not None:
                ready.set()
            await asyncio.gather(*(self._serve_input(s, i) for i, s in enumerate(self._inputs)))
        finally:
            await self.synthetic.close()
            # The output sockets come from a shadow of the context: ``destroy`` does not know
            # them, and ``term`` would wait for them forever.
            for sock in self._outputs:
                sock.close(linger=0)
            self._ctx.destroy(linger=0)

    async def _handshake(self) -> None:
        assert self._ctx is not None
        hs = self._ctx.socket(zmq.DEALER)
        hs.setsockopt(zmq.IDENTITY, self.identity)
        hs.setsockopt(zmq.LINGER, 5000)
        hs.connect(self.handshake_address)
        await hs.send(wire.encode_handshake("HELLO"))
        log.info("rank %d: said hello to %s", self.rank, self.handshake_address)
        inputs, outputs = wire.decode_init(await hs.recv())
        ready = wire.encode_ready_response(
            max_model_len=self.max_model_len,
            data_parallel_rank=self.rank,
            max_num_seqs=self.max_batch_size,
            num_gpu_blocks=max(1, self.max_model_len * self.max_batch_size // 16),
            kv_cache_size_tokens=self.max_model_len * self.max_batch_size,
        )
        for address in inputs:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, self.identity)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.connect(address)
            await sock.send(ready)
            self._inputs.append(sock)
        sync_ctx = zmq.Context.shadow(self._ctx.underlying)
        for address in outputs:
            sock = sync_ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(address)
            self._outputs.append(sock)
        await hs.send(wire.encode_handshake("READY"))
        hs.close(linger=1000)
        log.info("rank %d: ready (%d frontend(s))", self.rank, len(self._inputs))

    async def _serve_input(self, sock: zmq.asyncio.Socket, client: int) -> None:
        while True:
            frames = await sock.recv_multipart()
            if not frames:
                continue
            kind, payload = frames[0], frames[1] if len(frames) > 1 else b""
            try:
                if kind == wire.ADD:
                    self._add(wire.decode_add(payload))
                elif kind == wire.ABORT:
                    rids = wire._decode_any(payload)
                    for rid in rids:
                        self._abort(rid)
                    if rids:
                        self._send_stats(client)
                elif kind == wire.UTILITY:
                    self._utility(payload)
                else:
                    log.warning("rank %d: request type %r not handled", self.rank, kind)
            except (CodecError, ValueError, TypeError) as exc:
                log.error("rank %d: bad request message: %s", self.rank, exc)

    def _add(self, add: wire.AddRequest) -> None:
        params = wire.sampling_params_from_map(add.sampling)
        self._clients[add.rid] = add.client_index
        self._eos[add.rid] = add.sampling.get("_eos_token_id")
        self.stats["added"] += 1
        self.synthetic.submit(EngineRequest(add.rid, add.prompt_ids, params))

    def _abort(self, rid: str) -> None:
        if self._clients.pop(rid, None) is not None:
            self._eos.pop(rid, None)
            self.stats["aborted"] += 1
            self.synthetic.abort(rid)

    def _utility(self, payload: bytes) -> None:
        client_index, call_id, method, _args = wire._decode_any(payload)
        if method in _UTILITY_RESULTS:
            out = wire.UtilityOutput(call_id, None, [None, _UTILITY_RESULTS[method]])
        else:
            out = wire.UtilityOutput(call_id, f"mock engine: no utility method {method!r}", None)
        msg = wire.EngineCoreOutputs(engine_index=self.rank, utility_output=out)
        self._outputs[client_index].send(wire.encode_outputs(msg), copy=False)

    def _on_frame(self, frame: Any) -> None:
        """A synthetic-engine frame, re-sent as vLLM ``EngineCoreOutputs`` to each frontend."""
        rows: dict[int, list[tuple[str, list[int], int | None, int | str | None]]] = {}
        clients = self._clients
        if frame[0] == EGRESS_TAG_ERROR:
            rid, _message = decode_error_frame(frame)
            client = clients.pop(rid, None)
            if client is not None:
                self._eos.pop(rid, None)
                rows.setdefault(client, []).append((rid, [], wire.FINISH_ERROR, None))
        elif frame[0] == EGRESS_TAG_BATCH:
            decoded = decode_batch_frame(frame)
            ids = decoded.token_ids.tolist()
            pos = 0
            for rid, n, fin in zip(decoded.rids, decoded.tok_lens, decoded.finish_reasons):
                new = ids[pos : pos + n]
                pos += n
                client = clients.get(rid)
                if client is None:
                    continue
                code: int | None = None
                reason: int | str | None = None
                if fin is not None:
                    del clients[rid]
                    eos = self._eos.pop(rid, None)
                    if fin.kind == "stop":
                        code = wire.FINISH_STOP
                        matched = fin.matched()
                        reason = None if matched == eos else matched  # type: ignore[assignment]
                    elif fin.kind == "length":
                        code = wire.FINISH_LENGTH
                    else:
                        code = wire.FINISH_ABORT
                rows.setdefault(client, []).append((rid, new, code, reason))
        # As vLLM's scheduler does: the step's stats ride with one frontend's outputs only (the
        # first's), or alone to client 0 when the step has none.
        stats: dict[str, Any] | None = self._stats()
        for client, client_rows in rows.items() or [(0, [])]:
            msg = wire.outputs_for_step(self.rank, client_rows, stats=stats)
            self._outputs[client].send(wire.encode_outputs(msg), copy=False)
            stats = None

    def _stats(self) -> dict[str, Any]:
        running = self.synthetic.running
        return {
            "num_running_reqs": running,
            "num_waiting_reqs": self.synthetic.waiting,
            "kv_cache_usage": running / self.max_batch_size,
        }

    def _send_stats(self, client: int) -> None:
        """Scheduler stats alone, to the frontend that aborted (vLLM reports the aborted requests
        to it in its next step, with the stats)."""
        msg = wire.outputs_for_step(self.rank, [], stats=self._stats())
        self._outputs[client].send(wire.encode_outputs(msg), copy=False)


def run_mock_engine(
    tokenizer: Tokenizer,
    config: SyntheticConfig,
    handshake_address: str,
    *,
    rank: int = 0,
    max_model_len: int | None = None,
) -> None:
    """Run one mock engine until SIGTERM or SIGINT (the ``tokenwire mock-engine`` command)."""
    engine = MockEngine(
        tokenizer, config, handshake_address, rank=rank, max_model_len=max_model_len
    )

    async def main() -> None:
        task = asyncio.ensure_future(engine.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
