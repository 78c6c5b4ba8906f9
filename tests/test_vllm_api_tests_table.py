"""``scripts/vllm_api_tests.py``'s table: passed / failed / skipped per file and side, from the
sides' JUnit XML, and the tests that pass on stock vLLM only."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location(
        "vllm_api_tests", ROOT / "scripts" / "vllm_api_tests.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _xml(path: Path, cases: dict[str, str]) -> None:
    body = []
    for name, outcome in cases.items():
        inner = {
            "passed": "",
            "failed": '<failure message="AssertionError: assert 1 == 2">x</failure>',
            "error": '<error message="RuntimeError: the server exited">x</error>',
            "skipped": '<skipped message="no GPU" />',
        }[outcome]
        body.append(
            f'<testcase classname="tests.entrypoints.openai.test_basic" name="{name}">'
            f"{inner}</testcase>"
        )
    path.write_text(f"<testsuites><testsuite>{''.join(body)}</testsuite></testsuites>")


def test_table_counts_each_side(tmp_path: Path) -> None:
    script = _script()
    _xml(tmp_path / "stock.xml", {"a": "passed", "b": "passed", "c": "skipped", "d": "passed"})
    _xml(tmp_path / "tokenwire.xml", {"a": "passed", "b": "failed", "c": "skipped", "d": "error"})
    out = script.table(tmp_path, ["openai/test_basic.py"])
    assert "| openai/test_basic.py | 4 | 3 / 0 / 1 | 1 / 2 / 1 |" in out
    assert "| **all** | 4 | 3 / 0 / 1 | 1 / 2 / 1 |" in out
    assert "`tests.entrypoints.openai.test_basic::b`: AssertionError: assert 1 == 2" in out
    assert "`tests.entrypoints.openai.test_basic::d`: RuntimeError: the server exited" in out
    assert "::a`" not in out and "::c`" not in out


def test_a_file_is_not_counted_in_another_that_its_name_begins(tmp_path: Path) -> None:
    script = _script()
    (tmp_path / "stock.xml").write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.entrypoints.openai.chat_completion.test_chat" name="a" />'
        '<testcase classname="tests.entrypoints.openai.chat_completion.test_chat_echo" name="b" />'
        '<testcase classname="tests.entrypoints.openai.chat_completion.test_chat.TestX" name="c" />'
        "</testsuite></testsuites>"
    )
    files = ["openai/chat_completion/test_chat.py", "openai/chat_completion/test_chat_echo.py"]
    out = script.table(tmp_path, files)
    assert "| openai/chat_completion/test_chat.py | 2 | 2 / 0 / 0 |" in out
    assert "| openai/chat_completion/test_chat_echo.py | 1 | 1 / 0 / 0 |" in out
