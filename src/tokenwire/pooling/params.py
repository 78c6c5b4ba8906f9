"""``PoolingParams``: what one pooling request asks of the engine (vLLM's ``PoolingParams`` as its
frontend fills them before they travel: the task set, ``use_activation`` resolved), checked
against the model as vLLM checks them (``PoolingParams.verify``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenwire.messages.errors import ValidationError
from tokenwire.pooling.tasks import PoolingModel

__all__ = ["PoolingParams", "check_dimensions"]

#: The request fields each task takes (vLLM's ``valid_parameters``).
_VALID = {
    "embed": ("dimensions", "use_activation"),
    "token_embed": ("dimensions", "use_activation"),
    "classify": ("use_activation",),
    "token_classify": ("use_activation",),
}


@dataclass(frozen=True)
class PoolingParams:
    """One pooling request's parameters: the ``task`` the engine runs, Matryoshka
    ``dimensions`` (embeddings cut to that many and renormalized by the engine),
    ``use_activation`` (normalization for embeddings, sigmoid or softmax for classifiers: the
    engine's pooler applies it), and ``extra_kwargs`` for the model (a cross-encoder's
    ``compressed_token_type_ids``: where the pair's second half starts)."""

    task: str
    dimensions: int | None = None
    use_activation: bool = True
    extra_kwargs: Mapping[str, Any] | None = None

    @classmethod
    def resolve(
        cls,
        task: str,
        *,
        dimensions: int | None,
        use_activation: bool | None,
        defaults: Mapping[str, Any] | None = None,
        model: PoolingModel | None = None,
        model_name: str = "",
    ) -> PoolingParams:
        """The parameters of a request for ``task``: what it leaves unset taken from the
        pooler config (``defaults``: vLLM's ``--pooler-config`` ``dimensions`` and
        ``use_activation``), activation on by default (vLLM's), each checked against what the
        task takes and, for ``dimensions``, against the model."""
        valid = _VALID.get(task, ())
        defaults = defaults or {}
        if dimensions is None and "dimensions" in valid:
            dimensions = defaults.get("dimensions")
        if use_activation is None:
            use_activation = defaults.get("use_activation")
        if dimensions is not None and "dimensions" not in valid:
            raise ValidationError(
                f"task {task!r} takes only {list(valid)}, not dimensions", param="dimensions"
            )
        if dimensions is not None and model is not None:
            check_dimensions(dimensions, model, model_name)
        return cls(task, dimensions, True if use_activation is None else bool(use_activation))


def check_dimensions(dimensions: int, model: PoolingModel, model_name: str = "") -> None:
    """``dimensions`` must be one the model's Matryoshka embeddings allow (vLLM's messages)."""
    name = f"Model {model_name!r}" if model_name else "This model"
    if not model.is_matryoshka:
        raise ValidationError(
            f"{name} does not support Matryoshka embeddings; dimensions must be unset "
            f"(received dimensions={dimensions}).",
            param="dimensions",
        )
    size = model.embedding_size
    if dimensions < 1 or (size is not None and dimensions > size):
        raise ValidationError(
            f"{name} only supports dimensions in range [1, {size}], got {dimensions}.",
            param="dimensions",
        )
    mds = model.matryoshka_dimensions
    if mds is not None and dimensions not in mds:
        raise ValidationError(
            f"{name} only supports Matryoshka dimensions {list(mds)}, got {dimensions}.",
            param="dimensions",
        )
