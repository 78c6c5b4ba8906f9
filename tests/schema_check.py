"""Response bodies checked against a published API document's own schemas (vendored under
``conformance/``, see each file's ``x-tokenwire-source``), as a client generated from it reads
them: ``jsonschema`` over the document's ``components.schemas``, OpenAPI 3.0's ``nullable``
read as JSON Schema's null, and a test's named divergences applied first."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

HERE = Path(__file__).parent / "conformance"


def _nullable(node: Any) -> Any:
    """OpenAPI 3.0's ``nullable: true`` (which documents still use beside 3.1's null type) as
    JSON Schema: the schema, or null."""
    if isinstance(node, dict):
        node = {k: _nullable(v) for k, v in node.items()}
        if node.pop("nullable", False) is True:
            return {"anyOf": [node, {"type": "null"}]}
        return node
    if isinstance(node, list):
        return [_nullable(v) for v in node]
    return node


def patched(spec: dict[str, Any], divergences: list[tuple[str, Any]]) -> dict[str, Any]:
    """The document with ``nullable`` read as null and each ``(JSON pointer, replacement)``
    applied (a pointer to nothing the document says fails)."""
    out = copy.deepcopy(spec)
    out["components"]["schemas"] = _nullable(out["components"]["schemas"])
    for pointer, replacement in divergences:
        node: Any = out
        *parents, last = (
            p.replace("~1", "/").replace("~0", "~") for p in pointer.strip("/").split("/")
        )
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = replacement
        else:
            assert last in node, pointer
            node[last] = replacement
    return out


class Document:
    """One vendored document, checked with or without its divergences."""

    def __init__(self, filename: str, divergences: list[tuple[str, Any]]) -> None:
        self.raw: dict[str, Any] = json.loads((HERE / filename).read_text())
        self.uri = f"urn:{filename}"
        self.spec = patched(self.raw, divergences)
        self._registry = self._make(self.spec)
        self._strict = self._make(patched(self.raw, []))

    def _make(self, spec: dict[str, Any]) -> Registry:
        resource = Resource.from_contents(spec, default_specification=DRAFT202012)
        return Registry().with_resource(self.uri, resource)

    @property
    def schemas(self) -> dict[str, Any]:
        return self.raw["components"]["schemas"]

    def problems(self, name: str, body: Any, *, strict: bool = False) -> list[str]:
        """Every way ``body`` breaks schema ``name`` (``strict``: without the divergences)."""
        registry = self._strict if strict else self._registry
        ref = {"$ref": f"{self.uri}#/components/schemas/{name}"}
        out = []
        for err in Draft202012Validator(ref, registry=registry).iter_errors(body):
            leaf = err
            while leaf.context:  # anyOf/oneOf: the deepest reason is the useful one
                leaf = min(leaf.context, key=lambda e: len(e.context))
            where = "/".join(str(p) for p in leaf.absolute_path) or "(root)"
            out.append(f"{name} at {where}: {leaf.message[:300]}")
        return out

    def conforms(self, name: str, body: Any) -> None:
        found = self.problems(name, body)
        assert not found, "\n".join(found)
