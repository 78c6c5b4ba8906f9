"""The synthetic engine's pooling outputs: deterministic vectors whose cosine similarity reflects
the tokens two inputs share.

Each token id has a fixed pseudo-random unit vector (SplitMix64 of the engine's seed, the id and
the coordinate, so the same on every run and machine). An input's embedding is the sum of its
non-special tokens' vectors, plus a small component of its own seeded by the whole sequence (so
reordered tokens give a different, close, vector), normalized to unit length. Random vectors in
hundreds of dimensions are nearly orthogonal, so the cosine of two embeddings is close to the
share of tokens they have in common: a document that shares words with a query ranks above one
that does not. ``token_embed`` gives each token its own vector (unit rows). Matryoshka
``dimensions`` keep the first coordinates (renormalized); ``use_activation: false`` skips the
normalization, as a real pooler's would.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from tokenwire.engine.pooling import PoolingRequest
from tokenwire.pooling.tasks import PoolingModel

__all__ = ["DEFAULT_EMBEDDING_DIM", "SYNTHETIC_POOLING_TASKS", "SyntheticPooler"]

#: The size of the synthetic engine's embeddings by default (``--embedding-dim``).
DEFAULT_EMBEDDING_DIM = 384
#: The pooling tasks it runs.
SYNTHETIC_POOLING_TASKS = ("embed", "token_embed")
#: Weight of an input's own component, relative to its tokens' (order sensitivity).
_OWN = 0.15
#: Token vectors kept between requests.
_CACHE = 1 << 14

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(seed: np.uint64, counters: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over ``seed + counter * golden`` (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        z = seed + counters * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


class SyntheticPooler:
    """Pools a batch of requests at once (see the module docstring)."""

    def __init__(self, dim: int, seed: int = 0, special_ids: frozenset[int] = frozenset()) -> None:
        if dim < 1:
            raise ValueError(f"the embedding size must be at least 1, got {dim}")
        self.dim = dim
        self.seed = np.uint64(seed & ((1 << 64) - 1))
        self.special_ids = special_ids
        self._cache: dict[int, np.ndarray] = {}
        self._coords = np.arange(dim, dtype=np.uint64)

    @property
    def model(self) -> PoolingModel:
        """What its outputs are: ``dim``-sized Matryoshka embeddings."""
        return PoolingModel(
            architectures=("SyntheticEmbeddingModel",),
            embedding_size=self.dim,
            is_matryoshka=True,
        )

    def _random_units(self, keys: np.ndarray, salt: int) -> np.ndarray:
        """One pseudo-random unit vector per key (rows), coordinates in [-1, 1) before norming."""
        counters = (keys.astype(np.uint64)[:, None] * np.uint64(self.dim + 1)) + self._coords
        bits = _mix(self.seed ^ np.uint64(salt), counters)
        vals = (bits >> np.uint64(11)).astype(np.float64) * (2.0 / (1 << 53)) - 1.0
        vecs = vals.astype(np.float32)
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        return vecs / np.maximum(norms, np.float32(1e-12))

    def token_vectors(self, ids: np.ndarray) -> np.ndarray:
        """The unit vector of each token id (rows)."""
        uniq, inverse = np.unique(ids, return_inverse=True)
        missing = [int(t) for t in uniq if int(t) not in self._cache]
        if missing:
            if len(self._cache) + len(missing) > _CACHE:
                self._cache.clear()
            made = self._random_units(np.asarray(missing, dtype=np.int64), 0x7E)
            for t, v in zip(missing, made):
                self._cache[t] = v
        table = (
            np.stack([self._cache[int(t)] for t in uniq])
            if len(uniq)
            else np.zeros((0, self.dim), np.float32)
        )
        return table[inverse.reshape(-1)]

    def pool(self, requests: Sequence[PoolingRequest]) -> list[np.ndarray]:
        """Each request's output, in order."""
        return [self._one(r) for r in requests]

    def _one(self, req: PoolingRequest) -> np.ndarray:
        ids = np.asarray(req.prompt_ids, dtype=np.int64)
        params = req.params
        if params.task == "token_embed":
            out = self.token_vectors(ids)
            return self._finish(out, params.dimensions, params.use_activation)
        plain = ids[[int(t) not in self.special_ids for t in ids]] if self.special_ids else ids
        if plain.size == 0:
            plain = ids
        total = self.token_vectors(plain).sum(axis=0)
        key = zlib.crc32(ids.astype("<i8").tobytes())
        own = self._random_units(np.asarray([key], dtype=np.int64), 0x5E)[0]
        total = total + own * np.float32(_OWN * np.sqrt(len(plain)))
        return self._finish(total[None, :], params.dimensions, params.use_activation)[0]

    @staticmethod
    def _finish(rows: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
        if dimensions is not None:
            rows = rows[:, :dimensions]
        if normalize:
            norms = np.linalg.norm(rows, axis=1, keepdims=True)
            rows = rows / np.maximum(norms, np.float32(1e-12))
        return np.ascontiguousarray(rows, dtype=np.float32)
