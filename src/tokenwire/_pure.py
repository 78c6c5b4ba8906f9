"""Which of tokenwire's modules run compiled (mypyc, ``setup.py``), and the switch that runs an
installed compiled build as plain Python: ``TOKENWIRE_PURE_PYTHON=1`` in the environment of the
process, read once, when ``tokenwire`` is first imported (its modules then load from their
``.py`` sources, which a compiled build installs beside the extension modules). Importing this
module installs the switch when asked."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

__all__ = ["COMPILED", "compiled_modules", "install_if_asked"]

#: The modules a compiled build compiles (``setup.py``'s list, as module names).
COMPILED = (
    "tokenwire.parsers.markers",
    "tokenwire.parsers.reasoning",
    "tokenwire.parsers.output",
    "tokenwire.shard.holdback",
    "tokenwire.server.openai.chunks",
)


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds ``COMPILED`` modules as their ``.py`` source even where an extension module of the
    same name is installed."""

    def find_spec(self, fullname: str, path: object, target: ModuleType | None = None) -> object:
        if fullname not in COMPILED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)  # type: ignore[arg-type]
        origin = getattr(spec, "origin", None)
        if origin is None or origin.endswith(".py"):
            return spec
        source = os.path.join(os.path.dirname(origin), fullname.rsplit(".", 1)[1] + ".py")
        if not os.path.exists(source):
            return spec  # (a build without the sources: compiled it stays)
        return importlib.util.spec_from_file_location(fullname, source)


def install_if_asked() -> None:
    """With ``TOKENWIRE_PURE_PYTHON=1``, import every compiled module from its source."""
    if os.environ.get("TOKENWIRE_PURE_PYTHON") == "1" and not any(
        isinstance(f, _SourceFirst) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _SourceFirst())


def compiled_modules() -> list[str]:
    """The ``COMPILED`` modules this process runs compiled (imported now, if not yet)."""
    out = []
    for name in COMPILED:
        module = importlib.import_module(name)
        if not (getattr(module, "__file__", None) or "").endswith(".py"):
            out.append(name)
    return out


install_if_asked()
