"""The model's generation defaults: the sampling values a model's ``generation_config.json``
recommends, which vLLM (``--generation-config auto``, its default) and SGLang apply to requests
that leave them out. ``GenerationDefaults`` holds them under ``SamplingParams`` names, checked
once at startup; requests copy the ones they omit."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenwire.messages.errors import ValidationError
from tokenwire.messages.sampling import SamplingParams

__all__ = ["GENERATION_FIELDS", "GenerationDefaults", "load_generation_defaults"]

#: ``generation_config.json`` key -> ``SamplingParams`` field (vLLM's list of the keys it takes).
GENERATION_FIELDS: dict[str, str] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "max_new_tokens": "max_new_tokens",
}


@dataclass(frozen=True)
class GenerationDefaults:
    """Sampling defaults for requests that omit a field (``values``: ``SamplingParams`` field
    names), and where they come from (``source``, for the startup line)."""

    values: Mapping[str, Any] = field(default_factory=dict)
    source: str = "vllm"
    #: The most tokens any request generates (vLLM's ``override_max_tokens``: a folder's
    #: ``max_new_tokens``, or the override's), whatever it asks; None: no cap.
    max_tokens_cap: int | None = None

    def get(self, name: str) -> Any:
        """The default of ``SamplingParams`` field ``name``, or None."""
        return self.values.get(name)

    def describe(self) -> str:
        """``temperature=0.6, top_k=20 (generation_config.json of DIR)``, or ``none``."""
        if not self.values:
            return "none"
        shown = ", ".join(f"{GENERATION_KEYS[k]}={v}" for k, v in self.values.items())
        return f"{shown} ({self.source})"


GENERATION_KEYS = {v: k for k, v in GENERATION_FIELDS.items()}


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def load_generation_defaults(
    mode: str,
    model_dir: str | None,
    override: Mapping[str, Any] | None = None,
    *,
    model_generation_config: Mapping[str, Any] | None = None,
) -> GenerationDefaults:
    """The defaults as vLLM's ``--generation-config MODE`` and ``--override-generation-config``
    give them: ``auto`` reads the model folder's ``generation_config.json`` (or
    ``model_generation_config``, already read, when there is no folder), ``vllm`` takes none, any
    other value is a folder to read it from; ``override`` goes on top. Only the sampling keys are
    taken (null values are not); ``ValueError`` for a file that is not JSON or values a request
    could not carry."""
    if mode == "vllm":
        config: dict[str, Any] = {}
        source = "--override-generation-config"
    elif mode == "auto":
        if model_dir is not None and os.path.isdir(model_dir):
            config = _read(os.path.join(model_dir, "generation_config.json"))
            source = f"generation_config.json of {model_dir}"
        else:
            config = dict(model_generation_config or {})
            source = "the model's generation_config.json"
    else:
        if not os.path.isdir(mode):
            raise ValueError(f"--generation-config: {mode!r} is not auto, vllm or a folder")
        config = _read(os.path.join(mode, "generation_config.json"))
        source = f"generation_config.json of {mode}"
    if override:
        config.update(override)
        if mode != "vllm":
            source += " and --override-generation-config"
    values = {
        GENERATION_FIELDS[k]: v
        for k, v in config.items()
        if k in GENERATION_FIELDS and v is not None
    }
    if values.get("top_k") == 0:  # vLLM's "no top-k"
        values["top_k"] = -1
    # vLLM caps every request by max_new_tokens when it comes from a folder given by name or
    # from the override; the model's own (auto) is only a default for requests that omit it.
    cap = values.get("max_new_tokens") if mode not in ("auto", "vllm") else None
    if override and override.get("max_new_tokens") is not None:
        cap = override["max_new_tokens"]
    try:
        params = SamplingParams.from_dict(values, names=GENERATION_KEYS)
        params.verify(1 << 62, names=GENERATION_KEYS)
    except ValidationError as exc:
        raise ValueError(f"generation defaults ({source}): {exc.detail}") from None
    return GenerationDefaults(values, source, cap)
