"""What each mypyc-compiled module gains: its per-chunk calls, compiled against the same modules
as plain Python (``TOKENWIRE_PURE_PYTHON=1``), in alternating subprocesses of one run.

    pip install .                  # a compiled build (setup.py)
    python bench/compiled.py       # with that build's Python

Each case is a module's work per streamed token (ns per call, this process's CPU time, the best
of ``REPEATS`` passes over 20,000 pieces of text; the median over ``ROUNDS`` rounds):

- ``parsers/reasoning + output``: ``OutputParser.feed`` of a qwen3 output in its thinking and in
  its answer, and the fast path ``feed_plain`` in its thinking;
- ``parsers/markers``: ``find_marker`` over a piece;
- ``shard/holdback``: ``HoldBack.push`` for one stop string;
- ``server/openai/chunks``: ``ChunkWriter.text_delta`` (a chat content delta's bytes).

Environment: ROUNDS=3, REPEATS=3.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

# bench/ off the path (bench/http.py is no ``http``)
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

ROUNDS = int(os.environ.get("ROUNDS", "3"))
REPEATS = int(os.environ.get("REPEATS", "3"))
WORDS = [" the", " fox", " jumps", "<", " over", "\n", " lazy", " dog", ".", " a<b", "é"]


def _cases() -> dict[str, float]:
    from tokenwire import Tokenizer
    from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
    from tokenwire.parsers.markers import find_marker
    from tokenwire.parsers.output import OutputParser
    from tokenwire.parsers.reasoning import Qwen3ReasoningParser
    from tokenwire.server import ServerConfig, create_app
    from tokenwire.server.openai.chunks import ChunkWriter
    from tokenwire.server.openai.parse import parse_chat
    from tokenwire.shard.holdback import HoldBack

    rng = random.Random(1)
    pieces = [rng.choice(WORDS) for _ in range(20000)]
    tok = Tokenizer.default()
    rt = create_app(tok, SyntheticEngine(tok, SyntheticConfig()), ServerConfig()).runtime
    body = {"model": "tokenwire", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    writer = ChunkWriter(parse_chat(body, tok, rt.models), (0,))

    def thinking() -> None:
        p = OutputParser(Qwen3ReasoningParser(), None)
        p.feed("<think>", [1])
        for t in pieces:
            p.feed(t, [1])

    def thinking_plain() -> None:
        p = OutputParser(Qwen3ReasoningParser(), None)
        p.feed("<think>", [1])
        for t in pieces:
            if not p.feed_plain(t, 1):
                p.feed(t, [1])

    def answer() -> None:
        p = OutputParser(Qwen3ReasoningParser(), None)
        p.feed("Hello", [1])
        for t in pieces:
            p.feed(t, [1])

    def markers() -> None:
        for t in pieces:
            find_marker("abc" + t, ("</think>",))

    def holdback() -> None:
        h = HoldBack(("\n\nHuman:",))
        for t in pieces:
            h.push(h.held + t)

    def chunks() -> None:
        for t in pieces:
            writer.text_delta(0, ("content",), t, 1)

    cases = {
        "parsers/reasoning + output: feed, thinking": thinking,
        "parsers/reasoning + output: feed_plain, thinking": thinking_plain,
        "parsers/reasoning + output: feed, answer": answer,
        "parsers/markers: find_marker": markers,
        "shard/holdback: HoldBack.push": holdback,
        "server/openai/chunks: text_delta": chunks,
    }
    out = {}
    for name, fn in cases.items():
        best = float("inf")
        for _ in range(REPEATS):
            t0 = time.process_time_ns()
            fn()
            best = min(best, (time.process_time_ns() - t0) / len(pieces))
        out[name] = best
    return out


def main() -> None:
    if sys.argv[1:] == ["--worker"]:
        from tokenwire._pure import compiled_modules

        print(json.dumps({"compiled": compiled_modules(), "ns": _cases()}))
        return
    runs: dict[str, list[dict[str, float]]] = {"compiled": [], "pure": []}
    got_compiled: list[str] = []
    for r in range(ROUNDS):
        order = ["compiled", "pure"] if r % 2 == 0 else ["pure", "compiled"]
        for kind in order:
            env = dict(os.environ, TOKENWIRE_PURE_PYTHON="1" if kind == "pure" else "0")
            out = subprocess.run(
                [sys.executable, __file__, "--worker"], env=env, capture_output=True, text=True
            )
            if out.returncode:
                raise SystemExit(out.stderr[-3000:])
            got = json.loads(out.stdout.strip().splitlines()[-1])
            if kind == "compiled":
                got_compiled = got["compiled"]
            runs[kind].append(got["ns"])
    if not got_compiled:
        print("note: this tokenwire is not a compiled build (pip install .): both columns are pure")
    print(f"\ncompiled: {', '.join(got_compiled) or 'none'}\n")
    print("| case | compiled ns | pure Python ns | pure / compiled |")
    print("|---|---:|---:|---:|")
    for name in runs["compiled"][0]:
        c = sorted(x[name] for x in runs["compiled"])[ROUNDS // 2]
        p = sorted(x[name] for x in runs["pure"])[ROUNDS // 2]
        print(f"| {name} | {c:.0f} | {p:.0f} | {p / c:.2f} |")


if __name__ == "__main__":
    main()
