"""The compiled build (``setup.py``: mypyc) and its switch to plain Python: ``setup.py`` compiles
the modules ``tokenwire._pure`` names, a compiled build runs them compiled (CI's second pass sets
``TOKENWIRE_EXPECT_COMPILED=1`` over ``pip install .``), and ``TOKENWIRE_PURE_PYTHON=1`` runs
any build as plain Python."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from tokenwire import _pure

REPO = Path(__file__).resolve().parents[1]


def _compiled_in_subprocess(**env: str) -> list[str]:
    code = "import json, tokenwire._pure as p; print(json.dumps(p.compiled_modules()))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO / "tests",  # (not the repository root: the installed tokenwire)
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_setup_compiles_the_modules_the_switch_knows():
    tree = ast.parse((REPO / "setup.py").read_text())
    listed = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMPILED"
    )
    paths = [elt.value for elt in listed.elts]  # type: ignore[attr-defined]
    assert [p.removesuffix(".py").replace("/", ".") for p in paths] == list(_pure.COMPILED)
    for path in paths:
        assert (REPO / "src" / path).exists()


def test_the_build_runs_compiled_when_expected_and_plain_when_asked():
    expected = os.environ.get("TOKENWIRE_EXPECT_COMPILED") == "1"
    got = _compiled_in_subprocess(TOKENWIRE_PURE_PYTHON="0")
    if expected:
        assert got == list(_pure.COMPILED)
    assert _compiled_in_subprocess(TOKENWIRE_PURE_PYTHON="1") == []
