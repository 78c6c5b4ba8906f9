"""Parsers of one's own: ``register_tool_parser`` / ``register_reasoning_parser`` put a parser
class in the registries under a name (then ``--tool-call-parser NAME`` / ``--reasoning-parser
NAME`` select it), and ``load_parser_plugin`` runs a Python file that registers some, as vLLM's
``--tool-parser-plugin`` / ``--reasoning-parser-plugin`` do.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tokenwire.parsers.reasoning import REASONING_PARSERS, ReasoningStream
from tokenwire.parsers.tools import TOOL_CALL_PARSERS, ToolCallParser

__all__ = [
    "ParserPluginError",
    "load_parser_plugin",
    "register_reasoning_parser",
    "register_tool_parser",
]

T = TypeVar("T", bound=type)


class ParserPluginError(ValueError):
    """A parser plugin file that is missing, fails, or registers nothing."""


def _register(registry: dict, base: type, kind: str, name: str | None) -> Callable[[T], T]:
    def register(cls: T) -> T:
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(f"a {kind} parser must subclass {base.__name__}, got {cls!r}")
        key = name if name is not None else getattr(cls, "name", "")
        if not isinstance(key, str) or not key:
            raise ValueError(f"a {kind} parser needs a name (the class's `name`, or one given)")
        cls.name = key  # type: ignore[attr-defined]
        registry[key] = cls
        return cls

    return register


def register_tool_parser(name: str | None = None) -> Callable[[T], T]:
    """A class decorator: the ``ToolCallParser`` subclass becomes ``--tool-call-parser NAME``
    (its ``name`` attribute when no name is given). A built-in parser of that name is
    replaced."""
    return _register(TOOL_CALL_PARSERS, ToolCallParser, "tool-call", name)


def register_reasoning_parser(name: str | None = None) -> Callable[[T], T]:
    """A class decorator: the ``ReasoningStream`` subclass (``ReasoningParser`` for
    ``<think>``-style markers) becomes ``--reasoning-parser NAME``."""
    return _register(REASONING_PARSERS, ReasoningStream, "reasoning", name)


def load_parser_plugin(path: str | os.PathLike[str]) -> list[str]:
    """Run the Python file at ``path``, which registers parsers; the names it registered
    (tool-call and reasoning), sorted. ``ParserPluginError`` when the file is missing, raises,
    or registers nothing; the registries are then as they were."""
    file = Path(path)
    if not file.is_file():
        raise ParserPluginError(f"parser plugin {str(file)!r}: no such file")
    tools, reasonings = dict(TOOL_CALL_PARSERS), dict(REASONING_PARSERS)
    digest = hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:12]
    module_name = f"tokenwire_parser_plugin_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ParserPluginError(f"parser plugin {str(file)!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        _restore(tools, reasonings)
        sys.modules.pop(module_name, None)
        raise ParserPluginError(
            f"parser plugin {str(file)!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    names = {n for n, cls in TOOL_CALL_PARSERS.items() if tools.get(n) is not cls}
    names |= {n for n, cls in REASONING_PARSERS.items() if reasonings.get(n) is not cls}
    if not names:
        sys.modules.pop(module_name, None)
        raise ParserPluginError(
            f"parser plugin {str(file)!r} registered no parser (decorate its classes with "
            "tokenwire.parsers.register_tool_parser or register_reasoning_parser)"
        )
    return sorted(names)


def _restore(tools: dict, reasonings: dict) -> None:
    TOOL_CALL_PARSERS.clear()
    TOOL_CALL_PARSERS.update(tools)
    REASONING_PARSERS.clear()
    REASONING_PARSERS.update(reasonings)
