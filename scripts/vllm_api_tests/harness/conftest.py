"""The harness's ``tests/conftest.py``: no hub access (every model and LoRA adapter a test names
is the tiny CPU model and its adapter), and the few names vLLM's own conftest gives that the
selected test files import."""

from __future__ import annotations

import os

import pytest

MODEL_DIR = os.environ["VLLM_API_MODEL"]
LORA_DIR = os.environ["VLLM_API_LORA"]


def _local(name):
    return name if isinstance(name, str) and os.path.isdir(name) else MODEL_DIR


def _patch() -> None:
    import transformers
    import vllm.tokenizers
    import vllm.transformers_utils.repo_utils as repo_utils

    get_tokenizer = vllm.tokenizers.get_tokenizer

    def local_tokenizer(*args, **kwargs):
        if "tokenizer_name" in kwargs:
            kwargs["tokenizer_name"] = _local(kwargs["tokenizer_name"])
        elif args:
            args = (_local(args[0]), *args[1:])
        return get_tokenizer(*args, **kwargs)

    vllm.tokenizers.get_tokenizer = local_tokenizer

    auto = transformers.AutoTokenizer.from_pretrained.__func__

    @classmethod
    def from_pretrained(cls, name, *args, **kwargs):
        return auto(cls, _local(name), *args, **kwargs)

    transformers.AutoTokenizer.from_pretrained = from_pretrained

    class _Hub:
        def snapshot_download(self, *args, **kwargs):
            return LORA_DIR

    repo_utils.hf_api = lambda *a, **k: _Hub()


_patch()


class LocalAssetServer:
    """vLLM's image asset server: not available here (no assets offline)."""


@pytest.fixture(scope="session")
def local_asset_server():
    pytest.skip("vLLM's test image assets are not available offline")
