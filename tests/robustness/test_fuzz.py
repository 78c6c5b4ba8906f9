"""Property-based fuzzing of every route's body: whatever a client sends, the answer is a 2xx or
a 4xx in its API's shape (OpenAI's, or Anthropic's on /v1/messages; never a 500, never a hang), a
stream ends as its API ends one, nothing leaks, and /health is fine after.

Bodies are drawn from three families: arbitrary JSON (and bytes), objects made of each route's
real field names with arbitrary values (most of the state space a parser can mishandle), and a
valid body with one or two fields changed (which reaches the checks behind the first field). The
engine echoes the prompt, so every accepted request ends by itself. ``TOKENWIRE_PROPERTY_SCALE``
scales the number of examples (CI runs a fast slice).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.messages.sampling import _INPUT_FIELDS
from tokenwire.server import ServerConfig, create_app
from tokenwire.server import generate as sglang
from tokenwire.server.anthropic import request as anthropic_request
from tokenwire.server.openai import parse as openai_parse
from tokenwire.server.pooling import requests as pooling_request
from tokenwire.server.responses import request as responses_request

from asgi_client import call
from conftest import examples, real_tokenizer

ROUTES = {
    "/v1/completions": sorted(openai_parse._COMPLETION_KEYS | {"truncate_prompt_tokens"}),
    "/v1/chat/completions": sorted(openai_parse._CHAT_KEYS | {"truncate_prompt_tokens"}),
    "/generate": sorted(sglang._GENERATE_KEYS),
    "/tokenize": ["prompt", "messages", "add_special_tokens", "model", "return_token_strs"],
    "/detokenize": ["tokens", "model"],
    "/v1/responses": sorted(responses_request.RESPONSES_KEYS),
    "/v1/messages": sorted(anthropic_request.MESSAGES_KEYS),
    "/v1/messages/count_tokens": sorted(anthropic_request.COUNT_TOKENS_KEYS),
    "/v1/embeddings": sorted(pooling_request._EMBEDDINGS_FIELDS),
    "/pooling": sorted(pooling_request._POOLING_FIELDS),
    "/classify": sorted(pooling_request._CLASSIFY_FIELDS | {"text"}),
    "/score": sorted(pooling_request._SCORING | {"queries", "documents", "text_1", "text_2"}),
    "/rerank": sorted(pooling_request._RERANK_FIELDS),
    "/encode": sorted(pooling_request._ENCODE_FIELDS),
}
#: Routes whose errors are in Anthropic's shape.
ANTHROPIC = {"/v1/messages", "/v1/messages/count_tokens"}

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["", "x", "Hi", "stop", "<|im_end|>", "\u00e9", "\ud7ff", "auto", "none"])
)
json_any = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
token_ids = st.lists(st.integers(min_value=-2, max_value=160_000), max_size=6)
#: JSON text nested past what recursive parsers take (schemas, tool-call arguments as text).
deep_text = st.sampled_from([200, 1500, 5000]).map(lambda d: "[" * d + "]" * d)
tool_call = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["f", "g"]), "arguments": deep_text | json_any}
        ),
    },
    optional={"id": st.text(max_size=5)},
)
#: Anthropic's content blocks.
block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10) | json_any}),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_use"),
            "id": st.text(max_size=4) | json_any,
            "name": st.sampled_from(["f", "g"]),
            "input": st.dictionaries(st.text(max_size=4), json_any, max_size=2) | json_any,
        }
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": st.text(max_size=4) | json_any},
        optional={"content": st.text(max_size=10) | json_any, "is_error": json_any},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["thinking", "redacted_thinking", "image"])},
        optional={"thinking": json_any},
    ),
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "x"])},
    optional={
        "content": st.text(max_size=20) | st.lists(block, max_size=3) | json_any,
        "tool_calls": st.lists(tool_call, max_size=2) | json_any,
        "name": json_any,
        "reasoning_content": json_any,
    },
)
#: The Responses API's input items.
item = st.one_of(
    message,
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": st.text(max_size=4) | json_any,
            "name": st.sampled_from(["f", "g"]),
            "arguments": deep_text | json_any,
        }
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": st.just("c")},
        optional={"output": st.text(max_size=10) | json_any},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["reasoning", "item_reference", "message"])},
        optional={"summary": json_any, "content": json_any, "role": json_any},
    ),
)
schema = deep_text | json_any
tool = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": st.sampled_from(["f", "g"])}, optional={"parameters": schema}
            ),
        }
    ),
    # the Responses API's, and Anthropic's
    st.fixed_dictionaries(
        {"type": st.just("function"), "name": st.sampled_from(["f", "g"])},
        optional={"parameters": schema},
    ),
    st.fixed_dictionaries({"name": st.sampled_from(["f", "g"])}, optional={"input_schema": schema}),
)
# Values that look right for the fields that matter most, mixed with arbitrary ones.
FIELD_VALUES = {
    "prompt": st.text(max_size=30)
    | token_ids
    | st.lists(token_ids | st.text(max_size=5), max_size=3),
    # /generate's, and the Responses API's
    "text": st.text(max_size=30)
    | st.lists(st.text(max_size=5), max_size=3)
    | st.fixed_dictionaries(
        {"format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_schema"])})},
        optional={"verbosity": json_any},
    ),
    "input_ids": token_ids | st.lists(token_ids, max_size=3),
    "messages": st.lists(message, max_size=3),
    "max_tokens": st.integers(min_value=-2, max_value=50),
    "n": st.integers(min_value=-1, max_value=4),
    "stream": st.booleans(),
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3),
    "sampling_params": st.dictionaries(
        st.sampled_from(sorted(_INPUT_FIELDS)), json_any | deep_text, max_size=4
    ),
    "tools": st.lists(tool, max_size=2),
    "tool_choice": st.sampled_from(
        [
            "auto",
            "none",
            "required",
            {"type": "function", "function": {"name": "f"}},
            {"type": "function", "name": "f"},
            {"type": "any"},
            {"type": "tool", "name": "g"},
            {"type": "auto", "disable_parallel_tool_use": True},
        ]
    ),
    "input": st.text(max_size=30)
    | st.lists(item, max_size=3)
    # (the pooling routes': token ids, or a batch of texts and token ids)
    | token_ids
    | st.lists(token_ids | st.text(max_size=5), max_size=3),
    "documents": st.text(max_size=10) | st.lists(st.text(max_size=10) | json_any, max_size=3),
    "queries": st.text(max_size=10) | st.lists(st.text(max_size=10), max_size=3),
    "query": st.text(max_size=10) | json_any,
    "dimensions": st.integers(min_value=-2, max_value=500),
    "truncate_prompt_tokens": st.integers(min_value=-3, max_value=50_000),
    "encoding_format": st.sampled_from(["float", "base64", "bytes", "bytes_only", "hex"]),
    "top_n": st.integers(min_value=-1, max_value=5),
    "system": st.text(max_size=10) | st.lists(block, max_size=2),
    "max_output_tokens": st.integers(min_value=-2, max_value=50),
    "stop_sequences": st.lists(st.text(max_size=5), max_size=3),
    "reasoning": st.fixed_dictionaries({}, optional={"effort": json_any, "summary": json_any}),
    "thinking": st.fixed_dictionaries(
        {"type": st.sampled_from(["enabled", "disabled", "adaptive"])},
        optional={"budget_tokens": json_any},
    ),
    "store": st.booleans(),
    "background": st.booleans(),
    "previous_response_id": st.text(max_size=8),
    "guided_json": deep_text | json_any,
    "response_format": st.fixed_dictionaries(
        {
            "type": st.just("json_schema"),
            "json_schema": st.fixed_dictionaries(
                {"name": st.just("x"), "schema": deep_text | json_any}
            ),
        }
    ),
    "chat_template_kwargs": st.dictionaries(
        st.sampled_from(["self", "messages", "enable_thinking", "x"]), json_any, max_size=2
    ),
}


#: A valid body per route, for bodies that change one or two of its fields (most arbitrary
#: bodies are refused at their first bad field, before the deeper checks).
VALID = {
    "/v1/completions": {"prompt": "hi", "max_tokens": 3},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 3}},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [1, 2]},
    "/v1/responses": {"input": "hi", "max_output_tokens": 3},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/embeddings": {"input": ["hi", "there"]},
    "/pooling": {"input": "hi"},
    "/classify": {"input": "hi"},
    "/score": {"queries": "hi", "documents": ["a", "b"]},
    "/rerank": {"query": "hi", "documents": ["a", "b"]},
    "/encode": {"text": "hi"},
}


def bodies(path: str):
    fields = ROUTES[path]
    value = lambda key: FIELD_VALUES.get(key, st.nothing()) | json_any  # noqa: E731

    def some_fields(least: int, most: int):
        keys = st.lists(st.sampled_from(fields), min_size=least, max_size=most, unique=True)
        return keys.flatmap(lambda ks: st.fixed_dictionaries({k: value(k) for k in ks}))

    shaped = some_fields(0, 6)
    near_valid = some_fields(1, 2)
    return st.one_of(
        shaped.map(lambda b: json.dumps(b).encode()),
        near_valid.map(lambda b: json.dumps(VALID[path] | b).encode()),
        json_any.map(lambda b: json.dumps(b).encode()),
        st.binary(max_size=40),
    )


#: How each API's streams end: the last event's first line (OpenAI's: ``data: [DONE]``).
_STREAM_ENDS = {
    "/v1/responses": (
        b"event: response.completed",
        b"event: response.incomplete",
        b"event: response.failed",
    ),
    "/v1/messages": (b"event: message_stop", b"event: error"),
}


class _LoopApp:
    """The app on an event loop of its own thread, for synchronous hypothesis tests."""

    def __init__(self) -> None:
        tok = real_tokenizer("default")
        engine = SyntheticEngine(tok, SyntheticConfig(output="echo", step_time=0))
        self.app = create_app(tok, engine, ServerConfig(body_timeout=5))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.run(self.app.runtime.start())

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.run(self.app.runtime.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def served():
    s = _LoopApp()
    yield s
    s.close()


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_fuzzed_bodies_never_500_never_hang(served, path):
    @settings(
        max_examples=examples(200),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(bodies(path))
    def check(body: bytes) -> None:
        resp = served.run(call(served.app, "POST", path, body, timeout=20))
        assert resp.status < 500, (resp.status, body[:200], resp.body[:300])
        if resp.status >= 400 and path in ANTHROPIC:
            answer = resp.json()
            assert answer["type"] == "error" and set(answer["error"]) == {"type", "message"}
        elif resp.status >= 400:
            err = resp.error()
            assert set(err) == {"message", "type", "param", "code"}
        elif resp.headers.get(b"content-type") == b"text/event-stream":
            assert resp.body.endswith(b"\n\n"), resp.body[-300:]
            last = resp.body[:-2].rsplit(b"\n\n", 1)[-1].split(b"\n")[0]
            assert last in _STREAM_ENDS.get(path, (b"data: [DONE]",)), resp.body[-300:]
        assert served.run(call(served.app, "GET", "/health")).status == 200
        # Every request ended everywhere (a background response ends by itself, soon).
        deadline = time.monotonic() + 10
        rt = served.app.runtime
        while (len(rt.shard) or len(rt.pooling)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(rt.shard) == 0 and len(rt.pooling) == 0

    check()
