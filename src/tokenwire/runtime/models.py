"""``ServedModels``: the model names a server answers to (vLLM's several ``--served-model-name``
values) and its LoRA adapters (``--lora-modules``, and those loaded at run time), each a model of
its own that clients name in ``model`` (or SGLang's ``lora_path``)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from tokenwire.engine import LoraAdapter
from tokenwire.messages.errors import ModelNotFoundError, ValidationError

__all__ = ["ServedModels"]


class ServedModels:
    """The base model's names (the first is the one responses default to) and the adapters."""

    def __init__(
        self,
        names: Sequence[str],
        adapters: Mapping[str, str] | None = None,
        *,
        root: str | None = None,
    ) -> None:
        if not names:
            raise ValueError("a server serves at least one model name")
        self.names: tuple[str, ...] = tuple(dict.fromkeys(names))
        #: Where the base model comes from (``/v1/models``' ``root``).
        self.root = root or self.names[0]
        self._ids = itertools.count(1)
        self.adapters: dict[str, LoraAdapter] = {}
        for name, path in (adapters or {}).items():
            self.add(name, path)

    @property
    def primary(self) -> str:
        return self.names[0]

    def resolve(self, requested: Any, field: str = "model") -> tuple[str, LoraAdapter | None]:
        """The name a response echoes and the adapter a request's ``model`` names (absent or
        null: the base model under its first name). SGLang's ``base:adapter`` works too; any
        other name is OpenAI's 404 ``model_not_found``."""
        if requested is None:
            return self.primary, None
        if not isinstance(requested, str):
            raise ValidationError(f"{field} must be a string, got {requested!r:.60}", param=field)
        if requested in self.names:
            return requested, None
        adapter = self.adapters.get(requested)
        if adapter is None and ":" in requested:
            base, _, name = requested.rpartition(":")
            if base in self.names:
                adapter = self.adapters.get(name)
        if adapter is not None:
            return adapter.name, adapter
        shown = requested if len(requested) <= 80 else requested[:77] + "..."
        raise ModelNotFoundError(
            f"The model `{shown}` does not exist (this server serves "
            f"{', '.join(f'`{n}`' for n in [*self.names, *self.adapters])}).",
            param=field,
        )

    def adapter(self, name: Any, field: str) -> LoraAdapter | None:
        """SGLang's ``lora_path``: an adapter's name (null or empty: none)."""
        if name is None or name == "":
            return None
        if not isinstance(name, str) or name not in self.adapters:
            raise ValidationError(
                f"{field} names no LoRA adapter this server has (it has "
                f"{', '.join(self.adapters) or 'none'})",
                param=field,
            )
        return self.adapters[name]

    def add(self, name: str, path: str) -> LoraAdapter:
        """A new adapter (a name taken by a base model or another adapter is a 400)."""
        if not name or not path:
            raise ValidationError("both lora_name and lora_path must be given", param="lora_name")
        if name in self.names:
            raise ValidationError(
                f"the LoRA adapter {name!r:.80} conflicts with a served base model",
                param="lora_name",
            )
        if name in self.adapters:
            raise ValidationError(
                f"the LoRA adapter {name!r:.80} has already been loaded", param="lora_name"
            )
        adapter = LoraAdapter(name, next(self._ids), path)
        self.adapters[name] = adapter
        return adapter

    def remove(self, name: str) -> LoraAdapter:
        """Forget an adapter (an unknown name is a 404)."""
        adapter = self.adapters.pop(name, None)
        if adapter is None:
            raise ModelNotFoundError(
                f"The LoRA adapter `{name:.80}` cannot be found.", param="lora_name"
            )
        return adapter

    def cards(self, max_model_len: int | None) -> list[dict[str, Any]]:
        """``/v1/models``' entries: every base name, then every adapter with its ``parent``."""
        base = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "tokenwire",
                "root": self.root,
                "parent": None,
                "max_model_len": max_model_len,
            }
            for name in self.names
        ]
        loras = [
            {
                "id": a.name,
                "object": "model",
                "created": 0,
                "owned_by": "tokenwire",
                "root": a.path,
                "parent": self.primary,
                "max_model_len": max_model_len,
            }
            for a in self.adapters.values()
        ]
        return base + loras
