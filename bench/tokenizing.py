"""Prompt tokenization: µs per prompt, tokenwire's path and those before it, one run, side by side.

    python bench/tokenizing.py [tokenizer ...]      (default: qwen3 llama3 gptoss claude; those not
                                                     in the shared folder are left out, but qwen3)

Texts, each given to the encoder as a fresh string (as a request's parsed body gives it, so no
call finds another's UTF-8 copy cached):

- ``long``: ``bench/frontend.py``'s 8,000-token prompt (the test corpus: a dozen languages, runs of
  spaces and tabs);
- ``prose``: the project's documentation as ASCII paragraphs (words one space apart, a blank line
  between paragraphs);
- ``code``: the package's own Python source (an indented line after each line break).

Rows: Hugging Face ``tokenizers``' own encode (no offsets); tokenwire's tiktoken path with the
tokenizer's regex as it is (its look-ahead ending, the path before round 10); and ``encode`` as
it is now (the regex without the look-ahead over the text cut where the look-ahead shortens a
run; see ``tokenwire/fast_bpe.py``). Every row's ids are checked against the first's. The ratio
is to the look-ahead row.
Environment: RUNS=7 (the best is reported), COPIES=20 (strings a run), CHARS=30000 (prose, code).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from workload import TOKENIZERS, load_tokenizer

REPO = Path(__file__).resolve().parent.parent
RUNS = int(os.environ.get("RUNS", "7"))
COPIES = int(os.environ.get("COPIES", "20"))
CHARS = int(os.environ.get("CHARS", "30000"))


def texts() -> dict[str, str]:
    """The three texts (see the module docstring)."""
    sys.path.append(str(REPO / "bench"))
    import frontend

    docs = " ".join(
        (REPO / "docs" / name).read_text(encoding="utf-8")
        for name in sorted(os.listdir(REPO / "docs"))
        if name.endswith(".md")
    )
    paragraphs = docs.encode("ascii", "ignore").decode().split("\n\n")
    prose = "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())[:CHARS]
    source = sorted((REPO / "src" / "tokenwire").rglob("*.py"))
    code = "".join(p.read_text(encoding="utf-8") for p in source)[:CHARS]
    return {"long": frontend.long_prompts(1, frontend.LONG_PROMPT)[0], "prose": prose, "code": code}


def encoders(tok) -> dict[str, Callable[[str], list[int]]]:
    """The rows' encoders for one tokenizer (no special tokens added)."""
    import tiktoken

    from tokenwire.fast_bpe import FastBpe, _pattern, _ranks

    hf = tok.hf
    fast_hf = getattr(hf, "encode_batch_fast", None)
    rows: dict[str, Callable[[str], list[int]]] = {
        "tokenizers": (lambda t: fast_hf([t], add_special_tokens=False)[0].ids)
        if fast_hf is not None
        else (lambda t: hf.encode(t, add_special_tokens=False).ids)
    }
    fast = tok.fast_bpe()
    if fast is not None:
        spec = json.loads(hf.to_str())
        pattern = _pattern(spec["pre_tokenizer"])
        ranks = _ranks(spec["model"]["vocab"])
        assert pattern is not None and ranks is not None
        full = tiktoken.Encoding(
            name="look-ahead", pat_str=pattern, mergeable_ranks=ranks, special_tokens={}
        )
        before = FastBpe(full.encode_ordinary, fast._normalize, fast._added, [], [])
        rows["tiktoken, look-ahead"] = lambda t: before.encode(t, False)
        rows["tokenwire"] = lambda t: tok.encode(t, add_special_tokens=False)
    return rows


def time_rows(rows: dict[str, Callable[[str], list[int]]], text: str) -> dict[str, float]:
    """Each row's best µs per text over ``RUNS`` runs of ``COPIES`` fresh strings, the rows taking
    turns within each run (each first encodes one string untimed)."""
    bodies = [json.dumps(f"{i} {text}") for i in range(COPIES)]
    best = dict.fromkeys(rows, float("inf"))
    for _ in range(RUNS):
        for row, encode in rows.items():
            strings = [json.loads(b) for b in bodies]
            encode(json.loads(bodies[0]))  # (its tables back in the caches the row before used)
            t0 = time.perf_counter()
            for s in strings:
                encode(s)
            best[row] = min(best[row], (time.perf_counter() - t0) / COPIES * 1e6)
    return best


def main() -> None:
    names = sys.argv[1:] or ["qwen3", "llama3", "gptoss", "claude"]
    names = [n for n in names if n == "qwen3" or (TOKENIZERS / n / "tokenizer.json").is_file()]
    sample = texts()
    print("| tokenizer | text | chars | tokens | encoder | µs per prompt | x vs look-ahead |")
    print("|---|---|---:|---:|---|---:|---:|")
    for name in names:
        tok = load_tokenizer(name)
        rows = encoders(tok)
        for label, text in sample.items():
            want = rows["tokenizers"](text)
            for row, encode in rows.items():
                if encode(text) != want:
                    sys.exit(f"{name}, {label}: {row}'s ids differ from tokenizers'")
            times = time_rows(rows, text)
            base = times.get("tiktoken, look-ahead")
            for row, us in times.items():
                ratio = f"{us / base:.2f}x" if base else "-"
                print(
                    f"| {name} | {label} | {len(text)} | {len(want)} | {row} | {us:.0f} | {ratio} |"
                )


if __name__ == "__main__":
    main()
