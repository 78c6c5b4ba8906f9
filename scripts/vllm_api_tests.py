"""Run a set of vLLM's own API-server tests against stock ``vllm serve`` and against
``tokenwire serve --engine vllm``, over the same CPU engine and tiny model, and print the table.

The test files are vLLM 0.32.0's, kept as vLLM wrote them (``vllm_api_tests/upstream/``, from
vLLM's source distribution; Apache-2.0, see the LICENSE there). The harness
(``vllm_api_tests/harness/``) is tokenwire's: its ``RemoteOpenAIServer`` starts the server under
test for each test module, serving the tiny model under whatever name the test asks for, and its
conftest keeps the hub out (every model and adapter a test names is the tiny model and its LoRA
adapter). The tests run in the vLLM CPU environment's Python (they import vLLM's own request
classes), with pytest installed beside it in a folder of its own.

    flock /tmp/tw-heavy.lock python scripts/vllm_api_tests.py            # both, then the table
    python scripts/vllm_api_tests.py --servers tokenwire -k test_basic     # one side, some files
    python scripts/vllm_api_tests.py --table-only                          # the last runs' table

It starts a real server per test module and side (stock ``vllm serve`` takes about three minutes
to start here), so a whole run takes tens of minutes: it is not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
UPSTREAM = HERE / "vllm_api_tests" / "upstream"
HARNESS = HERE / "vllm_api_tests" / "harness"
FILES = [
    "openai/completion/test_completion.py",
    "openai/chat_completion/test_chat.py",
    "openai/test_stop_token_ids.py",
    "openai/chat_completion/test_chat_echo.py",
    "openai/test_return_token_ids.py",
    "openai/test_return_tokens_as_ids.py",
    "serve/tokenize/test_tokenization.py",
    "serve/instrumentator/test_basic.py",
    "serve/instrumentator/test_metrics.py",
    "serve/lora/test_lora_adapters.py",
]
#: vLLM's own test requirements (requirements/test/cpu.txt of its 0.32.0 source).
DEPS = ["pytest==9.1.0", "pytest-asyncio==1.4.0"]
SERVERS = ("stock", "tokenwire")


def _env_paths() -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "vllm_cpu_env.py")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _deps(python: str, where: Path) -> Path:
    """pytest for the vLLM environment's Python, in a folder of its own (the environment itself
    is left as it is)."""
    marker = where / ".complete"
    if not marker.exists() or marker.read_text() != " ".join(DEPS):
        shutil.rmtree(where, ignore_errors=True)
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "--target", str(where), *DEPS], check=True
        )
        marker.write_text(" ".join(DEPS))
    return where


def _tree(dest: Path) -> Path:
    """vLLM's test files under a ``tests`` package, with the harness's ``utils`` and conftest."""
    tests = dest / "tests"
    shutil.copytree(UPSTREAM / "tests", tests)
    for folder in [tests, *(p for p in tests.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    shutil.copy(HARNESS / "utils.py", tests / "utils.py")
    shutil.copy(HARNESS / "conftest.py", tests / "conftest.py")
    return tests


def run(
    server: str, files: list[str], out: Path, paths: dict[str, str], keyword: str | None
) -> subprocess.Popen:
    """Start one side's run (the caller waits for it)."""
    python = paths["python"]
    deps = _deps(python, Path(paths["python"]).parent.parent.parent / "api-test-deps")
    tokenwire = shutil.which("tokenwire", path=str(Path(sys.executable).parent)) or "tokenwire"
    tmp = tempfile.mkdtemp(prefix=f"vllm-api-tests-{server}-")
    _tree(Path(tmp))
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(deps), tmp]),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_API_SERVER=server,
        VLLM_API_MODEL=paths["model"],
        VLLM_API_LORA=paths["lora"],
        VLLM_API_VLLM=paths["vllm"],
        VLLM_API_TOKENWIRE=tokenwire,
        VLLM_API_LOGS=str(out / "logs"),
        VLLM_TARGET_DEVICE="cpu",
    )
    # (a run of some files or tests adds to the last whole run's results: see _results)
    part = "" if files == FILES and not keyword else f"-{int(time.time())}"
    xml = out / f"{server}{part}.xml"
    argv = [
        python, "-m", "pytest", *(f"tests/entrypoints/{f}" for f in files),
        "-p", "no:cacheprovider", "-q", "-rN", f"--junitxml={xml}",
    ]  # fmt: skip
    if keyword:
        argv += ["-k", keyword]
    print(f"== {server}: {len(files)} files", flush=True)
    log = open(out / f"{server}-pytest.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc.tmp = tmp  # type: ignore[attr-defined]
    return proc


def _results(out_dir: Path, server: str) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, short message), from the server's whole run and then its partial
    runs, the later ones overriding."""
    out: dict[str, tuple[str, str]] = {}
    runs = sorted(out_dir.glob(f"{server}-*.xml"), key=lambda p: p.stat().st_mtime)
    whole = out_dir / f"{server}.xml"
    for xml in [whole, *runs] if whole.exists() else runs:
        out.update(_cases(xml))
    return out


def _cases(xml: Path) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error"}.get(tag, tag)
                message = ((node.get("message") or "").splitlines() or [""])[0][:160]
        out[name] = (outcome, message)
    return out


def _in_module(test: str, mod: str) -> bool:
    """Whether ``test`` (``classname::name``) is in module ``mod`` (``test_chat`` is not
    ``test_chat_echo``; a class's tests are ``mod.Class``)."""
    cls = test.split("::")[0]
    return cls == mod or cls.startswith(mod + ".")


def _counts(res: dict[str, tuple[str, str]], ids: list[str]) -> tuple[int, int, int]:
    """(passed, failed, skipped) of ``ids`` in one side's results; an error (a fixture's, such
    as a server that did not start) counts as failed, a test the side never ran as neither."""
    outcomes = [res[t][0] for t in ids if t in res]
    return (
        outcomes.count("passed"),
        outcomes.count("failed") + outcomes.count("error"),
        outcomes.count("skipped"),
    )


def table(out: Path, files: list[str]) -> str:
    res = {s: _results(out, s) for s in SERVERS}
    lines = [
        "| test file | tests | stock passed / failed / skipped "
        "| tokenwire passed / failed / skipped |",
        "|---|---|---|---|",
    ]
    totals = [0] + [0] * 3 * len(SERVERS)
    for f in files:
        mod = "tests.entrypoints." + f[:-3].replace("/", ".")
        ids = sorted({t for r in res.values() for t in r if _in_module(t, mod)})
        row = [len(ids)] + [n for s in SERVERS for n in _counts(res[s], ids)]
        totals = [a + b for a, b in zip(totals, row)]
        lines.append(_row(f, row))
    lines.append(_row("**all**", totals))
    worse = [
        (t, res["tokenwire"].get(t, ("missing", ""))[1])
        for t in sorted(res["stock"])
        if res["stock"][t][0] == "passed" and res["tokenwire"].get(t, ("",))[0] != "passed"
    ]
    if worse and res["tokenwire"]:
        lines += ["", "Passing on stock vLLM, not on tokenwire:", ""]
        lines += [f"- `{t}`: {m}" for t, m in worse]
    better = [
        t
        for t in sorted(res["tokenwire"])
        if res["tokenwire"][t][0] == "passed" and res["stock"].get(t, ("",))[0] != "passed"
    ]
    if better and res["stock"]:
        lines += ["", "Passing on tokenwire, not on stock vLLM:", ""]
        lines += [f"- `{t}`" for t in better]
    return "\n".join(lines)


def _row(name: str, row: list[int]) -> str:
    sides = [" / ".join(map(str, row[1 + 3 * i : 4 + 3 * i])) for i in range(len(SERVERS))]
    return f"| {name} | {row[0]} | " + " | ".join(sides) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--servers",
        default=",".join(SERVERS),
        help="stock,tokenwire or one (synthetic: tokenwire's synthetic engine, to check the "
        "harness itself in seconds)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / ".vllm-api-tests", help="results folder")
    ap.add_argument("-k", dest="keyword", default=None, help="pytest -k over the tests")
    ap.add_argument("--files", default=None, help="comma-separated subset of the files")
    ap.add_argument("--table-only", action="store_true", help="print the last runs' table")
    ap.add_argument(
        "--parallel",
        action="store_true",
        help="run the two sides at once (twice the memory, about half the time)",
    )
    args = ap.parse_args()
    picked = args.files.split(",") if args.files else None
    files = [f for f in FILES if picked is None or any(k in f for k in picked)]
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        paths = _env_paths()
        procs = []
        for server in args.servers.split(","):
            procs.append(run(server, files, args.out, paths, args.keyword))
            if not args.parallel:
                procs[-1].wait()
        for proc in procs:
            proc.wait()
            shutil.rmtree(proc.tmp, ignore_errors=True)
    print(table(args.out, files))


if __name__ == "__main__":
    main()
