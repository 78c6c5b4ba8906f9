"""The layers of the architecture page (docs/architecture.md) hold: each layer imports only those
below it, and no package's modules import each other in a cycle (import-linter, contracts in
pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_LINT = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"
)


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter over the package under ``root/src`` with ``root``'s contracts."""
    return subprocess.run(
        [sys.executable, "-c", _LINT],
        cwd=root,
        env={"PYTHONPATH": str(root / "src"), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_layer_imports_only_those_below_it_and_no_package_has_a_cycle():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # the engine layer reaching up into the HTTP server
        ("engine/synthetic.py", "import tokenwire.server.app", "layers"),
        # the runtime reaching up into the HTTP server
        ("runtime/plan.py", "import tokenwire.server.http", "layers"),
        # the tokenizer reaching up into detokenization
        ("tokenizer.py", "import tokenwire.detok.tables", "layers"),
        # two modules of one package importing each other
        ("shard/request.py", "import tokenwire.shard.shard", "cycles"),
    ],
)
def test_an_import_against_the_order_breaks_a_contract(tmp_path, module, line, broken):
    shutil.copytree(ROOT / "src" / "tokenwire", tmp_path / "src" / "tokenwire")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / "src" / "tokenwire" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    out = _lint(tmp_path)
    assert out.returncode != 0
    name = "layers: entry points" if broken == "layers" else "no import cycles"
    verdicts = [line for line in out.stdout.splitlines() if line.startswith(name)]
    assert verdicts and verdicts[0].endswith("BROKEN"), out.stdout
