"""The entry points, on top of every layer: ``tokenwire serve`` and ``tokenwire mock-engine``
(``cli``, ``serve``, ``mock_engine``, with their flags by concern in ``options``), the
supervisor of several API-server processes (``supervisor``), and ``tokenwire-vllm-frontend``,
the frontend program ``vllm serve`` starts (``vllm_frontend``). Each is a thin assembly of the
layers below."""
