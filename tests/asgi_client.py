"""Calling an ASGI app in process, without sockets: one request, the whole response."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import msgspec


@dataclass
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    chunks: list[bytes] = field(default_factory=list)

    def json(self):
        return msgspec.json.decode(self.body)

    def error(self) -> dict:
        return self.json()["error"]


async def call(
    app,
    method: str,
    path: str,
    body: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    timeout: float = 30,
) -> Response:
    """Send one request to ``app`` and collect its response (the client never disconnects)."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []
    forever = asyncio.Event()

    async def receive():
        if messages:
            return messages.pop()
        await forever.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    if headers is None:
        headers = [(b"content-type", b"application/json")]
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
        "scheme": "http",
        "http_version": "1.1",
    }
    await asyncio.wait_for(app(scope, receive, send), timeout)
    start = sent[0]
    assert start["type"] == "http.response.start"
    chunks = [m.get("body", b"") for m in sent[1:]]
    assert not sent[-1].get("more_body", False), "the response never ended"
    return Response(start["status"], dict(start["headers"]), b"".join(chunks), chunks)
