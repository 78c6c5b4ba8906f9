"""The reference in ``docs/`` covers every flag ``tokenwire serve --help`` shows, and every page
the README and the MkDocs navigation name exists."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from tokenwire.entrypoints.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _serve_flags() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [
        option
        for action in sub.choices["serve"]._actions
        if action.help is not argparse.SUPPRESS
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]


def test_every_serve_flag_is_in_the_reference():
    text = "\n".join(p.read_text() for p in sorted(DOCS.glob("*.md")))
    flags = _serve_flags()
    assert len(flags) > 50
    missing = [f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", text)]
    assert not missing, f"flags of `tokenwire serve --help` no page of docs/ mentions: {missing}"


def test_readme_and_navigation_name_existing_pages():
    readme = (ROOT / "README.md").read_text()
    linked = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert linked and all((ROOT / link).is_file() for link in linked), linked
    nav = re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    pages = {p.name for p in DOCS.glob("*.md")}
    assert set(nav) == pages, set(nav) ^ pages
