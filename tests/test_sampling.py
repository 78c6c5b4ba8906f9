"""SamplingParams: from_dict typing, normalize, verify (order and boundaries), wire round-trip."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire import SamplingParams, Tokenizer, ValidationError
from tokenwire.messages.errors import CodecError
from tokenwire.messages.sampling import MAX_STOP_COUNT, MAX_STOP_REGEX_COUNT, TOP_K_ALL

from conftest import examples

VOCAB = 1000


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.default()


def test_defaults_are_sglangs():
    p = SamplingParams()
    assert p.max_new_tokens == 128
    assert p.stop is None and p.stop_token_ids is None and p.stop_regex is None
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (1.0, 1.0, TOP_K_ALL, 0.0)
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.min_new_tokens, p.n, p.beam_width) == (0, 1, None)
    assert (p.ignore_eos, p.skip_special_tokens, p.spaces_between_special_tokens) == (
        False,
        True,
        True,
    )
    assert p.no_stop_trim is False and p.logit_bias is None and p.sampling_seed is None
    assert SamplingParams(top_k=-1).top_k == TOP_K_ALL
    assert SamplingParams.from_dict({}) == p
    assert SamplingParams.from_dict(None) == p


def test_explicit_null_means_default_except_max_new_tokens():
    p = SamplingParams.from_dict(
        {"temperature": None, "top_k": None, "stop": None, "ignore_eos": None}
    )
    assert p == SamplingParams()
    assert SamplingParams.from_dict({"max_new_tokens": None}).max_new_tokens is None
    assert SamplingParams.from_dict({}).max_new_tokens == 128


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"stop": 3}, "stop"),
        ({"stop": ["a", 3]}, "stop"),
        ({"stop_token_ids": [1, None]}, "stop_token_ids"),
        ({"stop_token_ids": [1, -2]}, "stop_token_ids"),
        ({"stop_token_ids": 5}, "stop_token_ids"),
        ({"max_new_tokens": 5.5}, "max_new_tokens"),
        ({"max_new_tokens": "5"}, "max_new_tokens"),
        ({"top_k": True}, "top_k"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"logit_bias": {"5": "x"}}, "logit_bias"),
        ({"logit_bias": {"5": math.inf}}, "logit_bias"),
        ({"regex": 5}, "regex"),
        ({"custom_params": "x"}, "custom_params"),
        ({"sampling_seed": 1.0}, "sampling_seed"),
        ({"sampling_seed": 2**64}, "sampling_seed"),
        ({"max_new_tokens": 10**30}, "max_new_tokens"),
        ({"custom_params": {"big": 2**70}}, "custom_params"),
        ({"stop_regex": {"a": 1}}, "stop_regex"),
    ],
)
def test_wrong_types_are_errors_naming_the_field(data, field):
    with pytest.raises(ValidationError) as info:
        SamplingParams.from_dict(data)
    assert field in str(info.value)
    assert info.value.param == field


def test_unknown_key_is_named():
    with pytest.raises(ValidationError, match="'temprature'"):
        SamplingParams.from_dict({"temprature": 0.5})
    with pytest.raises(ValidationError, match="'stop_strs'"):
        SamplingParams.from_dict({"stop_strs": ["x"]})  # internal fields are not input
    with pytest.raises(ValidationError, match="sampling_params must be an object"):
        SamplingParams.from_dict([1, 2])  # type: ignore[arg-type]


def test_empty_grammar_strings_mean_unset():
    p = SamplingParams.from_dict({"json_schema": "", "regex": "", "ebnf": ""})
    assert p.json_schema is None and p.regex is None and p.ebnf is None
    p.verify(VOCAB)


def test_normalize(tok):
    p = SamplingParams.from_dict(
        {"stop": "世界", "stop_regex": [r"\d{3}", "ab|cde"], "temperature": 0.0, "top_k": -1}
    ).normalize(tok)
    assert p.stop_strs == ["世界"]
    assert p.stop_str_max_len == 6  # UTF-8 bytes
    assert p.stop_regex_strs == [r"\d{3}", "ab|cde"]
    assert p.stop_regex_max_len == 3
    assert (p.temperature, p.top_k) == (1.0, 1)  # greedy
    assert [r.pattern for r in p.stop_regexes] == [r"\d{3}", "ab|cde"]
    snapshot = SamplingParams.from_wire(p.to_wire())
    assert p.normalize(tok) == snapshot  # idempotent
    q = SamplingParams.from_dict({"temperature": 5e-7}).normalize(tok)
    assert (q.temperature, q.top_k) == (1.0, 1)
    r = SamplingParams.from_dict({"temperature": 1e-6}).normalize(tok)
    assert (r.temperature, r.top_k) == (1e-6, TOP_K_ALL)
    assert SamplingParams().normalize(None).stop_strs == []


def test_normalize_limits(tok):
    SamplingParams(stop=[f"s{i}" for i in range(MAX_STOP_COUNT)]).normalize(tok)
    with pytest.raises(ValidationError, match="33 strings"):
        SamplingParams(stop=[f"s{i}" for i in range(MAX_STOP_COUNT + 1)]).normalize(tok)
    SamplingParams(stop_regex=[f"r{i}" for i in range(MAX_STOP_REGEX_COUNT)]).normalize(tok)
    with pytest.raises(ValidationError, match="33 patterns"):
        SamplingParams(stop_regex=[f"r{i}" for i in range(MAX_STOP_REGEX_COUNT + 1)]).normalize(tok)
    with pytest.raises(ValidationError, match="backreference"):
        SamplingParams(stop_regex=r"(a)\1").normalize(tok)
    with pytest.raises(ValidationError, match="must not be empty"):
        SamplingParams(stop=["ok", ""]).normalize(tok)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"stop": "x"}, "stop"), ({"stop_regex": "x"}, "stop_regex"), ({"min_new_tokens": 1}, "min")],
)
def test_tokenizer_required(kwargs, field):
    with pytest.raises(ValidationError, match=f"{field}.*requires a tokenizer"):
        SamplingParams(**kwargs).normalize(None)


# (field, inclusive boundary accepted, just-past rejected)
BOUNDARIES = [
    ("temperature", 0.0, -1e-9),
    ("top_p", 1.0, 1.0 + 1e-9),
    ("top_p", 1e-9, 0.0),
    ("min_p", 0.0, -1e-9),
    ("min_p", 1.0, 1.0 + 1e-9),
    ("top_k", 1, 0),
    ("top_k", -1, -2),
    ("frequency_penalty", 2.0, 2.0 + 1e-9),
    ("frequency_penalty", -2.0, -2.0 - 1e-9),
    ("presence_penalty", 2.0, 2.0 + 1e-9),
    ("presence_penalty", -2.0, -2.0 - 1e-9),
    ("repetition_penalty", 2.0, 2.0 + 1e-9),
    ("repetition_penalty", 1e-9, 0.0),
    ("min_new_tokens", 0, -1),
    ("max_new_tokens", 0, -1),
    ("n", 1, 2),
    ("beam_width", 1, 2),
]


@pytest.mark.parametrize(("field", "ok", "bad"), BOUNDARIES)
def test_verify_boundaries(field, ok, bad):
    SamplingParams(**{field: ok}).verify(VOCAB)
    with pytest.raises(ValidationError) as info:
        SamplingParams(**{field: bad}).verify(VOCAB)
    assert field in str(info.value) and info.value.param == field


def test_verify_specific_messages():
    with pytest.raises(ValidationError, match=r"temperature must be a non-negative finite"):
        SamplingParams(temperature=math.nan).verify(VOCAB)
    with pytest.raises(ValidationError, match="temperature"):
        SamplingParams(temperature=math.inf).verify(VOCAB)
    with pytest.raises(ValidationError, match=r"min_new_tokens must be in \[0, max_new_tokens=3\]"):
        SamplingParams(min_new_tokens=4, max_new_tokens=3).verify(VOCAB)
    SamplingParams(min_new_tokens=400, max_new_tokens=None).verify(VOCAB)
    with pytest.raises(ValidationError, match="Only one of json_schema, regex, ebnf"):
        SamplingParams(regex="a", structural_tag="{}").verify(VOCAB)
    with pytest.raises(ValidationError, match="n must be 1"):
        SamplingParams(n=3).verify(VOCAB)
    with pytest.raises(ValidationError, match="beam_width must be 1"):
        SamplingParams(beam_width=4).verify(VOCAB)
    with pytest.raises(ValidationError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=[5, VOCAB]).verify(VOCAB)


@pytest.mark.parametrize("key", ["abc", "-1", "1.5", "", " 5", "1e3", "٣", str(VOCAB)])
def test_logit_bias_keys(key):
    SamplingParams(logit_bias={"0": 1.0, str(VOCAB - 1): -1.0}).verify(VOCAB)
    with pytest.raises(ValidationError, match="logit_bias"):
        SamplingParams(logit_bias={key: 1.0}).verify(VOCAB)


def test_verify_order_first_failure_wins():
    bad = SamplingParams(
        temperature=-1,
        top_p=0,
        min_p=2,
        top_k=0,
        frequency_penalty=9,
        presence_penalty=9,
        repetition_penalty=0,
        min_new_tokens=-1,
        max_new_tokens=-1,
        logit_bias={"x": 1},
        regex="a",
        ebnf="b",
        n=2,
        beam_width=2,
    )
    order = [
        "temperature",
        "top_p",
        "min_p",
        "top_k",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "max_new_tokens",
        "logit_bias",
        "regex",
        "n",
        "beam_width",
    ]
    fixes = {
        "temperature": 1.0,
        "top_p": 1.0,
        "min_p": 0.0,
        "top_k": 5,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repetition_penalty": 1.0,
        "min_new_tokens": 0,
        "max_new_tokens": 10,
        "logit_bias": None,
        "regex": None,
        "n": 1,
        "beam_width": None,
    }
    for field in order:
        with pytest.raises(ValidationError) as info:
            bad.verify(VOCAB)
        assert info.value.param == field, (field, str(info.value))
        setattr(bad, field, fixes[field])
    bad.verify(VOCAB)


def test_names_map_fields_to_the_clients_names():
    names = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
    with pytest.raises(ValidationError) as info:
        SamplingParams(max_new_tokens=-3).verify(VOCAB, names=names)
    assert str(info.value) == "validation failed: max_tokens must be at least 0, got -3"
    assert info.value.param == "max_tokens"
    with pytest.raises(ValidationError, match=r"min_tokens must be in \[0, max_tokens=1\]"):
        SamplingParams(min_new_tokens=2, max_new_tokens=1).verify(VOCAB, names=names)
    with pytest.raises(ValidationError, match=r"max_tokens must be a \(64-bit\) integer"):
        SamplingParams.from_dict({"max_new_tokens": "x"}, names=names)


def test_wire_round_trip_and_errors(tok):
    p = SamplingParams.from_dict(
        {
            "max_new_tokens": None,
            "stop": ["a", "b"],
            "stop_token_ids": [3, 4],
            "stop_regex": r"\d+",
            "temperature": 0.7,
            "logit_bias": {"5": -1.5},
            "custom_params": {"k": [1, "x", None]},
            "sampling_seed": 42,
            "json_schema": "{}",
        }
    ).normalize(tok)
    wire = p.to_wire()
    assert isinstance(wire, bytes)
    assert SamplingParams.from_wire(wire) == p
    with pytest.raises(CodecError):
        SamplingParams.from_wire(b"\x93\x01\x02\x03")
    with pytest.raises(CodecError):
        SamplingParams.from_wire(b"\xc1")


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
params = st.builds(
    SamplingParams,
    max_new_tokens=st.none() | st.integers(0, 10**6),
    stop=st.none() | st.text(min_size=1, max_size=5) | st.lists(st.text(min_size=1), max_size=3),
    stop_token_ids=st.none() | st.lists(st.integers(0, 10**6), max_size=4),
    temperature=finite,
    top_p=finite,
    top_k=st.integers(-1, 10**6),
    min_p=finite,
    repetition_penalty=finite,
    min_new_tokens=st.integers(0, 100),
    beam_width=st.none() | st.integers(1, 4),
    regex=st.none() | st.text(max_size=5),
    ignore_eos=st.booleans(),
    no_stop_trim=st.booleans(),
    logit_bias=st.none() | st.dictionaries(st.integers(0, 999).map(str), finite, max_size=3),
    custom_params=st.none()
    | st.dictionaries(st.text(max_size=4), st.integers(-(2**63), 2**63 - 1) | st.text()),
    stream_interval=st.none() | st.integers(1, 100),
    sampling_seed=st.none() | st.integers(-(2**63), 2**63 - 1),
)


@settings(max_examples=examples(300))
@given(params)
def test_wire_round_trip_property(p):
    assert SamplingParams.from_wire(p.to_wire()) == p


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
json_any = st.recursive(
    json_scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=6,
)
keys = st.sampled_from(
    [
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "beam_width",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "skip_special_tokens",
        "no_stop_trim",
        "logit_bias",
        "custom_params",
        "stream_interval",
        "sampling_seed",
        "bogus",
    ]
)


@settings(max_examples=examples(500))
@given(st.dictionaries(keys, json_any, max_size=6) | json_any, st.booleans())
def test_random_json_gives_params_or_validation_error(data, with_tokenizer):
    try:
        p = SamplingParams.from_dict(data)
    except ValidationError:
        return
    assert isinstance(p, SamplingParams)
    # The rest of the pipeline only ever raises ValidationError too.
    try:
        p.normalize(_default_tokenizer() if with_tokenizer else None)
        p.verify(VOCAB)
    except ValidationError:
        pass


_TOK: list[Tokenizer] = []


def _default_tokenizer() -> Tokenizer:
    if not _TOK:
        _TOK.append(Tokenizer.default())
    return _TOK[0]
