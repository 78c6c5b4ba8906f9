"""Clients that stop reading: they cost bounded memory and work, never slow other streams down,
and are ended (engine slot freed, connection closed) once they have read nothing for long enough."""

from __future__ import annotations

import json
import socket
import time

import httpx

from tokenwire.engine.synthetic import SyntheticConfig

from served import MODEL, raw_request, serve, wait_until

#: SGLang's streaming repeats the whole text so far in every chunk: a stalled client's socket
#: buffers fill within seconds, and its sink then merges every step.
_STALLING = json.dumps(
    {
        "text": "Hi",
        "stream": True,
        "sampling_params": {"max_new_tokens": 30000, "ignore_eos": True},
    }
).encode()


def _reading_stream(url: str, tokens: int) -> float:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": tokens, "stream": True}
    body["ignore_eos"] = True
    start = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        text = b"".join(resp.iter_bytes())
    assert text.endswith(b"data: [DONE]\n\n")
    return time.perf_counter() - start


def _dechunked(response: bytes) -> bytes:
    """The body of a raw HTTP/1.1 response in chunked transfer coding."""
    at = response.index(b"\r\n\r\n") + 4
    body = bytearray()
    while True:
        line_end = response.index(b"\r\n", at)
        n = int(response[at:line_end], 16)
        if not n:
            return bytes(body)
        body += response[line_end + 2 : line_end + 2 + n]
        at = line_end + 2 + n + 2


def _stalled(s, n: int) -> bool:
    sinks = [st.sink for st in s.runtime.shard._reqs.values()]
    return len(sinks) >= n and all(len(k) >= k.capacity for k in sinks)


def test_fifty_non_reading_clients_leave_a_reading_stream_alone():
    # The reading stream's pace is the engine's (100 steps of 10 ms); what the stalled clients
    # cost the event loop comes on top. (That merging stays O(1) per step however long a client
    # stalls is tests/test_egress.py's to show, without a clock.)
    with serve(SyntheticConfig(step_time=0.01), stall_timeout=None) as s:
        # Best of three: noise from other processes only ever adds time.
        unloaded = min(_reading_stream(s.url, 100) for _ in range(3))
        socks = [
            raw_request(s.port, "POST", "/generate", _STALLING, rcvbuf=4096) for _ in range(50)
        ]
        try:
            # Every one of them has stopped reading: its sink is full and merging.
            assert wait_until(lambda: _stalled(s, 50), 60)
            # Noise only adds time, so one run within the bound shows the property; a cost the
            # stalled clients really add shows in every run (up to six on a busy machine).
            loaded = float("inf")
            for _ in range(6):
                loaded = min(loaded, _reading_stream(s.url, 100))
                if loaded <= 1.2 * unloaded:
                    break
            assert _stalled(s, 50) and s.engine.running >= 50  # still there, still stalled
        finally:
            for sock in socks:
                sock.close()
        assert loaded <= 1.2 * unloaded, (loaded, unloaded)


def test_a_client_that_stops_reading_is_ended_and_its_engine_slot_freed():
    with serve(SyntheticConfig(step_time=0.005), stall_timeout=1.0) as s:
        sock = raw_request(s.port, "POST", "/generate", _STALLING, rcvbuf=4096)
        try:
            assert wait_until(lambda: _stalled(s, 1), 60)
            # Not a read for a second: the request is ended in the engine and the shard...
            assert wait_until(lambda: s.engine.running == 0 and len(s.runtime.shard) == 0, 10)
            assert s.engine.stats["aborted"] == 1
            # ...and the connection is closed: draining it reaches the end.
            sock.settimeout(10)
            with_end = b""
            while chunk := sock.recv(1 << 20):
                with_end = (with_end + chunk)[-4096:]
            assert with_end  # everything the server had sent, then EOF
        except TimeoutError as exc:  # pragma: no cover - the failure being tested for
            raise AssertionError("the server never closed the stalled connection") from exc
        finally:
            sock.close()
        assert httpx.get(s.url + "/health").status_code == 200


def test_a_client_that_pauses_then_reads_on_gets_its_whole_stream():
    """The server stops taking a stream's output while the client's socket is full (its sink
    fills and merges), and writes on once the client reads again: what the client finally
    reads is the whole answer, the same as without streaming."""
    request = {
        "text": "Hi",
        "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True, "sampling_seed": 7},
    }
    # The stall comes once the connection's buffers hold some 4 MB, about 730 steps into this
    # stream while the server keeps up with the engine. A step of 1 ms keeps the engine from
    # outrunning a busy server (whose merged chunks repeat the text less often, so the stream
    # could end before the buffers fill).
    with serve(SyntheticConfig(output="random", step_time=0.001), stall_timeout=None) as s:
        whole = httpx.post(s.url + "/generate", json=request, timeout=60).json()
        body = json.dumps({**request, "stream": True}).encode()
        sock = raw_request(s.port, "POST", "/generate", body, rcvbuf=4096)
        try:
            assert wait_until(lambda: _stalled(s, 1), 60)  # the client's socket is full
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # reading at speed
            sock.settimeout(30)
            received = bytearray()
            while chunk := sock.recv(1 << 20):  # reading on, to the end of the stream
                received += chunk
                if received.endswith(b"0\r\n\r\n"):
                    break
            data = bytes(received)
        finally:
            sock.close()
    events = [e for e in _dechunked(data).split(b"\n\n") if e.startswith(b"data: {")]
    last = json.loads(events[-1][len(b"data: ") :])
    assert last["text"] == whole["text"]
    assert last["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
