"""``RuntimeConfig``: the engine-facing settings of a server (the HTTP server's ``ServerConfig``
adds its own to these)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenwire.pooling.tasks import PoolingModel
from tokenwire.runtime.features import Features
from tokenwire.runtime.media import MediaOptions
from tokenwire.shard import DEFAULT_MAX_STALL

__all__ = ["RuntimeConfig"]


@dataclass
class RuntimeConfig:
    """How requests are admitted, delivered and counted."""

    model_name: str = "tokenwire"
    #: More names the model answers to (vLLM's several ``--served-model-name`` values).
    served_model_names: tuple[str, ...] = ()
    #: LoRA adapters served from the start (``--lora-modules``): name -> folder.
    lora_modules: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: Adapters may be loaded and unloaded at run time (vLLM's
    #: ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): ``/v1/load_lora_adapter`` and ``/v1/unload...``.
    runtime_lora_updating: bool = False
    #: vLLM's ``VLLM_SERVER_DEV_MODE``: the engine-control routes (sleep, pause, caches...).
    dev_mode: bool = False
    #: Where the model comes from (``/v1/models``' ``root``); default: its name.
    model_root: str | None = None
    max_concurrent_requests: int = 1024
    #: Requests that may wait for a place past ``max_concurrent_requests`` (0: 429 at once),
    #: and the seconds one may wait (None: as long as it takes); see ``runtime.admission``.
    max_waiting_requests: int = 0
    queue_timeout: float | None = None
    sink_capacity: int = 64
    #: Seconds a streaming client may read nothing while its sink is full before its request
    #: is ended (None: never).
    stall_timeout: float | None = DEFAULT_MAX_STALL
    #: Output parsing and the other OpenAI features (reasoning, tool calls...).
    features: Features = dataclasses.field(default_factory=Features)
    #: The media flags (a multimodal model: ``features.media`` set).
    media_options: MediaOptions = dataclasses.field(default_factory=MediaOptions)
    #: With several API-server processes: the directory where each shares its metrics, and
    #: this one's index (``tokenwire serve --api-server-count``).
    metrics_dir: str | None = None
    worker_index: int = 0
    #: What the pooling routes must know of the model (its config's facts; an engine that
    #: describes its own outputs, the synthetic one, overrides it).
    pooling_model: PoolingModel | None = None
    #: vLLM's ``--pooler-config`` as far as the frontend reads it: the ``task`` to run, and the
    #: ``dimensions`` and ``use_activation`` a request leaves unset.
    pooler_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
