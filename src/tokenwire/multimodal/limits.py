"""``--limit-mm-per-prompt`` in vLLM's JSON form (``{"image": 4, "video": 0}``, or per modality
``{"count": 4, ...}``), and the check of a request's items against it and the model's
modalities."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tokenwire.messages.errors import ValidationError
from tokenwire.multimodal.parts import MODALITIES, MediaItem

__all__ = ["DEFAULT_LIMIT", "MediaLimits", "parse_limit_mm_per_prompt"]

#: vLLM's limit for a modality the flag does not name.
DEFAULT_LIMIT = 999


def parse_limit_mm_per_prompt(value: str | Mapping | None) -> dict[str, int]:
    """The flag's value as ``{modality: count}`` (``ValueError`` naming what is wrong)."""
    if value is None or value == "":
        return {}
    raw = json.loads(value) if isinstance(value, str) else value
    if not isinstance(raw, dict):
        raise ValueError('--limit-mm-per-prompt must be a JSON object, e.g. {"image": 4}')
    out = {}
    for name, limit in raw.items():
        if name not in MODALITIES:
            raise ValueError(
                f"--limit-mm-per-prompt: unknown modality {name!r} (one of {', '.join(MODALITIES)})"
            )
        if isinstance(limit, dict):
            limit = limit.get("count", DEFAULT_LIMIT)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError(f"--limit-mm-per-prompt: {name} must be a count >= 0")
        out[name] = limit
    return out


@dataclass(frozen=True)
class MediaLimits:
    """The items a prompt may carry: per modality (``per_prompt``, vLLM's defaults for the
    rest), and the modalities the served model takes at all."""

    modalities: frozenset[str]
    per_prompt: Mapping[str, int] = field(default_factory=dict)

    def limit(self, modality: str) -> int:
        return self.per_prompt.get(modality, DEFAULT_LIMIT)

    def check(self, items: Sequence[MediaItem], param: str = "messages") -> None:
        """A 400 for an item of a modality the model does not take, or more items than the
        limit."""
        counts = Counter(item.modality for item in items)
        for item in items:
            if item.modality not in self.modalities:
                what = "a text-only model" if not self.modalities else "this model"
                raise ValidationError(
                    f"{item.field}: {what} does not accept {item.modality} input", param=param
                )
        for modality, n in counts.items():
            limit = self.limit(modality)
            if n > limit:
                raise ValidationError(
                    f"at most {limit} {modality} item(s) per prompt (--limit-mm-per-prompt); "
                    f"this one has {n}",
                    param=param,
                )
