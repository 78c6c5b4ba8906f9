"""The handler guard: an unplanned exception is a generic 500 in OpenAI's shape before the
response starts, and an error event plus ``[DONE]`` once a stream has started."""

from __future__ import annotations

import logging

import msgspec

from tokenwire.server.guard import GENERIC_ERROR, guarded

from asgi_client import call


class Boom(RuntimeError):
    pass


async def _fails_at_once(scope, receive, send):
    raise Boom("secret detail /etc/passwd")


async def _fails_mid_stream(scope, receive, send):
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
    raise Boom("secret detail")


def _app(handler, seen):
    async def app(scope, receive, send):
        await guarded(handler, scope, receive, send, seen.append)

    return app


async def test_unplanned_exception_is_a_generic_json_500(caplog):
    seen = []
    with caplog.at_level(logging.ERROR, "tokenwire.server"):
        resp = await call(_app(_fails_at_once, seen), "POST", "/x")
    assert resp.status == 500
    assert resp.headers[b"content-type"] == b"application/json"
    assert int(resp.headers[b"content-length"]) == len(resp.body)
    err = resp.error()
    assert err["message"].endswith(GENERIC_ERROR) and err["code"] == 500
    assert "secret" not in resp.body.decode()
    assert "secret detail" in caplog.text  # the details are in the log only
    assert [e.status for e in seen] == [500]


async def test_stream_failing_mid_way_ends_with_error_event_and_done():
    resp = await call(_app(_fails_mid_stream, []), "POST", "/x")
    assert resp.status == 200
    events = [e[len(b"data: ") :] for e in resp.body.split(b"\n\n") if e]
    assert events[0] == b"{}" and events[-1] == b"[DONE]"
    err = msgspec.json.decode(events[-2])["error"]
    assert err["code"] == 500 and "secret" not in err["message"]


async def test_a_finished_response_is_left_alone():
    async def fails_after(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})
        raise Boom("late")

    resp = await call(_app(fails_after, []), "GET", "/x")
    assert resp.status == 200 and resp.chunks == [b"ok"]


async def test_mid_stream_chunks_may_skip_the_wrappers_that_watch_start_and_end():
    """``direct`` of a send wrapped by ``guarded``, the access log and a CORS header adder is the
    server's own send; a stream written through it still gets its error event from the guard."""
    from tokenwire.server import access_log
    from tokenwire.server.guard import direct

    seen: list = []
    sends: list = []

    async def handler(scope, receive, send):
        sends.append(direct(send))
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await direct(send)(
            {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True}
        )
        raise Boom("late")

    async def app(scope, receive, send):
        sends.append(send)
        await access_log.logged(
            lambda s, r, w: guarded(handler, s, r, w, seen.append), scope, receive, send
        )

    resp = await call(app, "POST", "/x")
    assert sends[1] is sends[0]  # the server's send itself
    assert resp.body.startswith(b"data: 1\n\n") and resp.body.endswith(b"data: [DONE]\n\n")
    assert len(seen) == 1
