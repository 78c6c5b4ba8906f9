"""The tables of ``docs/parsers.md`` that the parser corpus and its difference lists give: per
parser, its outputs and how many of them vLLM's and SGLang's parsers agree with; per reason, the
cases. ``test_parser_diff.test_docs_say_why_they_differ`` checks the file holds them.

    python tests/parser_docs.py     # rewrite the generated part of docs/parsers.md
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from parser_corpus import CASES, Case
from tokenwire.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from tokenwire.parsers.names import REASONING_PARSER_ALIASES, TOOL_PARSER_ALIASES

DOCS = Path(__file__).resolve().parent.parent / "docs" / "parsers.md"
BEGIN = "<!-- parser tables: written by tests/parser_docs.py -->"
END = "<!-- end of parser tables -->"


def _parser(case: Case) -> tuple[str, str]:
    return ("tool", case.tool) if case.tool else ("reasoning", case.reasoning or "")


def render(
    vllm: dict[str, tuple[tuple[str, ...], str]],
    sglang: dict[str, tuple[tuple[str, ...], str]],
    reasons: dict[str, str],
    missing: Callable[[Case, str], bool],
) -> str:
    """The generated part of docs/parsers.md."""
    rows: dict[tuple[str, str], list[Case]] = defaultdict(list)
    for case in CASES:
        rows[_parser(case)].append(case)
    out = [BEGIN, ""]
    for title, registry, aliases in (
        ("`--tool-call-parser`", TOOL_CALL_PARSERS, TOOL_PARSER_ALIASES),
        ("`--reasoning-parser`", REASONING_PARSERS, REASONING_PARSER_ALIASES),
    ):
        by: dict[str, list[str]] = defaultdict(list)
        for alias, (name, whose) in sorted(aliases.items()):
            by[name].append(f"`{alias}` ({whose})")
        out += [f"#### {title} names", "", "| tokenwire (vLLM's name) | peers' names for it |"]
        out.append("|---|---|")
        for name in sorted(registry):
            out.append(f"| `{name}` | {', '.join(by.get(name, [])) or '—'} |")
        out.append("")
    total = len(CASES)
    n_v = sum(not missing(c, "vLLM") for c in CASES)
    n_s = sum(not missing(c, "SGLang") for c in CASES)
    out.append(
        f"Of {total} outputs, vLLM 0.32 has parsers for {n_v} and differs on {len(vllm)}; "
        f"SGLang 0.5.23 has parsers for {n_s} and differs on {len(sglang)} (in at least one of "
        "the whole, token and chunked runs). Each difference is a peer's bug tokenwire does not "
        "have, or a place where tokenwire answers the same whole and streamed and the peer does "
        "not (reasons below)."
    )
    for kind, title in (("tool", "Tool-call parsers"), ("reasoning", "Reasoning parsers")):
        out += ["", f"#### {title}", ""]
        out.append("| parser | outputs | agree with vLLM | agree with SGLang | reasons where not |")
        out.append("|---|---|---|---|---|")
        for (k, name), cases in sorted(rows.items()):
            if k != kind:
                continue
            cells = []
            why: list[str] = []
            for peer, diffs in (("vLLM", vllm), ("SGLang", sglang)):
                if all(missing(c, peer) for c in cases):
                    cells.append("no parser")
                    continue
                run = [c for c in cases if not missing(c, peer)]
                agree = sum(c.id not in diffs for c in run)
                cells.append(f"{agree} of {len(run)}")
                why += [diffs[c.id][1] for c in run if c.id in diffs]
            reasons_cell = ", ".join(f"`{r}`" for r in dict.fromkeys(why)) or "—"
            out.append(f"| `{name}` | {len(cases)} | {cells[0]} | {cells[1]} | {reasons_cell} |")
    out += ["", "#### Why they differ", ""]
    for reason, text in reasons.items():
        parts = []
        for peer, diffs in (("vLLM", vllm), ("SGLang", sglang)):
            ids = [c for c, (_, r) in diffs.items() if r == reason]
            if ids:
                parts.append(f"{peer}: " + ", ".join(f"`{c}`" for c in ids))
        out.append(f"- `{reason}`: {text}. " + "; ".join(parts) + ".")
    out += ["", END]
    return "\n".join(out)


def main() -> int:
    from test_parser_diff import DIFFERENCES, REASONS, SGLANG_DIFFERENCES, _missing

    text = DOCS.read_text(encoding="utf-8")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    DOCS.write_text(
        before + render(DIFFERENCES, SGLANG_DIFFERENCES, REASONS, _missing) + after,
        encoding="utf-8",
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
