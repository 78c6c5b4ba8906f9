"""The engine-facing runtime: one tokenizer, one engine and the detok shard (``Runtime``), the
unit of work it takes (``Plan``), its settings (``RuntimeConfig``, ``Features``) and metrics.
It knows nothing of HTTP: the server layer above turns requests into plans and items into
responses."""

from tokenwire.runtime.config import RuntimeConfig
from tokenwire.runtime.features import DEFAULT_FEATURES, Features
from tokenwire.runtime.plan import Plan
from tokenwire.runtime.runtime import Runtime

__all__ = ["DEFAULT_FEATURES", "Features", "Plan", "Runtime", "RuntimeConfig"]
