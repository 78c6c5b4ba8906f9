"""The access log: one line per HTTP request, written when its response is over, in uvicorn's
shape plus the duration (``127.0.0.1:51234 - "POST /v1/completions HTTP/1.1" 200 12.3ms``); a
stream that ended in an error event shows that error's status too, as the client read it
(``200 -> 500``); a request made with an API key ends with its name (``key=team-a``).
``--disable-access-log`` turns it off."""

from __future__ import annotations

import logging
import time
from typing import Any

from tokenwire.server.guard import passing
from tokenwire.server.security import request_key

__all__ = ["STREAM_ERROR", "access_line", "enabled", "logged"]

#: The ASGI scope key a response sets to the status of the error event its stream ended with.
STREAM_ERROR = "tokenwire.stream_error"

log = logging.getLogger("tokenwire.access")


def access_line(scope: dict[str, Any], status: int | None, seconds: float) -> str:
    """The log line of one request (``status`` None: the client left before any response; a
    stream that ended in an error event shows that error's status after the response's)."""
    client = scope.get("client")
    who = f"{client[0]}:{client[1]}" if client else "-"
    path = scope.get("root_path", "") + scope.get("path", "")  # (the path a proxy was sent)
    query = scope.get("query_string", b"")
    if query:
        path += "?" + query.decode("latin-1")
    version = scope.get("http_version", "1.1")
    shown = "-" if status is None else str(status)
    ended = scope.get(STREAM_ERROR)
    if ended is not None:
        shown += f" -> {ended}"
    method = scope.get("method", "-")
    line = f'{who} - "{method} {path} HTTP/{version}" {shown} {seconds * 1e3:.1f}ms'
    key = request_key(scope)
    return line if key is None else f"{line} key={key.name}"


def enabled() -> bool:
    """Whether the access log's lines are written (its logger takes INFO): when they are not, a
    request is served without ``logged``'s wrapper, and no line is made for nobody."""
    return log.isEnabledFor(logging.INFO)


async def logged(app: Any, scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Run the ASGI ``app`` for one HTTP request and log its line once it is over."""
    start = time.perf_counter()
    status: int | None = None

    async def send_seen(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    try:
        await app(scope, receive, passing(send_seen, send))
    finally:
        log.info("%s", access_line(scope, status, time.perf_counter() - start))
