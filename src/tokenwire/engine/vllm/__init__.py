"""Fronting unmodified vLLM V1 engines over their EngineCore ZMQ protocol (``pyzmq`` and
``msgspec`` only: tokenwire never imports ``vllm``).

- ``protocol``: the wire format, both sides, sans-I/O;
- ``client``: ``VllmEngine``, tokenwire's ``Engine`` over one or more EngineCore processes;
- ``launch``: a headless ``vllm serve`` child that lives and dies with tokenwire;
- ``mock``: the synthetic engine speaking the engine side (``tokenwire mock-engine``);
- ``frontend``: ``tokenwire-vllm-frontend``, the program vLLM starts as its frontend.
"""

from tokenwire.engine.vllm.client import VllmEngine, VllmEngineConfig

__all__ = ["VllmEngine", "VllmEngineConfig"]
