"""A tool call the output never closes (a long string argument cut by the token limit, or a
model that runs on) costs each parser time linear in its length: 80,000 characters take about
four times what 20,000 do, never the sixteen of a parser that re-reads or re-copies its text at
every token.

The check is a ratio measured in one run: the time the last 20,000 characters of an
80,000-character call take against the first 20,000's, each quarter timed by its cheapest
1,000-character slice (over two streams), since a loaded machine only ever adds time. Linear is
1; a parser that copies the call's text at each token pays 3 to 20 times as much (measured on
today's main), so the bound of 2 holds on a loaded 2-core machine.
"""

from __future__ import annotations

import time

import pytest

from parser_corpus import TOOL_FORMATS
from tokenwire.parsers import TOOL_CALL_PARSERS

#: One family per machine, and every JSON family (their arguments stream as JSON text).
FAMILIES = [
    "hermes",
    "internlm",
    "granite",
    "granite-20b-fc",
    "jamba",
    "phi4_mini_json",
    "xlam",
    "gigachat3",
    "llama3_json",
    "mistral",
    "deepseek_v3",
    "kimi_k2",
    "qwen3_coder",
    "olmo3",
    "functiongemma",
    "pythonic",
    "openai",
]
#: A token's text: two characters, one past the BMP, so every copy of a string costs 4 bytes
#: a character (CJK and emoji in a file's content are what models write).
PIECE = "雨🌧"
SHORT, LONG = 20_000, 80_000
#: Timed slices: a quarter's cost is its cheapest slice's (load only ever adds time).
SLICE = 1_000
BOUND = 2.0
TRIES = 2


def _head(name: str) -> str:
    """The family's markup up to the start of a string argument's value."""
    call = ("write_file", {"path": "a.txt", "content": "CUT-HERE"})
    return TOOL_FORMATS[name].render([call]).split("CUT-HERE")[0]


def _quarters(name: str, head: str) -> list[float]:
    """Per 20,000 characters of an 80,000-character unclosed call, the least time any
    1,000-character slice of them took (a slice the machine's load did not interrupt)."""
    parser = TOOL_CALL_PARSERS[name]()
    parser.feed(head)
    out = []
    pushes = SLICE // len(PIECE)
    for _ in range(LONG // SHORT):
        best = float("inf")
        for _ in range(SHORT // SLICE):
            t0 = time.perf_counter()
            for _ in range(pushes):
                parser.feed(PIECE)
            best = min(best, time.perf_counter() - t0)
        out.append(best)
    parser.finish()
    return out


@pytest.mark.parametrize("name", FAMILIES)
def test_unclosed_call_is_linear(name: str) -> None:
    """The last 20,000 characters of an 80,000-character call cost what its first 20,000 did
    (a parser quadratic in the call's length pays several times as much for them)."""
    head = _head(name)
    first = last = float("inf")
    for _ in range(TRIES):
        quarters = _quarters(name, head)
        first, last = min(first, quarters[0]), min(last, quarters[-1])
    ratio = last / first
    assert ratio < BOUND, f"{name}: the last {SHORT} of {LONG} characters took {ratio:.1f}x"


def test_unclosed_call_streams_its_arguments() -> None:
    """The families that stream arguments send the unclosed string as it comes (nothing held
    back but a piece's worth)."""
    for name in ("hermes", "jamba", "llama3_json", "mistral", "deepseek_v3", "qwen3_coder"):
        parser = TOOL_CALL_PARSERS[name]()
        sent = sum(len(c.arguments) for c in parser.feed(_head(name)).calls)
        for _ in range(1000):
            sent += sum(len(c.arguments) for c in parser.feed(PIECE).calls)
        assert sent >= 2000 - len(PIECE), name
