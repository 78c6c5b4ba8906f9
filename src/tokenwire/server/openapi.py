"""``GET /openapi.json``: an OpenAPI 3.1 document of the routes this server serves, as configured
(the dev-mode, LoRA and tokenizer-info routes only when they are on), made from the app's own
route table: each path with its methods, a summary, the request body a POST takes (a JSON
object, the fields a route requires named), its answers, and the API key scheme when keys are
required."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenwire import __version__
from tokenwire.server.http import encode, respond

if TYPE_CHECKING:
    from tokenwire.server.app import App, Handler

__all__ = ["ROUTES", "document"]

#: path -> (summary, fields a POST body requires)
_KNOWN: dict[str, tuple[str, tuple[str, ...]]] = {
    "/v1/completions": ("OpenAI's completions (vLLM's and SGLang's extra fields)", ("prompt",)),
    "/v1/chat/completions": ("OpenAI's chat completions", ("messages",)),
    "/v1/responses": ("OpenAI's Responses API", ("input",)),
    "/v1/messages": ("Anthropic's Messages API", ("model", "messages", "max_tokens")),
    "/v1/messages/count_tokens": ("Anthropic's token count of a Messages request", ("messages",)),
    "/generate": ("SGLang's native generation", ()),
    "/v1/models": ("The served models and LoRA adapters", ()),
    "/health": ("200 while an engine serves", ()),
    "/live": ("200 while the process answers", ()),
    "/ready": ("200 when a request would be served or queued now", ()),
    "/metrics": ("Prometheus metrics (vLLM's names)", ()),
    "/tokenize": ("vLLM's tokenization of a prompt or a conversation", ()),
    "/detokenize": ("vLLM's text of token ids", ("tokens",)),
    "/v1/tokenize": ("SGLang's tokenization", ()),
    "/v1/detokenize": ("SGLang's text of token ids", ("tokens",)),
    "/get_load": ("SGLang's per-engine load", ()),
    "/v1/loads": ("SGLang's per-engine load report", ()),
    "/load": ("vLLM's requests in flight", ()),
    "/version": ("The server's version", ()),
    "/abort_request": ("SGLang's abort of a request (or all)", ()),
    "/flush_cache": ("SGLang's flush of the engines' prefix caches", ()),
    "/openapi.json": ("This document", ()),
}
#: Routes answered by prefix (not in the route table).
_PATTERNS: dict[str, tuple[str, list[str]]] = {
    "/v1/models/{model}": ("One served model's card", ["get"]),
    "/v1/responses/{response_id}": ("A kept response (read, delete)", ["get", "delete"]),
    "/v1/responses/{response_id}/cancel": ("Cancel a background response", ["post"]),
}


def _operation(method: str, path: str, handler: Any, secured: bool) -> dict[str, Any]:
    summary, required = _KNOWN.get(path, ("", ()))
    if not summary:
        doc = (getattr(handler, "__doc__", None) or "").strip().splitlines()
        summary = doc[0].strip("`. ") if doc else path
    op: dict[str, Any] = {
        "summary": summary,
        "operationId": f"{method}_{path.strip('/').replace('/', '_').replace('.', '_') or 'root'}",
        "responses": {
            "200": {"description": "OK"},
            "4XX": {"description": "The request is refused (the API's error shape)"},
            "5XX": {"description": "The server or its engines failed"},
        },
    }
    if method == "post":
        schema: dict[str, Any] = {"type": "object"}
        if required:
            schema["required"] = list(required)
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    if secured:
        op["security"] = [{"bearer": []}, {"apiKey": []}]
    return op


def document(app: App) -> dict[str, Any]:
    """The OpenAPI document of ``app``'s routes."""
    from tokenwire.server.security import OPEN_PATHS

    secured = app.keys.required
    paths: dict[str, dict[str, Any]] = {}
    for (method, path), handler in sorted(app._routes.items()):
        m = method.lower()
        paths.setdefault(path, {})[m] = _operation(
            m, path, handler, secured and path not in OPEN_PATHS
        )
    for path, (summary, methods) in _PATTERNS.items():
        for m in methods:
            op = _operation(m, path, None, secured)
            op["summary"] = summary
            paths.setdefault(path, {})[m] = op
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "tokenwire", "version": __version__},
        "paths": paths,
    }
    if secured:
        doc["components"] = {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            }
        }
    return doc


async def _openapi(app: App, receive: Any, send: Any) -> None:
    app.runtime.metrics.requests.labels("openapi", "200").inc()
    await respond(send, 200, encode(document(app)))


ROUTES: dict[tuple[str, str], Handler] = {("GET", "/openapi.json"): _openapi}
