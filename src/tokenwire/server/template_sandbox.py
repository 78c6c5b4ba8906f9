"""A request's own chat template (``--trust-request-chat-template``) rendered in a separate
process, bounded in time and memory.

The jinja2 sandbox keeps a template from reaching the server's objects, but not from spending
the server's CPU and memory: ``{{ 'a' * 10**9 }}``, a join over a huge range, or loops nested
deep enough render for minutes or exhaust the process. A template from the server's operator
(``--chat-template``, the tokenizer's) renders in-process as usual; a template a request brings
renders in a worker process with an address-space limit, and is given ``SECONDS`` to finish: past
it, or past the memory, the worker is killed (another starts for the next such request) and the
request gets a 400 naming ``chat_template``. Every failure of such a template is a 400.

``WORKERS`` such processes render side by side (each template in one of them), in threads of
their own (``submit``), apart from the threads that parse large bodies: at most
``MAX_WAITING`` requests wait for one, and a request past that is a 429 at once, so slow
templates never hold up a request that brings none.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import resource
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from tokenwire.chat import render_chat
from tokenwire.messages.errors import OverloadedError, ValidationError

__all__ = [
    "MAX_CHARS",
    "MAX_WAITING",
    "MEMORY_BYTES",
    "SECONDS",
    "WORKERS",
    "brings_template",
    "render_request_template",
    "submit",
]

#: Seconds a request's template may take to render.
SECONDS = 2.0
#: Address space of the worker process that renders request templates.
MEMORY_BYTES = 1 << 30
#: Longest prompt text a request's template may render (characters).
MAX_CHARS = 64 << 20
#: Worker processes rendering request templates side by side.
WORKERS = 2
#: Requests that may wait for a worker (past it: 429 at once).
MAX_WAITING = 16
#: Seconds a new worker process may take to start.
_START_SECONDS = 60.0


def _serve(conn: Connection, memory: int) -> None:  # pragma: no cover - runs in the worker
    """The worker: render what comes, answer ``("ok", text)`` or ``("error", (detail,
    param))``."""
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    conn.send(("ready", None))  # (its imports done: the render clock starts at a request)
    while True:
        try:
            template, messages, kwargs = conn.recv()
        except EOFError:
            return
        try:
            text = render_chat(template, messages, **kwargs)
            if len(text) > MAX_CHARS:
                reply: tuple[str, Any] = (
                    "error",
                    (
                        f"the chat template rendered more than {MAX_CHARS} characters",
                        "chat_template",
                    ),
                )
            else:
                reply = ("ok", text)
        except ValidationError as exc:
            reply = ("error", (exc.detail, exc.param))
        except MemoryError:
            reply = ("error", ("the chat template used too much memory", "chat_template"))
        except BaseException as exc:  # anything a template can raise is the request's 400
            reply = ("error", (f"the chat template failed ({type(exc).__name__})", "chat_template"))
        try:
            conn.send(reply)
        except MemoryError:
            conn.send(("error", ("the chat template used too much memory", "chat_template")))


class _Worker:
    """One worker process and its pipe; used by one render at a time."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_serve, args=(child, MEMORY_BYTES), name="tokenwire-templates", daemon=True
        )
        self.process.start()
        child.close()
        # Starting a worker (a new interpreter and its imports) is not a template's time.
        if not self.conn.poll(_START_SECONDS) or self.conn.recv()[0] != "ready":
            self.kill()
            raise RuntimeError("the template worker did not start")

    def render(self, template: str, messages: list[dict], kwargs: dict[str, Any]) -> str:
        self.conn.send((template, messages, kwargs))
        if not self.conn.poll(SECONDS):
            raise TimeoutError
        kind, value = self.conn.recv()
        if kind == "ok":
            return value
        detail, param = value
        raise ValidationError(detail, param=param)

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
            self.process.join(5)
        with contextlib.suppress(Exception):
            self.conn.close()


_slots: list[_Worker | None] = [None] * WORKERS
_free = list(range(WORKERS))
_cond = threading.Condition()
_threads: ThreadPoolExecutor | None = None
_waiting = 0


def render_request_template(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """``render_chat(template, messages, **kwargs)`` in a worker process, within ``SECONDS``
    and ``MEMORY_BYTES`` (``ValidationError`` naming ``chat_template`` past either). Blocks the
    calling thread until a worker is free and it is done: call it off the event loop
    (``submit``)."""
    with _cond:
        while not _free:
            _cond.wait()
        slot = _free.pop()
    try:
        return _render_in(slot, template, messages, kwargs)
    finally:
        with _cond:
            _free.append(slot)
            _cond.notify()


def _render_in(slot: int, template: str, messages: list[dict[str, Any]], kwargs: dict) -> str:
    worker = _slots[slot]
    if worker is None or not worker.process.is_alive():
        try:
            worker = _slots[slot] = _Worker()
        except (RuntimeError, OSError) as exc:
            raise ValidationError(
                f"request chat templates cannot be rendered now ({exc})", param="chat_template"
            ) from None
    try:
        return worker.render(template, messages, dict(kwargs))
    except ValidationError:
        raise
    except TimeoutError:
        failure = f"the chat template did not render within {SECONDS:g} s"
    except (EOFError, OSError):
        failure = "the chat template used too much memory"
    except Exception as exc:  # a reply that cannot be read back (pickling)
        failure = f"the chat template failed ({type(exc).__name__})"
    worker.kill()
    _slots[slot] = None
    raise ValidationError(failure, param="chat_template")


async def submit(call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)`` (a request's parse, which renders its own template) in the template
    threads: ``OverloadedError`` (429) at once when ``MAX_WAITING`` requests already wait."""
    global _threads, _waiting
    if _waiting >= MAX_WAITING:
        raise OverloadedError(
            f"{_waiting} requests with their own chat template are waiting to render: try "
            "again later"
        )
    if _threads is None:
        _threads = ThreadPoolExecutor(WORKERS, thread_name_prefix="tokenwire-templates")
    _waiting += 1
    try:
        return await asyncio.get_running_loop().run_in_executor(_threads, call, *args)
    finally:
        _waiting -= 1


def brings_template(body: Any) -> bool:
    """Whether a request body carries its own ``chat_template`` (it then renders in the worker,
    so it is parsed off the event loop)."""
    return isinstance(body, Mapping) and body.get("chat_template") is not None
