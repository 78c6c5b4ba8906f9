"""Stop-regex search time against text length: RE2 (tokenwire) vs Python ``re`` (SGLang's matcher).

    python bench/regex.py

SGLang's catastrophic patterns are searched over adversarial text of growing length. tokenwire's
admitted patterns (RE2) take time linear in the text: ns per character stays flat as the text grows
100x. Python's backtracking ``re`` is shown on short texts, where it already grows exponentially.
"""

from __future__ import annotations

import multiprocessing as mp
import re
import time

from tokenwire.messages.regex import admit_stop_regex

PATTERNS = [r"(?:a+)+b", r"(?:.|.)*Z", r"a*a*a*a*a*a*a*a*b", r"(?:.*){20}Z", r"(?:.?){255}Z"]
SIZES = [10_000, 100_000, 1_000_000]
PY_SIZES = [8, 12, 16, 20, 24]
PY_LIMIT_S = 2.0


def best_of(fn, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    print("RE2 via tokenwire.admit_stop_regex: search time over 'a' * n (no match)\n")
    print("| pattern | max_len | " + " | ".join(f"n={n:,} ns/char" for n in SIZES) + " | growth |")
    print("|---|---:|" + "---:|" * len(SIZES) + "---:|")
    for p in PATTERNS:
        admitted = admit_stop_regex(p)
        per_char = []
        for n in SIZES:
            text = "a" * n
            per_char.append(best_of(lambda t=text, a=admitted: a.search(t)) / n * 1e9)
        growth = per_char[-1] / per_char[0]
        cells = " | ".join(f"{x:.2f}" for x in per_char)
        print(f"| `{p}` | {admitted.max_len} | {cells} | {growth:.2f}x |")
    print(f"\nPython re (backtracking), same patterns, short texts (killed after {PY_LIMIT_S} s)\n")
    print("| pattern | " + " | ".join(f"n={n} µs" for n in PY_SIZES) + " |")
    print("|---|" + "---:|" * len(PY_SIZES))
    for p in PATTERNS:
        cells = []
        over = False
        for n in PY_SIZES:
            t = None if over else _python_re_time(p, n)
            over = t is None
            cells.append(f"> {PY_LIMIT_S * 1e6:.0f}" if t is None else f"{t * 1e6:.0f}")
        print(f"| `{p}` | " + " | ".join(cells) + " |")


def _python_re_worker(pattern: str, n: int, out) -> None:
    compiled = re.compile(pattern)
    text = "a" * n
    t0 = time.perf_counter()
    compiled.search(text)
    out.put(time.perf_counter() - t0)


def _python_re_time(pattern: str, n: int) -> float | None:
    """Seconds Python's re takes for one search, or None past the limit (the search is killed)."""
    out: mp.Queue = mp.Queue()
    proc = mp.Process(target=_python_re_worker, args=(pattern, n, out))
    proc.start()
    proc.join(PY_LIMIT_S)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return None
    return out.get()


if __name__ == "__main__":
    main()
