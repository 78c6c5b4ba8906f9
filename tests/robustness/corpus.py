"""Hostile request bodies: each with the status it must get and the field its error must name."""

from __future__ import annotations

import json

C, CH, G = "/v1/completions", "/v1/chat/completions", "/generate"
R, M, CT = "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"
MSGS = [{"role": "user", "content": "hi"}]
DEEP = "[" * 5000 + "]" * 5000


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


#: (name, path, body, status, param): ``param`` is the field the error names (None: the body;
#: on Anthropic's routes, whose errors have no ``param``, their message names it).
CORPUS: list[tuple[str, str, bytes, int, str | None]] = [
    ("deep-json", C, b"[" * 100_000 + b"]" * 100_000, 400, None),
    ("deep-object", CH, b'{"messages":' + b'{"a":' * 50_000 + b"1" + b"}" * 50_001, 400, None),
    ("not-json", C, b"prompt=hi", 400, None),
    ("bad-utf8", C, b"\xff\xfe{}", 400, None),
    ("empty-body", C, b"", 400, None),
    ("json-array", C, b"[1, 2]", 400, None),
    ("json-null", G, b"null", 400, None),
    (
        "401-digit-temperature",
        C,
        b'{"prompt":"x","temperature":' + b"1" * 401 + b"}",
        400,
        "temperature",
    ),
    ("huge-exponent", C, b'{"prompt":"x","temperature":1e999}', 400, None),
    (
        "huge-logit-bias-value",
        C,
        _j({"prompt": "x", "logit_bias": {"1": 1e308}}),
        400,
        "logit_bias",
    ),
    (
        "huge-logit-bias-int",
        C,
        b'{"prompt":"x","logit_bias":{"1":' + b"9" * 300 + b"}}",
        400,
        "logit_bias",
    ),
    (
        "huge-logit-bias-key",
        C,
        _j({"prompt": "x", "logit_bias": {"9" * 5000: 1}}),
        400,
        "logit_bias",
    ),
    ("logit-bias-key-text", C, _j({"prompt": "x", "logit_bias": {"abc": 1}}), 400, "logit_bias"),
    ("logit-bias-list", C, _j({"prompt": "x", "logit_bias": [1, 2]}), 400, "logit_bias"),
    (
        "tool-calls-string",
        CH,
        _j({"messages": [{"role": "assistant", "tool_calls": "abc"}]}),
        400,
        "messages",
    ),
    (
        "tool-calls-int",
        CH,
        _j({"messages": [{"role": "assistant", "tool_calls": [1]}]}),
        400,
        "messages",
    ),
    (
        "tool-calls-empty-object",
        CH,
        _j({"messages": [{"role": "assistant", "tool_calls": [{}]}]}),
        400,
        "messages",
    ),
    (
        "tool-calls-bad-arguments",
        CH,
        _j(
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"type": "function", "function": {"name": "f", "arguments": 5}}
                        ],
                    }
                ]
            }
        ),
        400,
        "messages",
    ),
    (
        "kwargs-namespace",
        CH,
        _j({"messages": MSGS, "chat_template_kwargs": {"namespace": 1}}),
        400,
        "chat_template_kwargs",
    ),
    (
        "kwargs-strftime-now",
        CH,
        _j({"messages": MSGS, "chat_template_kwargs": {"strftime_now": "x"}}),
        400,
        "chat_template_kwargs",
    ),
    (
        "kwargs-raise-exception",
        CH,
        _j({"messages": MSGS, "chat_template_kwargs": {"raise_exception": None}}),
        400,
        "chat_template_kwargs",
    ),
    (
        "kwargs-range",
        CH,
        _j({"messages": MSGS, "chat_template_kwargs": {"range": 3}}),
        400,
        "chat_template_kwargs",
    ),
    (
        "kwargs-list",
        CH,
        _j({"messages": MSGS, "chat_template_kwargs": [1]}),
        400,
        "chat_template_kwargs",
    ),
    ("tools-not-objects", CH, _j({"messages": MSGS, "tools": [1, "x"]}), 400, "tools"),
    (
        "tools-no-function",
        CH,
        _j({"messages": MSGS, "tools": [{"type": "function"}]}),
        400,
        "tools",
    ),
    (
        "message-name-object",
        CH,
        _j({"messages": [{"role": "user", "content": "x", "name": {"a": 1}}]}),
        400,
        "messages",
    ),
    ("message-role-missing", CH, _j({"messages": [{"content": "x"}]}), 400, "messages"),
    (
        "message-content-number",
        CH,
        _j({"messages": [{"role": "user", "content": 5}]}),
        400,
        "messages",
    ),
    ("messages-empty", CH, _j({"messages": []}), 400, "messages"),
    (
        "image-part",
        CH,
        _j(
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            }
        ),
        400,
        "messages",
    ),
    ("input-ids-string", G, _j({"input_ids": "abc"}), 400, "input_ids"),
    ("input-ids-mixed-batch", G, _j({"input_ids": [[1], "x"]}), 400, "input_ids"),
    ("input-ids-negative", G, _j({"input_ids": [1, -5]}), 400, "input_ids"),
    ("input-ids-out-of-vocab", G, _j({"input_ids": [10**12]}), 400, "input_ids"),
    ("input-ids-float", G, _j({"input_ids": [1.5]}), 400, "input_ids"),
    ("text-number", G, _j({"text": 5}), 400, "text"),
    ("text-and-ids", G, _j({"text": "x", "input_ids": [1]}), 400, "text"),
    (
        "logprob-start-len-text",
        G,
        _j({"text": "x", "logprob_start_len": "x"}),
        400,
        "logprob_start_len",
    ),
    (
        "top-logprobs-num-huge",
        G,
        _j({"text": "x", "top_logprobs_num": 1e9}),
        400,
        "top_logprobs_num",
    ),
    (
        "top-logprobs-num-int",
        G,
        _j({"text": "x", "top_logprobs_num": 10**9}),
        400,
        "top_logprobs_num",
    ),
    (
        "sampling-params-string",
        G,
        _j({"text": "x", "sampling_params": "abc"}),
        400,
        "sampling_params",
    ),
    (
        "sampling-params-unknown",
        G,
        _j({"text": "x", "sampling_params": {"bogus": 1}}),
        400,
        "bogus",
    ),
    (
        "max-new-tokens-negative",
        G,
        _j({"text": "x", "sampling_params": {"max_new_tokens": -1}}),
        400,
        "max_new_tokens",
    ),
    (
        "max-new-tokens-over-context",
        G,
        _j({"text": "x", "sampling_params": {"max_new_tokens": 10**15}}),
        400,
        "max_new_tokens",
    ),
    ("rid-number", G, _j({"text": "x", "rid": 5}), 400, "rid"),
    ("stream-string", C, _j({"prompt": "x", "stream": "yes"}), 400, "stream"),
    ("n-huge", C, _j({"prompt": "x", "n": 10**18}), 400, "n"),
    ("n-zero", C, _j({"prompt": "x", "n": 0}), 400, "n"),
    ("max-tokens-huge", C, _j({"prompt": "x", "max_tokens": 10**18}), 400, "max_tokens"),
    ("max-tokens-string", C, _j({"prompt": "x", "max_tokens": "9"}), 400, "max_tokens"),
    (
        "both-max-tokens",
        C,
        _j({"prompt": "x", "max_tokens": 1, "max_completion_tokens": 1}),
        400,
        "max_completion_tokens",
    ),
    ("seed-huge", C, _j({"prompt": "x", "seed": 10**30}), 400, "seed"),
    ("top-k-huge", C, _j({"prompt": "x", "top_k": 10**20}), 400, "top_k"),
    ("temperature-negative", C, _j({"prompt": "x", "temperature": -1}), 400, "temperature"),
    ("temperature-nan-text", C, b'{"prompt":"x","temperature":NaN}', 400, None),
    ("top-p-over-one", C, _j({"prompt": "x", "top_p": 2}), 400, "top_p"),
    ("stop-ints", C, _j({"prompt": "x", "stop": [1]}), 400, "stop"),
    ("stop-object", C, _j({"prompt": "x", "stop": {"a": 1}}), 400, "stop"),
    (
        "stop-token-ids-negative",
        C,
        _j({"prompt": "x", "stop_token_ids": [-1]}),
        400,
        "stop_token_ids",
    ),
    ("prompt-missing", C, _j({"max_tokens": 1}), 400, "prompt"),
    ("prompt-empty-list", C, _j({"prompt": []}), 400, "prompt"),
    ("prompt-empty-string", C, _j({"prompt": ""}), 400, "prompt"),
    ("prompt-nested-3", C, _j({"prompt": [[[1]]]}), 400, "prompt"),
    ("prompt-ids-negative", C, _j({"prompt": [1, -1]}), 400, "prompt"),
    ("prompt-huge-id", C, b'{"prompt":[' + b"9" * 30 + b"]}", 400, "prompt"),
    ("logprobs-too-many", C, _j({"prompt": "x", "logprobs": 10**9}), 400, "logprobs"),
    ("logprobs-negative", C, _j({"prompt": "x", "logprobs": -1}), 400, "logprobs"),
    ("echo-not-bool", C, _j({"prompt": "x", "echo": [True]}), 400, "echo"),
    (
        "stream-options-no-stream",
        C,
        _j({"prompt": "x", "stream_options": {"include_usage": True}}),
        400,
        "stream_options",
    ),
    (
        "stream-options-string",
        C,
        _j({"prompt": "x", "stream": True, "stream_options": "x"}),
        400,
        "stream_options",
    ),
    (
        "response-format-unresolvable-ref",
        CH,
        _j(
            {
                "messages": MSGS,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nope"}},
                },
            }
        ),
        400,
        "response_format",
    ),
    (
        "add-generation-prompt-string",
        CH,
        _j({"messages": MSGS, "add_generation_prompt": "y"}),
        400,
        "add_generation_prompt",
    ),
    (
        "regex-bomb-stop",
        G,
        _j({"text": "x", "sampling_params": {"stop_regex": "(a*)*" * 200}}),
        400,
        "stop_regex",
    ),
    # the Responses API
    ("responses-input-number", R, _j({"input": 5}), 400, "input"),
    ("responses-item-type-huge", R, _j({"input": [{"type": "x" * 5000}]}), 400, "input"),
    (
        "responses-call-arguments-deep",
        R,
        _j({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": DEEP}]}),
        400,
        "input",
    ),
    (
        "responses-previous-unknown",
        R,
        _j({"input": "x", "previous_response_id": "resp_" + "x" * 5000}),
        404,
        "previous_response_id",
    ),
    (
        "responses-max-output-string",
        R,
        _j({"input": "x", "max_output_tokens": "5"}),
        400,
        "max_output_tokens",
    ),
    (
        "responses-json-schema",
        R,
        _j(
            {
                "input": "x",
                "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "x"}}},
            }
        ),
        400,
        "text.format",
    ),
    (
        "responses-temperature-huge",
        R,
        b'{"input":"x","temperature":' + b"1" * 401 + b"}",
        400,
        "temperature",
    ),
    # Anthropic's Messages API
    ("messages-no-max-tokens", M, _j({"messages": MSGS}), 400, "max_tokens"),
    (
        "messages-block-type-huge",
        M,
        _j({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "x" * 5000}]}]}),
        400,
        "messages",
    ),
    (
        "messages-tool-use-input-deep",
        M,
        b'{"max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use",'
        b'"id":"t","name":"f","input":' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}]}]}",
        400,
        None,
    ),
    (
        "messages-stop-empty",
        M,
        _j({"max_tokens": 5, "messages": MSGS, "stop_sequences": [""]}),
        400,
        "stop_sequences",
    ),
    ("messages-json-array", M, b"[]", 400, None),
    ("count-tokens-no-messages", CT, _j({"model": None}), 400, "messages"),
]
