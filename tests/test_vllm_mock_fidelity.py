"""``tokenwire mock-engine`` says what a real vLLM 0.32 engine says: both are driven through the
same script (handshake, the utility calls vLLM's frontend and SGLang's gateway make, requests that
end by length, by a stop token, by EOS, several at once, one aborted, logprobs inline and in frames
of their own, prompt logprobs), every byte they send is recorded, and vLLM's own message types,
run by vLLM's Python (``vllm_fidelity_check.py``), decode both and compare them field for field.

Needs the vLLM CPU environment (``scripts/vllm_cpu_env.py``); skips with that reason without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from vllm_helpers import stop_process, vllm_env, vllm_process_env
from vllm_wire import Recorder

pytestmark = pytest.mark.vllm

ENV = vllm_env()
if ENV is None:
    pytest.skip(
        "the vLLM CPU environment is not built: run `python scripts/vllm_cpu_env.py` "
        "(about 5 minutes and 3.5 GB, once)",
        allow_module_level=True,
    )

HERE = Path(__file__).resolve().parent
#: Seconds a real engine may take to come up on a busy 2-core machine.
START_TIMEOUT = 900
MAX_LEN = 512
#: Utility methods vLLM's frontends and SGLang's gateway call (and one that does not exist).
UTILITIES = [
    ("get_supported_tasks",),
    ("is_sleeping",),
    ("reset_prefix_cache",),
    ("reset_mm_cache",),
    ("reset_encoder_cache",),
    ("is_scheduler_paused",),
    ("list_loras",),
    ("get_weight_version",),
    ("execute_dummy_batch",),
    ("no_such_method",),
]


def scenario(rec: Recorder, timeout: float) -> None:
    """The script both engines run (greedy, seeded: each engine's first token is the same for
    the same prompt, so stop ids can be named before a request runs)."""
    rec.handshake(timeout)
    rec.step = "utility"
    for call in UTILITIES:
        rec.utility(*call)
    prompt = list(range(1000, 1010))
    greedy = {"temperature": 0.0, "seed": 7}
    rec.step = "length"
    rec.add("a", prompt, {**greedy, "max_tokens": 6})
    first = rec.run_until_finished({"a"}, 60)["a"]["tokens"][0][0]
    rec.step = "stop-token"
    rec.add("b", prompt, {**greedy, "max_tokens": 6, "stop_token_ids": [first]})
    rec.run_until_finished({"b"}, 60)
    rec.step = "eos"
    eos = {"_eos_token_id": first, "_all_stop_token_ids": [first]}
    rec.add("c", prompt, {**greedy, "max_tokens": 6, **eos})
    rec.run_until_finished({"c"}, 60)
    rec.step = "batch"
    for i, n in enumerate((4, 8, 12)):
        rec.add(f"batch-{i}", [2000 + i] * (5 + i), {**greedy, "max_tokens": n})
    rec.run_until_finished({"batch-0", "batch-1", "batch-2"}, 60)
    rec.step = "abort"
    rec.add("d", prompt, {**greedy, "max_tokens": 400})
    rec.collect(lambda m: any(o[0] == "d" for o in m[1]), 60)
    rec.abort(["d"])
    rec.utility("is_sleeping")  # (whatever the abort brings arrives before this answer)
    rec.step = "logprobs"
    rec.add("e", prompt, {**greedy, "max_tokens": 3, "logprobs": 2})
    rec.run_until_finished({"e"}, 60)
    rec.step = "prompt-logprobs"
    rec.add("f", prompt, {**greedy, "max_tokens": 2, "prompt_logprobs": 1})
    rec.run_until_finished({"f"}, 60)
    rec.step = "large-logprobs"  # arrays of 256 bytes and more travel in frames of their own
    rec.add("h", prompt, {**greedy, "max_tokens": 2, "logprobs": 20, "prompt_logprobs": 20})
    rec.run_until_finished({"h"}, 60)
    rec.step = "empty-abort"  # (tokenwire's liveness probe)
    rec.abort([])
    rec.utility("is_sleeping")


def record(argv_for: Any, out: Path, errors: list[str]) -> None:
    rec = Recorder()
    log = out.with_suffix(".log")
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            argv_for(rec.handshake_address),
            env=vllm_process_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        scenario(rec, START_TIMEOUT)
    except Exception as exc:  # reported by the test
        errors.append(f"{argv_for.__name__}: {exc!r}\n{log.read_text()[-3000:]}")
    finally:
        out.write_bytes(rec.record.dump())
        stop_process(proc, timeout=60)
        rec.close()


def real_engine(address: str) -> list[str]:
    port = address.rsplit(":", 1)[1]
    return [
        ENV["vllm"],
        "serve",
        ENV["model"],
        "--headless",
        "--data-parallel-size",
        "1",
        "--data-parallel-size-local",
        "1",
        "--data-parallel-address",
        "127.0.0.1",
        "--data-parallel-rpc-port",
        port,
        "--enforce-eager",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(MAX_LEN),
    ]


def mock_engine(address: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tokenwire",
        "mock-engine",
        "--handshake-address",
        address,
        "--tokenizer",
        ENV["model"],
        "--step-time-ms",
        "1",
        "--synthetic-output",
        "random",
        "--max-model-len",
        str(MAX_LEN),
        "--log-level",
        "warning",
    ]


def test_the_mock_engine_sends_what_a_real_vllm_engine_sends():
    with tempfile.TemporaryDirectory(prefix="tokenwire-fidelity-") as tmp:
        real, mock = Path(tmp) / "real.bin", Path(tmp) / "mock.bin"
        errors: list[str] = []
        threads = [
            threading.Thread(target=record, args=(real_engine, real, errors)),
            threading.Thread(target=record, args=(mock_engine, mock, errors)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, "\n".join(errors)
        out = subprocess.run(
            [ENV["python"], str(HERE / "vllm_fidelity_check.py"), str(real), str(mock)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        report = json.loads(out.stdout.strip().splitlines()[-1])
    real_count, mock_count = report["messages"]
    assert real_count > 20 and mock_count > 20
    assert not report["errors"], "\n".join(report["errors"])
