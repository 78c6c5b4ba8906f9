"""A server's Responses API state: the store (opened at start, or at first use), the background
responses this worker runs, the MCP servers configured at start, and what every route does with
them: the context a request continues, a response kept at its start and at its end.

Background responses run in the worker that took them; any worker reads them from the store and
cancels them through it (``tw_runs``): the running worker's beat, every quarter second while it
runs any, renews its claim and picks up the cancels asked for. One whose worker stopped beating
(it died) reads as failed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from tokenwire.messages.errors import OverloadedError, ValidationError
from tokenwire.server.config import ResponsesConfig
from tokenwire.server.mcp import McpBounds, ToolServers, missing_sdk
from tokenwire.server.responses.request import ResponsesRequest, conversation_id
from tokenwire.server.responses.store import Limits, NotFoundError, Store, open_backend

__all__ = ["BackgroundLimit", "Responses", "owner_of"]

log = logging.getLogger("tokenwire.server")

#: Seconds between a running worker's beats.
BEAT = 0.25
#: A background response whose worker has not beaten for this long is taken as failed.
STALE = 15.0
#: Seconds a request waits for the response it continues to be kept as ended.
_SETTLE = 2.0
#: Seconds between sweeps of expired responses and conversations.
_SWEEP = 60.0


def owner_of(scope: dict | None) -> str:
    """Who a request stores as: its API key's id, ``""`` when the server requires none."""
    from tokenwire.server.security import request_key

    key = request_key(scope or {})
    return key.id if key is not None else ""


class BackgroundLimit:
    """Background responses run at a time, per owner (API key), in this worker: they hold
    engine slots with no client connected, so they pass the request path's admission (the
    runtime's ``--max-concurrent-requests``) and this bound of their own
    (``--max-background-responses``)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.running: Counter[str] = Counter()

    def admit(self, owner: str) -> Callable[[], None]:
        """Take a place for ``owner`` (429 when it has none left); returns its release."""
        if self.running[owner] >= self.most:
            raise OverloadedError(
                f"too many background responses in flight for this key (limit {self.most}, "
                "--max-background-responses): wait for one to end, or cancel one",
                param="background",
            )
        self.running[owner] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.running[owner] -= 1
                if self.running[owner] <= 0:
                    del self.running[owner]

        return release


class Responses:
    """A server's Responses API state."""

    def __init__(self, store_size: int, config: ResponsesConfig | None = None) -> None:
        self.config = config or ResponsesConfig()
        self.store_size = store_size
        cfg = self.config
        self.limits = Limits(
            max_roots=store_size,
            max_bytes=cfg.max_bytes,
            max_owner_bytes=cfg.max_key_bytes,
            ttl=cfg.ttl,
        )
        self.store: Store | None = None
        self._opening: asyncio.Future[Store] | None = None
        #: Background responses this worker runs: their tasks, and how each is cancelled.
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.cancels: dict[str, Callable[[], Any]] = {}
        self.background = BackgroundLimit(cfg.max_background)
        self.mcp_bounds = McpBounds(cfg.mcp_timeout, cfg.mcp_max_output_bytes)
        self.tool_servers = ToolServers((), cfg.mcp_allowed_urls)
        self._beat: asyncio.Task[None] | None = None
        #: Store writes ``end`` started (a conversation's new items, a run's end).
        self._pending: set[asyncio.Task[Any]] = set()

    @property
    def keeps(self) -> bool:
        """Whether responses are kept at all (``--responses-store-size 0``: none)."""
        return self.store_size > 0

    async def start(self) -> None:
        """Open the store, and reach the configured MCP servers (a failure stops the start)."""
        if self.keeps:
            await self.opened()
        if self.config.tool_servers:
            missing = missing_sdk()
            if missing is not None:
                raise RuntimeError(f"--tool-server: {missing}")
            self.tool_servers = await ToolServers.configured(
                self.config.tool_servers, self.config.mcp_allowed_urls, self.mcp_bounds
            )

    async def opened(self) -> Store:
        """The store, opened at first use (in a thread: a database may be far)."""
        if self.store is not None:
            return self.store
        if self._opening is None:
            loop = asyncio.get_running_loop()
            url = self.config.store

            async def open_it() -> Store:
                backend = await loop.run_in_executor(None, open_backend, url)
                log.info("responses store: %s", backend.url)
                return Store(backend, self.limits)

            self._opening = asyncio.ensure_future(open_it())
        try:
            self.store = await asyncio.shield(self._opening)
        except BaseException:
            self._opening = None
            raise
        if self._beat is None:
            self._beat = asyncio.get_running_loop().create_task(self._beating())
        return self.store

    async def close(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(BaseException):
                await self._beat
        for task in list(self.tasks.values()):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=5)
        if self.store is not None:
            await self.store.close()
            self.store = None

    async def _beating(self) -> None:
        """While this worker runs background responses: renew their claim, and cancel those
        another worker asked to cancel; now and then, forget what expired."""
        swept = time.monotonic()
        while True:
            await asyncio.sleep(BEAT)
            store = self.store
            if store is None:
                continue
            try:
                if self.tasks:
                    for rid in await store.beat():
                        cancel = self.cancels.get(rid)
                        if cancel is not None:
                            cancel()
                if time.monotonic() - swept > _SWEEP:
                    swept = time.monotonic()
                    await store.sweep()
            except Exception as exc:  # (the store is down: try again at the next beat)
                log.warning("responses store beat: %s", exc)

    # ---- what requests continue ----------------------------------------------------------------

    async def context(self, body: Any, owner: str) -> list[dict[str, Any]]:
        """The items a request's ``previous_response_id`` or ``conversation`` brings before its
        input (a 404 when none is kept for this key; a 400 when a previous response still
        runs)."""
        if not isinstance(body, dict):
            return []
        previous = body.get("previous_response_id")
        conversation = body.get("conversation")
        if previous is None and conversation is None:
            return []
        if previous is not None and conversation is not None:
            return []  # (read_request refuses both)
        if not self.keeps:
            field = "previous_response_id" if previous is not None else "conversation"
            raise ValidationError(
                f"this server keeps no responses (--responses-store-size 0): {field} "
                "cannot be used",
                param=field,
            )
        store = await self.opened()
        if isinstance(previous, str):
            items: list[dict[str, Any]] = []
            chain = await store.chain(previous, owner)
            # A response that just ended may still be on its way to the store from another
            # worker (a stream's last event goes out as its final write is submitted).
            waited = 0.0
            while (
                waited < _SETTLE
                and chain[-1]["response"]["status"] in ("queued", "in_progress")
                and not chain[-1]["response"].get("background")
            ):
                await asyncio.sleep(0.05)
                waited += 0.05
                chain = await store.chain(previous, owner)
            for doc in chain:
                response = doc["response"]
                if response["status"] in ("queued", "in_progress"):
                    raise ValidationError(
                        f"previous response '{response['id'][:80]}' is still in progress",
                        param="previous_response_id",
                    )
                if response.get("conversation"):
                    raise ValidationError(
                        f"previous response '{response['id'][:80]}' is in a conversation: "
                        "continue it with conversation",
                        param="previous_response_id",
                    )
                items += doc["input"] + response["output"]
            return items
        if previous is not None:
            return []  # (read_request names the bad type)
        try:
            cid = conversation_id(conversation)
        except ValidationError:
            return []
        assert cid is not None
        try:
            return await store.all_items(cid, owner)
        except NotFoundError as exc:
            raise NotFoundError(exc.detail, param="conversation") from None

    # ---- keeping responses ---------------------------------------------------------------------

    def document(self, req: ResponsesRequest, response: dict[str, Any]) -> dict[str, Any]:
        """What the store keeps of response ``req``."""
        return {"response": response, "input": req.input_items}

    async def check_size(self, req: ResponsesRequest, response: dict[str, Any]) -> None:
        """A response too large for the store (past what one record may take) is refused up
        front: 400 naming ``store``."""
        store = await self.opened()
        import msgspec

        size = len(msgspec.json.encode(self.document(req, response)))
        if store.too_large(size):
            raise ValidationError(
                f"this response's input is too large to keep ({size} bytes; this server keeps "
                f"at most {self.limits.max_record_bytes} per response): send store: false",
                param="store",
            )

    async def begin(self, req: ResponsesRequest, owner: str, response: dict[str, Any]) -> None:
        """Keep response ``req`` from its start (a background one claimed by this worker)."""
        store = await self.opened()
        if req.background:  # (claimed first: a reader never sees it running unclaimed)
            await store.run_start(req.id)
        await store.put_response(req.id, owner, self.document(req, response))

    def end(
        self, req: ResponsesRequest, owner: str, response: dict[str, Any]
    ) -> asyncio.Future[Any] | None:
        """Response ``req`` is over: its final object kept (submitted now, so every later read
        of this worker sees it; the future says when it is written), and, in a conversation,
        its input and output added to it."""
        if not req.store or self.store is None:
            return None
        store = self.store
        written = store.put_response_soon(req.id, owner, self.document(req, response))
        if req.conversation and response["status"] in ("completed", "incomplete"):
            items = req.input_items + response["output"]
            task = asyncio.ensure_future(self._add(store, req.conversation, owner, items))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            written = asyncio.gather(written, task, return_exceptions=True)
        if req.background:
            task = asyncio.ensure_future(store.run_end(req.id))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        return written

    @staticmethod
    async def _add(store: Store, cid: str, owner: str, items: list[dict[str, Any]]) -> None:
        try:
            await store.add_items(cid, owner, items)
        except Exception as exc:
            log.warning("conversation %s: the response's items were not added: %s", cid[:80], exc)

    async def settled(self) -> None:
        """Every write ``end`` started has finished."""
        if self._pending:
            await asyncio.wait(list(self._pending))

    async def read(self, rid: str, owner: str) -> dict[str, Any]:
        """Response ``rid``'s document as it stands: a background response whose worker stopped
        (it died) reads as failed."""
        store = await self.opened()
        doc = await store.response(rid, owner)
        response = doc["response"]
        if response.get("background") and response["status"] in ("queued", "in_progress"):
            if rid in self.tasks:
                return doc
            run = await store.run(rid)
            now = time.time()
            stale = run is None or now - run.beat > STALE
            if stale and now - float(response.get("created_at") or 0) > STALE:
                response = {
                    **response,
                    "status": "failed",
                    "error": {
                        "code": "server_error",
                        "message": "the server running this background response stopped",
                    },
                }
                doc = {**doc, "response": response}
                await store.put_response(rid, owner, doc)
                await store.run_end(rid)
        return doc
