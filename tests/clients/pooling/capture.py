"""Regenerate the captured pooling request bodies of this folder: run the real clients (the
openai client's ``embeddings.create``, langchain-openai's ``OpenAIEmbeddings``, Cohere's SDK
rerank, v1 and v2) against a local tokenwire server that records every request body it gets.

    pip install -e ".[test]"
    python tests/clients/pooling/capture.py          # rewrites every file of this folder
    python tests/clients/pooling/capture.py cohere   # ... only those named

``tests/test_pooling_api.py`` replays them (and runs the clients themselves).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capture import MODEL, run, server  # noqa: E402

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Stock markets fell sharply on Monday.",
    "Paris is the capital of France.",
    "The capital city has many museums.",
]


def openai_scenarios(url: str) -> dict[str, Callable[[], Any]]:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    return {
        # (the client asks for base64 by default, and decodes it)
        "embeddings": lambda: client.embeddings.create(model=MODEL, input=DOCUMENTS),
        "embeddings-float-dimensions": lambda: client.embeddings.create(
            model=MODEL, input="Hello world", encoding_format="float", dimensions=64
        ),
        "embeddings-token-ids": lambda: client.embeddings.create(
            model=MODEL, input=[[9707, 1879], [785, 6722]]
        ),
    }


def langchain_scenarios(url: str) -> dict[str, Callable[[], Any]]:
    from langchain_openai import OpenAIEmbeddings

    # (``check_embedding_ctx_length=False``: send the texts, not OpenAI's own tiktoken ids, as
    # every non-OpenAI server needs)
    emb = OpenAIEmbeddings(
        model=MODEL, base_url=url + "/v1", api_key="unused", check_embedding_ctx_length=False
    )
    return {
        "embed-documents": lambda: emb.embed_documents(DOCUMENTS),
        "embed-query": lambda: emb.embed_query(QUERY),
    }


def cohere_scenarios(url: str) -> dict[str, Callable[[], Any]]:
    import cohere

    v2 = cohere.ClientV2(base_url=url, api_key="unused")
    v1 = cohere.Client(base_url=url, api_key="unused")
    return {
        "rerank-v2": lambda: v2.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=2),
        "rerank-v1": lambda: v1.rerank(
            model=MODEL, query=QUERY, documents=DOCUMENTS, return_documents=True
        ),
    }


def main(argv: list[str]) -> int:
    clients = {
        "openai-embeddings": ("openai", openai_scenarios),
        "langchain-openai-embeddings": ("langchain-openai", langchain_scenarios),
        "cohere": ("cohere", cohere_scenarios),
    }
    for name, (dist, scenarios) in clients.items():
        if argv and name not in argv:
            continue
        with server() as (url, recorder):
            run(recorder, scenarios(url))
        out = {
            "client": f"{dist} {importlib.metadata.version(dist)}",
            "source": "captured from the client by tests/clients/pooling/capture.py",
            "requests": recorder.records,
        }
        (HERE / f"{name}.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
        print(f"{name}: {len(recorder.records)} requests", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
