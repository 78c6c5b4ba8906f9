"""Error kinds and FinishReason wire shapes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire import FinishReason
from tokenwire.messages.errors import (
    ClientDisconnected,
    CodecError,
    DecodeError,
    InternalError,
    OverloadedError,
    QueueFullError,
    TokenizeError,
    TokenwireError,
    ValidationError,
)

from conftest import examples


@pytest.mark.parametrize(
    ("cls", "status", "prefix"),
    [
        (ValidationError, 400, "validation failed"),
        (TokenizeError, 500, "tokenize failed"),
        (DecodeError, 500, "detokenize failed"),
        (CodecError, 500, "codec error"),
        (InternalError, 500, "internal error"),
        (QueueFullError, 503, "service unavailable"),
        (OverloadedError, 429, "overloaded"),
        (ClientDisconnected, 499, "client disconnected"),
    ],
)
def test_error_kinds(cls, status, prefix):
    err = cls("x")
    assert isinstance(err, TokenwireError)
    assert err.status == status
    assert str(err) == f"{prefix}: x"
    assert err.detail == "x"


def test_error_strings_from_the_issue():
    assert str(ValidationError("x")) == "validation failed: x"
    assert str(DecodeError("bad id 7")) == "detokenize failed: bad id 7"
    assert str(InternalError("boom")) == "internal error: boom"
    assert ValidationError("x", param="top_p").param == "top_p"


WIRE_SHAPES = [
    {"type": "stop", "matched": 9},
    {"type": "stop", "matched": "</s>"},
    {"type": "stop", "matched": [9, 10]},
    {"type": "stop", "matched": None},
    {"type": "length", "length": 8},
    {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None},
    {"type": "abort", "message": "too long", "status_code": 400, "err_type": "BadRequest"},
    {"type": "future_kind", "whatever": [1, {"a": None}]},
    {"type": "stop", "matched": 1.5},  # known type, unknown field shape: verbatim
    {"type": 7},
    {"no_type": True},
]


@pytest.mark.parametrize("shape", WIRE_SHAPES)
def test_finish_reason_round_trips_key_for_key(shape):
    fr = FinishReason.from_json(shape)
    assert fr.to_json() == shape
    assert FinishReason.from_json(fr.to_json()) == fr


def test_finish_reason_accessors():
    assert FinishReason.from_json({"type": "stop", "matched": 9}).matched() == 9
    assert FinishReason.from_json({"type": "stop", "matched": "</s>"}).matched() == "</s>"
    assert FinishReason.from_json({"type": "length", "length": 8}).matched() is None
    assert FinishReason.length(8).length_value == 8
    assert FinishReason.abort().abort_status() is None
    assert FinishReason.abort("nope", status_code=400).abort_status() == (400, "nope")
    assert FinishReason.abort(None, status_code=503).abort_status() == (503, "request aborted")
    assert FinishReason.stop(3).abort_status() is None
    unknown = FinishReason.from_json({"type": "new", "x": 1})
    assert unknown.kind == "unknown" and unknown.matched() is None and unknown.type == "new"
    assert unknown.openai_finish_reason == "new"


def test_finish_reason_openai_view():
    eos = [2]
    assert FinishReason.stop(2).openai_finish_reason == "stop"
    assert FinishReason.stop(2).stop_reason(eos) is None  # EOS
    assert FinishReason.stop(7).stop_reason(eos) == 7  # a stop_token_ids entry
    assert FinishReason.stop("###").stop_reason(eos) == "###"
    assert FinishReason.length(5).openai_finish_reason == "length"
    assert FinishReason.length(5).stop_reason(eos) is None
    assert FinishReason.abort().openai_finish_reason == "abort"
    assert FinishReason.abort().to_json() == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
finish_dicts = st.one_of(
    st.builds(
        lambda m: {"type": "stop", "matched": m},
        st.none() | st.integers() | st.text() | st.lists(st.integers(), max_size=4),
    ),
    st.builds(lambda n: {"type": "length", "length": n}, st.none() | st.integers(0, 10**9)),
    st.builds(
        lambda m, c, e: {"type": "abort", "message": m, "status_code": c, "err_type": e},
        st.none() | st.text(),
        st.none() | st.integers(100, 599),
        st.none() | st.text(),
    ),
    st.dictionaries(st.text(max_size=6), json_values, max_size=4),
)


@settings(max_examples=examples(300))
@given(finish_dicts)
def test_finish_reason_round_trip_property(shape):
    fr = FinishReason.from_json(shape)
    assert fr.to_json() == shape
    assert FinishReason.from_json(fr.to_json()) == fr
