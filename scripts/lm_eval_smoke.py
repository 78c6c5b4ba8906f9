"""Run ``lm-eval --model local-completions`` on a tiny local multiple-choice task against a
``tokenwire serve`` it starts (the synthetic engine): the loglikelihood path end to end (token-id
prompts, ``echo``, ``logprobs``). Needs ``lm-eval`` and ``transformers`` (for the tokenizer);
prints lm-eval's table. The accuracy is the synthetic engine's chance level: the point is that
every request is answered in the shape lm-eval reads.

    pip install lm-eval transformers && python scripts/lm_eval_smoke.py
"""

from __future__ import annotations

import json
import lzma
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib import resources
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "tests" / "data" / "lm_eval" / "mc.jsonl"

TASK = """task: tokenwire_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def _tokenizer_dir(dest: Path) -> Path:
    """The bundled Qwen3 tokenizer, unpacked where ``transformers`` can read it."""
    src = resources.files("tokenwire") / "_data" / "qwen3"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer.json").write_bytes(lzma.decompress((src / "tokenizer.json.xz").read_bytes()))
    for name in ("tokenizer_config.json", "config.json"):
        (dest / name).write_bytes((src / name).read_bytes())
    return dest


def main() -> int:
    if shutil.which("lm_eval") is None and shutil.which("lm-eval") is None:
        print("lm-eval is not installed (pip install lm-eval transformers)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        tok_dir = _tokenizer_dir(tmpdir / "tokenizer")
        tasks = tmpdir / "tasks"
        tasks.mkdir()
        (tasks / "tokenwire_mc.yaml").write_text(TASK.format(data=DATA))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tokenwire",
                "serve",
                "--port",
                str(port),
                "--step-time-ms",
                "0",
                "--served-model-name",
                "qwen3-synthetic",
                "--log-level",
                "warning",
            ]
        )
        try:
            for _ in range(300):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.1)
            out = tmpdir / "out"
            cmd = [
                shutil.which("lm_eval") or "lm-eval",
                "--model",
                "local-completions",
                "--model_args",
                f"base_url=http://127.0.0.1:{port}/v1/completions,model=qwen3-synthetic,"
                f"tokenizer={tok_dir},tokenizer_backend=huggingface,num_concurrent=1,"
                "max_retries=1,tokenized_requests=True",
                "--tasks",
                "tokenwire_mc",
                "--include_path",
                str(tasks),
                "--output_path",
                str(out),
            ]
            done = subprocess.run(cmd, check=False)
            for f in out.rglob("results*.json"):
                print(json.dumps(json.loads(f.read_text())["results"], indent=2))
            return done.returncode
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    sys.exit(main())
