"""Request size and time limits, and keeping big inputs off the event loop.

- ``--max-request-bytes``: a declared ``Content-Length`` past the limit is refused before a byte
  of the body is read, an undeclared (chunked) body as soon as it passes it (413, connection
  closed).
- A body that does not arrive within ``body_timeout`` seconds is refused (408).
- Bodies past ``OFFLOAD_BYTES`` are decoded and parsed (tokenized, templates rendered) in a worker
  thread, so a 2-million-character prompt does not stall every other stream and ``/health``
  (the Hugging Face tokenizer releases the GIL); so is a body that brings its own chat template
  (it renders in a worker process, ``template_sandbox``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import msgspec
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from tokenwire.messages.errors import (
    ClientDisconnected,
    PayloadTooLargeError,
    RequestTimeoutError,
    ValidationError,
)
from tokenwire.server import template_sandbox
from tokenwire.server.template_sandbox import brings_template

__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_MAX_REQUEST_BYTES",
    "OFFLOAD_BYTES",
    "bounded_receive",
    "check_content_length",
    "parse_body",
]

#: Largest request body by default: a full 128k-token context as JSON token ids is about 1 MB,
#: a batch of long prompts a few times that; 32 MiB leaves room for any real client.
DEFAULT_MAX_REQUEST_BYTES = 32 << 20
#: Seconds a client has to send its whole body once the headers are in.
DEFAULT_BODY_TIMEOUT = 30.0
#: Bodies larger than this are decoded and parsed in a worker thread.
OFFLOAD_BYTES = 64 << 10

T = TypeVar("T")
_decode_json = msgspec.json.Decoder()


def _too_large(limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"the request body is over this server's limit of {limit} bytes (--max-request-bytes)"
    )


def check_content_length(scope: dict, limit: int | None) -> None:
    """``PayloadTooLargeError`` when the request declares a body over ``limit`` bytes."""
    if limit is None:
        return
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise ValidationError("Content-Length is not a number", param=None) from None
            if declared > limit:
                raise _too_large(limit)


#: ``asyncio.timeout_at`` (Python 3.11 and later; None before).
_timeout_at = getattr(asyncio, "timeout_at", None)


def arrived(receive: Any) -> bool:
    """Whether ``receive`` returns at once: it is a request's own ``receive`` under uvicorn, and
    what it returns next is there (the body, or the client's going)."""
    cycle = getattr(receive, "__self__", None)
    return type(cycle) is RequestResponseCycle and cycle.message_event.is_set()


def bounded_receive(receive: Any, limit: int | None, timeout: float | None) -> Any:
    """``receive`` that refuses a body past ``limit`` bytes (``PayloadTooLargeError``) or slower
    than ``timeout`` seconds in all (``RequestTimeoutError``); past the body it passes through."""
    if limit is None and timeout is None:
        return receive
    state = {"size": 0, "deadline": None, "done": False}

    async def bounded() -> dict:
        if state["done"]:
            return await receive()
        if timeout is None or arrived(receive):
            message = await receive()  # (no timer for a body there already)
        else:
            loop = asyncio.get_running_loop()
            if state["deadline"] is None:
                state["deadline"] = loop.time() + timeout
            try:
                if _timeout_at is not None:
                    # (in this task: ``wait_for`` makes one, a turn of the loop for a body
                    # that is there already)
                    async with _timeout_at(state["deadline"]):
                        message = await receive()
                else:
                    message = await asyncio.wait_for(receive(), state["deadline"] - loop.time())
            except asyncio.TimeoutError:
                raise RequestTimeoutError(
                    f"the request body did not arrive within {timeout:g} s"
                ) from None
        if message["type"] == "http.request":
            state["size"] += len(message.get("body", b""))
            if limit is not None and state["size"] > limit:
                raise _too_large(limit)
            state["done"] = not message.get("more_body", False)
        else:
            state["done"] = True
        return message

    bounded.inner = receive  # type: ignore[attr-defined]  # (``http.disconnected`` reads it)
    return bounded


async def read_body(receive: Any) -> bytes:
    """The whole request body."""
    chunks = []
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected("the client went away before sending its request")
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def decode_json(body: bytes) -> Any:
    """The JSON value of a request body; ``ValidationError`` when it is not JSON."""
    try:
        return _decode_json.decode(body)
    except msgspec.DecodeError as exc:
        raise ValidationError(f"the request body is not valid JSON: {exc}", param=None) from None
    except RecursionError:
        raise ValidationError("the request body is nested too deeply", param=None) from None


#: Threads that decode and parse large bodies (their own: nothing else waits there).
PARSE_THREADS = 2
_parsers: ThreadPoolExecutor | None = None


def _parse_pool() -> ThreadPoolExecutor:
    global _parsers
    if _parsers is None:
        _parsers = ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="tokenwire-parse")
    return _parsers


async def parse_body(receive: Any, parse: Callable[[Any], T]) -> T:
    """``parse(json body)``, decoded and parsed in the parse threads when the body is large, or
    parsed in the template threads when it brings its own chat template (which renders in a
    worker process; ``template_sandbox.submit``): the two never wait for each other."""
    body, large = await read_json(receive)
    return await parse_decoded(body, parse, large)


async def read_json(receive: Any) -> tuple[Any, bool]:
    """The request's JSON body (decoded in the parse threads when it is large), and whether it
    is large."""
    raw = await read_body(receive)
    large = len(raw) > OFFLOAD_BYTES
    if not large:
        return decode_json(raw), False
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_parse_pool(), decode_json, raw), True


async def parse_decoded(body: Any, parse: Callable[[Any], T], large: bool) -> T:
    """``parse(body)`` where ``parse_body`` runs it: in the template threads when the body brings
    its own chat template, in the parse threads when ``large``, else here."""
    if brings_template(body):
        return await template_sandbox.submit(parse, body)
    if large:
        return await asyncio.get_running_loop().run_in_executor(_parse_pool(), parse, body)
    return parse(body)
