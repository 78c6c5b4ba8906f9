"""Pooling (embeddings, classification, scores): the sans-I/O parts of the pooling routes.

- ``tasks``: vLLM's pooling tasks, which one a model runs, what the frontend must know of the
  model (``PoolingModel``: its embedding size, Matryoshka dimensions, labels...), and which
  routes a task serves;
- ``params``: ``PoolingParams`` as an engine takes them, checked against the model;
- ``inputs``: request inputs validated and bounded before they are tokenized, truncated as vLLM
  truncates them, and cross-encoder pairs built as vLLM builds them;
- ``vectors``: the math on pooled outputs (cosine, MaxSim, label choice) and their encodings
  (floats, base64 from the engine's buffer, Cohere's bit-packed types), columnar.
"""

from tokenwire.pooling.inputs import (
    MAX_POOLING_INPUTS,
    MAX_POOLING_TOKENS,
    PairTemplate,
    ScoreData,
    TokenBudget,
    encode_pair,
    pooling_inputs,
    score_inputs,
    tokenize_inputs,
)
from tokenwire.pooling.params import PoolingParams, check_dimensions
from tokenwire.pooling.tasks import (
    POOLING_TASKS,
    PoolingModel,
    choose_pooling_task,
    route_task_error,
    scoring_kind,
)
from tokenwire.pooling.vectors import (
    EMBED_DTYPES,
    base64_vector,
    cosine_rows,
    float_rows,
    maxsim,
    pack_bits,
)

__all__ = [
    "EMBED_DTYPES",
    "MAX_POOLING_INPUTS",
    "MAX_POOLING_TOKENS",
    "POOLING_TASKS",
    "PairTemplate",
    "PoolingModel",
    "PoolingParams",
    "ScoreData",
    "TokenBudget",
    "base64_vector",
    "check_dimensions",
    "choose_pooling_task",
    "cosine_rows",
    "encode_pair",
    "float_rows",
    "maxsim",
    "pack_bits",
    "pooling_inputs",
    "route_task_error",
    "score_inputs",
    "scoring_kind",
    "tokenize_inputs",
]
