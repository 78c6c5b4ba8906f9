"""The benchmark workload: the peers' ``common.py`` token streams, on any tokenizer.

Where ``../shared/peers`` exists its ``common.py`` defines the workload (corpus, 256-token prompts,
200 generated ids per request, slices on character boundaries, seed 1234), so tokenwire lands in the
same table as vLLM and SGLang. Elsewhere the same recipe runs on the test corpus bundled here.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = Path(os.environ.get("TOKENWIRE_SHARED_DIR", REPO.parent / "shared"))
PEERS = SHARED / "peers"
TOKENIZERS = SHARED / "tokenizers"

PROMPT_LEN = 256
STEPS = 200
BATCHES = (64, 256, 1024)
STOP = "\n\nHuman:"

MODEL_VOCAB = {"qwen3": 151936, "gemma3": 262208, "deepseek_v3": 129280, "gptoss": 201088}


def load_tokenizer(name: str):
    """A real tokenizer by folder name: the shared folder, else the bundled Qwen3."""
    from tokenwire import Tokenizer

    path = TOKENIZERS / name / "tokenizer.json"
    if path.is_file():
        return Tokenizer.from_file(path, model_vocab_size=MODEL_VOCAB.get(name))
    if name == "qwen3":
        return Tokenizer.default()
    sys.exit(f"tokenizer {name!r} not found under {TOKENIZERS} (set TOKENWIRE_SHARED_DIR)")


def _peers_common():
    if not (PEERS / "common.py").is_file():
        return None
    sys.path.insert(0, str(PEERS))
    import common  # type: ignore[import-not-found]

    return common


def corpus_text() -> str:
    common = _peers_common()
    if common is not None:
        return common.corpus_text()
    return (REPO / "tests" / "data" / "corpus.txt").read_text(encoding="utf-8") * 8


def workload(tok, batch: int, seed: int = 1234) -> list[tuple[list[int], list[int]]]:
    """``batch`` requests of (prompt ids, generated ids), as the peers' ``common.workload`` builds
    them: slices of the encoded corpus that start and end on character boundaries."""
    enc = tok.hf.encode(corpus_text(), add_special_tokens=False)
    ids = list(enc.ids)
    offs = enc.offsets
    ok = [True] + [offs[i][0] != offs[i - 1][0] for i in range(1, len(offs))]
    n = len(ids)
    pstarts = [i for i in range(n - PROMPT_LEN - 1) if ok[i] and ok[i + PROMPT_LEN]]
    gstarts = [i for i in range(n - STEPS - 1) if ok[i] and ok[i + STEPS]]
    rng = random.Random(seed)

    def draw(starts: list[int], length: int) -> int:
        while True:
            i = rng.choice(starts)
            if "\ufffd" not in tok.hf.decode(ids[i : i + length], skip_special_tokens=False):
                return i

    out = []
    for _ in range(batch):
        p = draw(pstarts, PROMPT_LEN)
        g = draw(gstarts, STEPS)
        out.append((ids[p : p + PROMPT_LEN], ids[g : g + STEPS]))
    return out


def record(impl: str, batch: int, seconds: list[float], extra: dict | None = None) -> dict:
    """A JSON line in the peers' shape (µs per generated token)."""
    ntok = batch * STEPS
    us = [t / ntok * 1e6 for t in seconds]
    rec = {
        "impl": impl,
        "B": batch,
        "steps": STEPS,
        "tokens_per_run": ntok,
        "us_per_token_runs": [round(u, 4) for u in us],
        "us_per_token_median": round(statistics.median(us), 4),
    }
    if extra:
        rec.update(extra)
    print(json.dumps(rec), flush=True)
    return rec


def table(rows: list[dict], baseline: str, title: str) -> None:
    """Markdown table: µs/token per implementation and batch size, and the ratio to ``baseline``."""
    by_impl: dict[str, dict[int, float]] = {}
    for r in rows:
        by_impl.setdefault(r["impl"], {})[r["B"]] = r["us_per_token_median"]
    batches = sorted({r["B"] for r in rows})
    print(f"\n{title}\n")
    head = " | ".join(f"B={b} µs/tok (x vs {baseline})" for b in batches)
    print(f"| implementation | {head} |")
    print("|---|" + "---:|" * len(batches))
    base = by_impl.get(baseline, {})
    for impl, cells in by_impl.items():
        out = []
        for b in batches:
            if b not in cells:
                out.append("-")
                continue
            ratio = base[b] / cells[b] if b in base and cells[b] else float("nan")
            out.append(f"{cells[b]:.3f} ({ratio:.1f}x)")
        print(f"| {impl} | " + " | ".join(out) + " |")
