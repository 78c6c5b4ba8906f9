"""The build: tokenwire's per-chunk hot modules compiled with mypyc (from their plain, typed Python
source) when it can, pure Python otherwise. The metadata is in ``pyproject.toml``.

- ``pip install .`` (a wheel) compiles ``COMPILED`` with mypyc (a build requirement) and the C
  compiler Python was built with; without that compiler, or if compiling fails, it warns and
  installs the same modules as plain Python.
- ``TOKENWIRE_PURE_PYTHON=1`` at build time installs plain Python; at run time it makes an
  installed compiled build import the plain modules instead (``tokenwire._pure``).
- Editable installs (``pip install -e .``, the test command) stay plain Python: a compiled module
  would shadow its source, and an edit to the source would not take effect. ``TOKENWIRE_COMPILE=1``
  compiles an editable install all the same (the extension modules land beside the sources:
  ``git clean -X src`` removes them).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_ext import build_ext

#: The modules compiled, relative to ``src``: each stream's every chunk goes through them.
COMPILED = [
    "tokenwire/parsers/markers.py",
    "tokenwire/parsers/reasoning.py",
    "tokenwire/parsers/output.py",
    "tokenwire/shard/holdback.py",
    "tokenwire/server/openai/chunks.py",
]


def _say(message: str) -> None:
    print(f"tokenwire build: {message}", file=sys.stderr)


def _compiler() -> str | None:
    """The C compiler Python's extensions are built with, when it is installed."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    first = shlex.split(cc)[0] if cc.strip() else "cc"
    return shutil.which(first)


def _editable() -> bool:
    return any(cmd in sys.argv for cmd in ("editable_wheel", "develop"))


def _ext_modules() -> list:
    if os.environ.get("TOKENWIRE_PURE_PYTHON") == "1":
        _say("TOKENWIRE_PURE_PYTHON=1: plain Python")
        return []
    if _editable() and os.environ.get("TOKENWIRE_COMPILE") != "1":
        return []  # (see the docstring)
    if not _editable() and not any(
        cmd in sys.argv for cmd in ("bdist_wheel", "build_ext", "build", "install")
    ):
        return []  # (metadata, an sdist: nothing to compile)
    if _compiler() is None:
        _say("no C compiler found: plain Python")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypyc is not installed: plain Python")
        return []
    try:
        # (the modules they import are read for their types, not checked: only these compile)
        flags = ["--ignore-missing-imports", "--follow-imports=silent"]
        return mypycify([*flags, *(os.path.join("src", p) for p in COMPILED)], opt_level="3")
    except BaseException as exc:  # a type error mypyc refuses, ...: still installable
        _say(f"mypyc could not compile the hot modules ({type(exc).__name__}: {exc}): plain Python")
        return []


class OptionalBuildExt(build_ext):
    """``build_ext`` that installs plain Python when compiling fails (every compiled module or
    none: they share mypyc's runtime library)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            _say(f"compiling failed ({type(exc).__name__}: {exc}): plain Python")
            for ext in self.extensions:
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.remove(path)
            self.extensions = []


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
