"""Which pooling task a model runs, what the frontend must know of the model, and which routes a
task serves (vLLM's rules: ``ModelConfig.get_pooling_task``, ``enable_scoring_api``, the pooling
route registration).

An engine says which tasks it supports (vLLM's ``get_supported_tasks``: ``("embed",
"token_embed")`` for a BERT embedding model, ``("classify",)`` for a cross-encoder,
``("generate",)`` for a language model); the task served is the one ``--pooler-config`` names, or
the first of vLLM's order the engine supports.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenwire.messages.errors import ValidationError

__all__ = [
    "POOLING_TASKS",
    "PoolingModel",
    "choose_pooling_task",
    "route_task_error",
    "scoring_kind",
]

#: The pooling tasks tokenwire serves (vLLM's names; IO-processor plugins are not served).
POOLING_TASKS = ("embed", "classify", "token_embed", "token_classify")
#: vLLM's order of preference when the model supports several.
_PRIORITY = ("embed", "classify", "token_embed", "token_classify")
#: How each task scores a pair (vLLM's ``SCORE_TYPE_MAP``).
_SCORING = {"embed": "bi-encoder", "classify": "cross-encoder", "token_embed": "late-interaction"}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class PoolingModel:
    """What the frontend must know of a pooling model, read as vLLM reads it from the model's
    ``config.json`` (and its sentence-transformers modules)."""

    architectures: tuple[str, ...] = ()
    #: The size of its embeddings (``embedding_size``, a sentence-transformers Dense layer's
    #: output, else ``hidden_size``); None when unknown.
    embedding_size: int | None = None
    #: Matryoshka embeddings: ``dimensions`` may shorten them (to one of
    #: ``matryoshka_dimensions`` when the model lists them).
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None
    #: A classifier's labels (``id2label``; ``num_labels`` of them).
    num_labels: int = 0
    id2label: Mapping[int, str] = field(default_factory=dict)
    #: Cross-encoders score the tokenizer's pair encoding (``[CLS] q [SEP] d [SEP]``); an "LLM
    #: as reranker" (``use_sep_token: false``) the query's text followed by the document's.
    use_sep_token: bool = True
    #: The padding token's id (vLLM counts it between a pair's two halves in a bi-encoder score's
    #: token ids), from the config; the tokenizer's otherwise.
    pad_token_id: int | None = None

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], *, dense_out: int | None = None
    ) -> PoolingModel:
        """From a model's ``config.json`` (``dense_out``: the last sentence-transformers Dense
        layer's output size, which is the embedding size when there is one)."""
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        archs = config.get("architectures")
        id2label: dict[int, str] = {}
        raw = config.get("id2label")
        if isinstance(raw, dict):
            for k, v in raw.items():
                try:
                    id2label[int(k)] = str(v)
                except (TypeError, ValueError):
                    continue
        num_labels = _int(config.get("num_labels"))
        if num_labels is None:
            # (Hugging Face's default: two labels, unless id2label says otherwise.)
            num_labels = len(id2label) if id2label else 2
        if not id2label:
            id2label = {i: f"LABEL_{i}" for i in range(num_labels)}
        dims = config.get("matryoshka_dimensions")
        mds = tuple(d for d in dims if _int(d)) if isinstance(dims, list) and dims else None
        size = _int(config.get("embedding_size")) or dense_out
        if size is None:
            size = _int(config.get("hidden_size")) or _int(text.get("hidden_size"))
        use_sep = config.get("use_sep_token", config.get("use_pad_token", True))
        return cls(
            architectures=tuple(a for a in archs if isinstance(a, str))
            if isinstance(archs, list)
            else (),
            embedding_size=size,
            is_matryoshka=bool(mds) or bool(config.get("is_matryoshka", False)),
            matryoshka_dimensions=mds,
            num_labels=num_labels,
            id2label=id2label,
            use_sep_token=bool(use_sep),
            pad_token_id=_int(config.get("pad_token_id")),
        )

    @classmethod
    def from_dir(cls, directory: str) -> PoolingModel:
        """From a model folder: its ``config.json``, and the output size of the last Dense
        layer its sentence-transformers ``modules.json`` lists (an empty model when the folder
        has no config)."""
        config = _read_json(os.path.join(directory, "config.json"))
        dense_out = None
        modules = _read_json_list(os.path.join(directory, "modules.json"))
        for module in modules:
            if isinstance(module, dict) and str(module.get("type", "")).endswith(".Dense"):
                path = module.get("path")
                if isinstance(path, str):
                    dense = _read_json(os.path.join(directory, path, "config.json"))
                    dense_out = _int(dense.get("out_features")) or dense_out
        return cls.from_config(config, dense_out=dense_out)


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _read_json_list(path: str) -> list[Any]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return []
    return value if isinstance(value, list) else []


def choose_pooling_task(
    supported: Sequence[str], model: PoolingModel, configured: str | None = None
) -> str | None:
    """The pooling task a model with ``supported`` tasks runs (None: it runs none):
    ``configured`` (``--pooler-config``'s ``task``) when given, which it must support
    (``ValueError`` otherwise), else a token classifier's ``token_classify``, else the first of
    vLLM's order it supports."""
    if configured is not None:
        if configured not in supported:
            raise ValueError(
                f"the pooler config's task {configured!r} is not one the model supports "
                f"({', '.join(supported) or 'none'})"
            )
        return configured
    if "token_classify" in supported and any(
        "ForTokenClassification" in a for a in model.architectures
    ):
        return "token_classify"
    return next((t for t in _PRIORITY if t in supported), None)


def scoring_kind(task: str | None, model: PoolingModel) -> str | None:
    """How the model scores a query against a document (``bi-encoder``: the cosine of two
    embeddings, ``cross-encoder``: a one-label classifier over the pair, ``late-interaction``:
    MaxSim over token embeddings), or None when it cannot (vLLM's ``enable_scoring_api``)."""
    if task == "classify" and model.num_labels != 1:
        return None
    return _SCORING.get(task or "")


#: What each pooling route needs, in words, for the error a model that cannot serve it gets.
_NEEDS = {
    "embeddings": "an embedding model (the embed task)",
    "classify": "a classification model (the classify task)",
    "score": "an embedding model, a late-interaction model or a cross-encoder with one label",
    "rerank": "an embedding model, a late-interaction model or a cross-encoder with one label",
    "pooling": "a pooling model",
}


def route_task_error(route: str, task: str | None, generates: bool = False) -> ValidationError:
    """The 400 a route gets from a model that cannot serve it, naming the task the model runs."""
    runs = f"the {task} pooling task" if task else "no pooling task"
    if task is None and generates:
        runs = "text generation (no pooling task)"
    path = "/v1/embeddings" if route == "embeddings" else f"/{route}"
    return ValidationError(
        f"this model runs {runs}: {path} needs {_NEEDS.get(route, 'another kind of model')}",
        param="model",
    )
