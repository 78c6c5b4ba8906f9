"""The pooling routes: embeddings, pooling, classification, scores and reranking (vLLM's routes
and shapes, SGLang's ``/encode`` and extras), over any engine that pools (``tokenwire.engine.
pooling``): requests parsed into plans (``requests``), answers shaped from the engine's arrays
(``responses``), the handlers (``routes``)."""

from tokenwire.server.pooling.routes import ROUTES

__all__ = ["ROUTES"]
