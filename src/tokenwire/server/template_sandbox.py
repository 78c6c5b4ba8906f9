"""A request's own chat template (``--trust-request-chat-template``) rendered in a separate
process, bounded in time and memory.

The jinja2 sandbox keeps a template from reaching the server's objects, but not from spending
the server's CPU and memory: ``{{ 'a' * 10**9 }}``, a join over a huge range, or loops nested
deep enough render for minutes or exhaust the process. A template from the server's operator
(``--chat-template``, the tokenizer's) renders in-process as usual; a template a request brings
renders in a worker process with an address-space limit, and is given ``SECONDS`` to finish: past
it, or past the memory, the worker is killed (another starts for the next such request) and the
request gets a 400 naming ``chat_template``. Every failure of such a template is a 400.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import resource
import threading
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

from tokenwire.chat import render_chat
from tokenwire.messages.errors import ValidationError

__all__ = [
    "MAX_CHARS",
    "MEMORY_BYTES",
    "SECONDS",
    "brings_template",
    "render_request_template",
]

#: Seconds a request's template may take to render.
SECONDS = 2.0
#: Address space of the worker process that renders request templates.
MEMORY_BYTES = 1 << 30
#: Longest prompt text a request's template may render (characters).
MAX_CHARS = 64 << 20
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


_lock = threading.Lock()
_worker: _Worker | None = None


def render_request_template(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """``render_chat(template, messages, **kwargs)`` in the worker process, within ``SECONDS``
    and ``MEMORY_BYTES`` (``ValidationError`` naming ``chat_template`` past either). Blocks the
    calling thread: call it off the event loop."""
    global _worker
    with _lock:
        if _worker is None or not _worker.process.is_alive():
            try:
                _worker = _Worker()
            except (RuntimeError, OSError) as exc:
                raise ValidationError(
                    f"request chat templates cannot be rendered now ({exc})", param="chat_template"
                ) from None
        worker = _worker
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
        _worker = None
        raise ValidationError(failure, param="chat_template")


def brings_template(body: Any) -> bool:
    """Whether a request body carries its own ``chat_template`` (it then renders in the worker,
    so it is parsed off the event loop)."""
    return isinstance(body, Mapping) and body.get("chat_template") is not None
