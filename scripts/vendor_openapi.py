"""Vendor the part of OpenAI's published OpenAPI document that tokenwire's conformance suite needs.

OpenAI publishes its API as an OpenAPI 3.1 document (the ``openai/openai-openapi`` repository,
``openapi.json`` / ``openapi.yaml``; its SDKs are generated from it). It is 3 MB; the suite needs
the operations tokenwire serves and the schemas they reach. This script keeps exactly those:

- ``paths``: the served operations (``OPERATIONS``), without their examples and prose;
- ``components.schemas``: every schema those operations reach through ``$ref``, transitively,
  without ``description``/``example`` text (the constraints are kept as published);
- ``info`` and an ``x-tokenwire-source`` note of where the document came from.

    python scripts/vendor_openapi.py OPENAPI.{json,yaml} --source "what it is, which version" \
        > tests/conformance/openai-openapi.json

Nothing here runs in CI or at test time: the output file is checked in.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

#: (path, method) of each operation tokenwire serves with OpenAI's contract (under ``/v1``).
OPERATIONS = [
    ("/completions", "post"),
    ("/chat/completions", "post"),
    ("/models", "get"),
    ("/models/{model}", "get"),
    ("/responses", "post"),
    ("/responses/{response_id}", "get"),
    ("/responses/{response_id}", "delete"),
    ("/responses/{response_id}/cancel", "post"),
]
#: Schemas kept besides those the operations reach (error bodies are not in the operations).
EXTRA_SCHEMAS = ["ErrorResponse", "Error"]
#: Prose and examples: not constraints, dropped to keep the file small.
_DROP = {"description", "example", "examples", "x-oaiMeta", "summary", "x-stainless-const"}


def _load(path: Path) -> dict[str, Any]:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return json.loads(text)


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k in _DROP and not (k == "description" and isinstance(v, dict)):
                continue
            # a property literally named "description" or "example" is kept
            out[k] = _strip(v) if k != "properties" else {p: _strip(s) for p, s in v.items()}
        return out
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            found.add(ref.rsplit("/", 1)[1])
        for v in node.values():
            _refs(v, found)
    elif isinstance(node, list):
        for v in node:
            _refs(v, found)


def vendor(
    doc: dict[str, Any],
    source: str,
    digest: str,
    operations: list[tuple[str, str]] = OPERATIONS,
    extra: list[str] = EXTRA_SCHEMAS,
) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for path, method in operations:
        op = _strip(doc["paths"][path][method])
        op.pop("tags", None)
        paths.setdefault(path, {})[method] = op
    schemas = doc["components"]["schemas"]
    todo: set[str] = set(extra)
    _refs(paths, todo)
    kept: dict[str, Any] = {}
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept[name] = _strip(schemas[name])
        found: set[str] = set()
        _refs(kept[name], found)
        todo |= found - kept.keys()
    return {
        "openapi": doc["openapi"],
        "info": {"title": doc["info"]["title"], "version": doc["info"].get("version")},
        "x-tokenwire-source": {"document": source, "sha256": digest},
        "servers": [{"url": "/v1"}],
        "paths": paths,
        "components": {
            "schemas": dict(sorted(kept.items())),
            "securitySchemes": doc["components"].get("securitySchemes", {}),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("document", type=Path)
    ap.add_argument("--source", required=True, help="where the document came from")
    ap.add_argument(
        "--schemas",
        default=None,
        help="comma-separated schemas to keep (with what they reach) instead of the operations",
    )
    args = ap.parse_args()
    digest = hashlib.sha256(args.document.read_bytes()).hexdigest()
    if args.schemas:  # (Anthropic's document: the Messages API's response objects)
        out = vendor(_load(args.document), args.source, digest, [], args.schemas.split(","))
    else:
        out = vendor(_load(args.document), args.source, digest)
    json.dump(out, sys.stdout, indent=1, sort_keys=False, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
