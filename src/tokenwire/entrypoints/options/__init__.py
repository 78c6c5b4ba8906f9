"""``tokenwire serve``'s flags by concern, each module with the code that reads them into the
settings of the layer they configure: ``server`` (the model, where to listen, security),
``limits`` (what a request or connection may take), ``engine`` (synthetic or vLLM engines, and
several API-server processes), ``output`` (chat templates, reasoning and tool-call parsers) and
``operations`` (logging, CPU pinning)."""

from __future__ import annotations

import argparse
import json

__all__ = ["string_list"]


def string_list(value: str) -> list[str]:
    """A JSON list of strings (as vLLM takes them) or a comma-separated list."""
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a JSON list: {value!r}") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise argparse.ArgumentTypeError(f"not a JSON list of strings: {value!r}")
        return items
    return [part.strip() for part in text.split(",") if part.strip()]
