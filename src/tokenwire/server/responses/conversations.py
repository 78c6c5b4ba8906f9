"""OpenAI's Conversations API: ``/v1/conversations`` (create, retrieve, update its metadata,
delete) and its items (``/v1/conversations/{id}/items``: list with ``after``, ``limit`` and
``order``, add up to 20 at a time, retrieve, delete). A response made with ``conversation``
reads the conversation's items as its context and adds its input and output to them. What one
API key makes, only that key sees."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from tokenwire.messages.errors import ClientDisconnected, TokenwireError, ValidationError
from tokenwire.server.errors import NotFound
from tokenwire.server.http import encode, read_json, respond, send_error
from tokenwire.server.responses.request import (
    check_ids,
    check_metadata,
    input_messages,
    normalize_items,
)
from tokenwire.server.responses.routes import page
from tokenwire.server.responses.state import Responses, owner_of

if TYPE_CHECKING:
    from tokenwire.server.app import App

__all__ = ["conversations"]

ROUTE = "conversations"
#: Items one request may add (OpenAI's bound).
MAX_ITEMS = 20


def _object(cid: str, created: int, metadata: dict[str, str]) -> dict[str, Any]:
    return {"id": cid, "object": "conversation", "created_at": created, "metadata": metadata}


def _items(value: Any, where: str = "items") -> list[dict[str, Any]]:
    """Items to add: checked as a response's input is, then as kept (each with an id)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValidationError(f"{where} must be a list of items", param=where)
    if len(value) > MAX_ITEMS:
        raise ValidationError(
            f"{where} has {len(value)} items: at most {MAX_ITEMS} may be added at a time",
            param=where,
        )
    check_ids(value, where)
    input_messages(value, where)
    return normalize_items(value)


async def _check_sizes(state: Responses, items: list[dict[str, Any]]) -> None:
    import msgspec

    store = await state.opened()
    for k, item in enumerate(items):
        size = len(msgspec.json.encode(item))
        if store.too_large(size):
            raise ValidationError(
                f"items[{k}] is too large to keep ({size} bytes; at most "
                f"{state.limits.max_record_bytes})",
                param="items",
            )


def _body(body: Any) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", param=None)
    return body


async def conversations(app: App, scope: dict, receive: Any, send: Any) -> None:
    """Every ``/v1/conversations`` route."""
    rt = app.runtime
    state: Responses = app.state.responses
    owner = owner_of(scope)
    parts = scope["path"].rstrip("/").split("/")[3:]  # after /v1/conversations
    method = scope["method"]
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    try:
        if not state.keeps:
            raise ValidationError(
                "this server keeps no conversations (--responses-store-size 0)", param=None
            )
        store = await state.opened()
        if not parts:
            if method != "POST":
                raise NotFound("method not allowed", 405)
            body = _body(await read_json(receive))
            metadata = check_metadata(body.get("metadata"))
            items = _items(body.get("items"))
            await _check_sizes(state, items)
            cid = "conv_" + uuid.uuid4().hex
            obj = _object(cid, int(time.time()), metadata)
            await store.put_conversation(cid, owner, obj, items)
            answer: Any = obj
        elif len(parts) == 1:
            cid = parts[0]
            if method == "GET":
                answer = await store.conversation(cid, owner)
            elif method == "POST":
                body = _body(await read_json(receive))
                obj = await store.conversation(cid, owner)
                obj["metadata"] = check_metadata(body.get("metadata"))
                await store.put_conversation(cid, owner, obj)
                answer = obj
            elif method == "DELETE":
                await store.delete(cid, owner, "conversation")
                answer = {"id": cid, "object": "conversation.deleted", "deleted": True}
            else:
                raise NotFound("method not allowed", 405)
        elif len(parts) == 2 and parts[1] == "items":
            cid = parts[0]
            if method == "GET":
                limit = _int(query, "limit", 20)
                descending = _descending(query)
                after = query.get("after", [None])[-1]
                data, more = await store.items(
                    cid, owner, after=after, limit=limit, descending=descending
                )
                answer = {
                    "object": "list",
                    "data": data,
                    "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None,
                    "has_more": more,
                }
            elif method == "POST":
                body = _body(await read_json(receive))
                if body.get("items") is None:
                    raise ValidationError("items is required", param="items")
                items = _items(body["items"])
                await _check_sizes(state, items)
                await store.add_items(cid, owner, items)
                answer = page(items, {"order": ["asc"], "limit": ["100"]})
            else:
                raise NotFound("method not allowed", 405)
        elif len(parts) == 3 and parts[1] == "items":
            cid, item = parts[0], parts[2]
            if method == "GET":
                answer = await store.item(cid, item, owner)
            elif method == "DELETE":
                await store.delete_item(cid, item, owner)
                answer = await store.conversation(cid, owner)
            else:
                raise NotFound("method not allowed", 405)
        else:
            raise NotFound(f"no route {scope['path'][:100]}", 404)
    except ClientDisconnected:
        return
    except TokenwireError as err:
        await send_error(rt.metrics, send, err, ROUTE)
        return
    rt.metrics.requests.labels(ROUTE, "200").inc()
    await respond(send, 200, encode(answer))


def _int(query: dict[str, list[str]], key: str, default: int) -> int:
    value = query.get(key, [None])[-1]
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        raise ValidationError(f"{key} must be an integer", param=key) from None
    if not 1 <= n <= 100:
        raise ValidationError(f"{key} must be between 1 and 100", param=key)
    return n


def _descending(query: dict[str, list[str]]) -> bool:
    order = query.get("order", ["desc"])[-1]
    if order not in ("asc", "desc"):
        raise ValidationError("order must be 'asc' or 'desc'", param="order")
    return order == "desc"
