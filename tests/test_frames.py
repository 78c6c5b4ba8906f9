"""Batch frame codec: SGLang's cases, every extras family, malformed frames, fuzzing."""

from __future__ import annotations

import struct
from array import array

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenwire import FinishReason
from tokenwire.messages.errors import CodecError
from tokenwire.messages.frames import (
    EGRESS_TAG_BATCH,
    EGRESS_TAG_ERROR,
    EGRESS_TAG_RESULT,
    FAMILIES,
    LAYOUT_SEED,
    LAYOUT_SGLANG_0_5_23,
    decode_batch_frame,
    decode_error_frame,
    decode_result_frame,
    encode_batch_frame,
    encode_error_frame,
    encode_result_frame,
)

from conftest import examples


def test_tags():
    assert (EGRESS_TAG_RESULT, EGRESS_TAG_BATCH, EGRESS_TAG_ERROR) == (1, 2, 3)


def test_columns_are_written_back_to_back():
    split = encode_batch_frame([1, 2, 3], [[10, 11], [12, 13, 14]])
    whole = encode_batch_frame([1, 2, 3], [[10, 11, 12, 13, 14]])
    assert split == whole
    header = msgspec.msgpack.encode([1, 2, 3])
    assert whole[0] == 2
    assert struct.unpack_from("<I", whole, 1)[0] == len(header)
    assert whole[5 : 5 + len(header)] == header
    assert whole[5 + len(header) :] == struct.pack("<5i", 10, 11, 12, 13, 14)


def test_sglang_decode_case():
    frame = encode_batch_frame(
        [["1", "2", "3"], [None, {"type": "stop", "matched": 5}, None], [4, 5, 6], [2, 0, 1]],
        [[10, 11, 12]],
    )
    d = decode_batch_frame(frame)
    assert d.ok and d.rids == ["1", "2", "3"]
    ev = d.events
    assert [e.rid for e in ev] == ["1", "2", "3"]
    assert [e.token_ids.tolist() for e in ev] == [[10, 11], [], [12]]
    assert [e.prompt_tokens for e in ev] == [4, 5, 6]
    assert ev[0].finish_reason is None and ev[2].finish_reason is None
    assert ev[1].finish_reason == FinishReason.stop(5)
    assert all(e.extras is None for e in ev)
    # zero-copy: the token ids are a view into the frame
    assert d.token_ids.base is not None


@pytest.mark.parametrize(("tok_lens", "data"), [([10], [1]), ([1], [1, 2])])
def test_data_length_must_match_exactly(tok_lens, data):
    frame = encode_batch_frame([["1"], [None], [3], tok_lens], [data])
    d = decode_batch_frame(frame)
    assert not d.ok and d.rids == ["1"] and d.events == []


@pytest.mark.parametrize("k", [0, 3, 15, 16])
def test_bad_header_arity_is_rejected_and_reports_rids(k):
    frame = encode_batch_frame([["a", "b"], *(["junk"] * k)], [])
    d = decode_batch_frame(frame)
    assert not d.ok and d.rids == ["a", "b"]


@pytest.mark.parametrize(
    "header",
    [
        [["a"], [None], [1], [True]],  # bool is not a count
        [["a"], [None], [1], [-1]],
        [["a"], [None], [1.5], [0]],
        [["a"], [None, None], [1], [0]],  # column length differs from n
        [["a"], [7], [1], [0]],  # finish reason neither nil nor a map
        [["a", 3], [None, None], [1, 1], [0, 0]],  # rid not a string
        [["a"], [None], [1], [0], [1, 1]],  # optional column of the wrong length
        [["a"], [None], [1], [0], [], [], [2], [1]],  # sum(reqlens) != len(poslens)
    ],
)
def test_malformed_headers(header):
    d = decode_batch_frame(encode_batch_frame(header, []))
    assert not d.ok
    assert d.rids == (header[0] if all(isinstance(r, str) for r in header[0]) else [])


def test_garbage_is_rejected_without_rids():
    for frame in [b"", b"\x02", b"\x01abc", b"\x02\xff\xff\xff\xff", b"\x02\x01\x00\x00\x00\xc1"]:
        d = decode_batch_frame(frame)
        assert not d.ok and d.rids == []


def _family_frame():
    """Two requests; every family carries distinct values so a mix-up would show."""
    n = 2
    header = [["r0", "r1"], [None, None], [7, 8], [1, 2]]
    data = [[100, 101, 102]]
    # out_lp / in_lp: per request a number of (value, id) pairs
    header += [[1, 2], [2, 0]]
    data += [[1.0, 1.1, 1.2], [11, 12, 13]]  # out_lp values, ids
    data += [[2.0, 2.1], [21, 22]]  # in_lp values, ids
    # four (reqlens, poslens) families with values and ids, then hidden (values only)
    fam_vals = {}
    for f, base in zip(("out_topk", "in_topk", "out_tokid", "in_tokid"), (3, 4, 5, 6)):
        reqlens, poslens = [1, 1], [2, 1]  # r0: one position of 2, r1: one position of 1
        header += [reqlens, poslens]
        vals = [base + 0.1, base + 0.2, base + 0.3]
        ids = [base * 10 + 1, base * 10 + 2, base * 10 + 3]
        data += [vals, ids]
        fam_vals[f] = (vals, ids)
    header += [[0, 2], [3, 1]]  # hidden: r1 has two positions of 3 and 1 values
    data += [[9.0, 9.1, 9.2, 9.3]]
    assert len(header) == 16 and len(data) == 14
    return n, encode_batch_frame(header, data), fam_vals


def test_every_extras_family_decodes_to_its_own_values():
    _, frame, fam = _family_frame()
    d = decode_batch_frame(frame)
    assert d.ok
    r0, r1 = d.events
    assert r0.token_ids.tolist() == [100] and r1.token_ids.tolist() == [101, 102]
    f32 = lambda xs: np.asarray(xs, dtype=np.float32).tolist()  # noqa: E731
    assert r0.extras["out_lp"]["values"].tolist() == f32([1.0])
    assert r0.extras["out_lp"]["ids"].tolist() == [11]
    assert r1.extras["out_lp"]["values"].tolist() == f32([1.1, 1.2])
    assert r1.extras["out_lp"]["ids"].tolist() == [12, 13]
    assert r0.extras["in_lp"]["values"].tolist() == f32([2.0, 2.1])
    assert "in_lp" not in r1.extras
    for name, (vals, ids) in fam.items():
        assert r0.extras[name]["values"].tolist() == f32(vals[:2]), name
        assert r0.extras[name]["ids"].tolist() == ids[:2], name
        assert r0.extras[name]["poslens"].tolist() == [2]
        assert r1.extras[name]["values"].tolist() == f32(vals[2:]), name
        assert r1.extras[name]["ids"].tolist() == ids[2:], name
    assert "hidden" not in r0.extras
    assert r1.extras["hidden"]["values"].tolist() == f32([9.0, 9.1, 9.2, 9.3])
    assert r1.extras["hidden"]["poslens"].tolist() == [3, 1]
    assert set(FAMILIES) == {"out_lp", "in_lp", *fam, "hidden"}


def test_empty_and_all_zero_optional_columns_decode_alike():
    base = [["a", "b"], [None, None], [1, 1], [1, 1]]
    empty = decode_batch_frame(encode_batch_frame(base + [[]] * 12, [[5, 6]]))
    zeros = decode_batch_frame(
        encode_batch_frame(base + [[0, 0], [0, 0]] + [[0, 0], []] * 5, [[5, 6]])
    )
    assert empty.ok and zeros.ok
    for a, b in zip(empty.events, zeros.events):
        assert a.token_ids.tolist() == b.token_ids.tolist() and a.extras is None is b.extras


def test_result_and_error_frames():
    assert decode_result_frame(encode_result_frame("r", b"\x00\x01")) == ("r", b"\x00\x01")
    assert decode_error_frame(encode_error_frame("r", "boom")) == ("r", "boom")
    with pytest.raises(CodecError):
        decode_error_frame(encode_result_frame("r", b"x"))
    with pytest.raises(CodecError):
        decode_result_frame(b"\x01\xc1")
    with pytest.raises(CodecError):
        decode_error_frame(b"\x03" + msgspec.msgpack.encode(["r", 5]))


@settings(max_examples=examples(400), suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(blob):
    for frame in (blob, b"\x02" + blob):
        d = decode_batch_frame(frame)
        assert isinstance(d.ok, bool)
        if d.ok:
            assert len(d.events) == len(d.rids)


@settings(max_examples=examples(400), suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_mutated_frames(data):
    _, frame, _ = _family_frame()
    raw = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "extend", "insert"]))
        if op == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
        elif op == "cut" and raw:
            del raw[data.draw(st.integers(0, len(raw) - 1)) :]
        elif op == "extend":
            raw += data.draw(st.binary(min_size=1, max_size=8))
        else:
            i = data.draw(st.integers(0, len(raw)))
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=4))
    d = decode_batch_frame(bytes(raw))
    if d.ok:
        for e in d.events:  # every view stays inside the frame
            assert isinstance(e.token_ids.tolist(), list)
            if e.extras:
                for fam in e.extras.values():
                    fam["values"].tolist()


@settings(max_examples=examples(200), suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(
            st.text(max_size=4),
            st.lists(st.integers(0, 2**31 - 1), max_size=4),
            st.integers(0, 10**6),
            st.none() | st.sampled_from([{"type": "length", "length": 3}]),
        ),
        max_size=6,
    )
)
def test_round_trip_property(reqs):
    header = [
        [r[0] for r in reqs],
        [r[3] for r in reqs],
        [r[2] for r in reqs],
        [len(r[1]) for r in reqs],
    ]
    d = decode_batch_frame(encode_batch_frame(header, [[t for r in reqs for t in r[1]]]))
    assert d.ok
    assert [(e.rid, e.token_ids.tolist(), e.prompt_tokens) for e in d.events] == [
        (r[0], r[1], r[2]) for r in reqs
    ]


# ---- raw columns (item: SGLang hands over bytes(array("i", ...))) --------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        lambda v: bytes(array("i", v)),
        lambda v: bytearray(array("i", v)),
        lambda v: memoryview(array("i", v)),
        lambda v: memoryview(bytes(array("i", v))),
    ],
    ids=["bytes", "bytearray", "memoryview-i", "memoryview-B"],
)
def test_raw_columns_go_in_as_they_are(raw):
    header = [["a", "b"], [None, None], [3, 4], [2, 1]]
    frame = encode_batch_frame(header, [raw([70000, -1, 5])])
    assert frame == encode_batch_frame(header, [[70000, -1, 5]])
    d = decode_batch_frame(frame)
    assert d.ok and [e.token_ids.tolist() for e in d.events] == [[70000, -1], [5]]


def test_raw_float_columns_go_in_as_they_are():
    _, frame, _ = _family_frame()
    d = decode_batch_frame(frame)
    header = msgspec.msgpack.decode(frame[5 : 5 + struct.unpack_from("<I", frame, 1)[0]])
    data = [[100, 101, 102], bytes(array("f", [1.0, 1.1, 1.2]))]
    data += [d.events[0].extras["out_lp"]["ids"].tolist() + [12, 13]]
    rest = frame[5 + len(msgspec.msgpack.encode(header)) + 4 * 9 :]
    again = encode_batch_frame(header, [*data, rest])
    assert again == frame


# ---- SGLang 0.5.23's layout: i64 token ids, cached_tokens and reasoning_tokens ------------------


def _header_0_5_23(rids, finishes, prompt, tok_lens, cached, reasoning, extras=None, abort=False):
    n = len(rids)
    cols = [rids, finishes, prompt, tok_lens, cached, reasoning]
    cols += extras if extras is not None else [[]] * 12
    cols += [["v1"] * n, [0] * n, [0] * n, [0] * n, [0.01] * n]  # weight versions ... latencies
    if abort:
        cols.append([True] * n)
    return cols


@pytest.mark.parametrize("abort", [False, True])
def test_sglang_0_5_23_layout_decodes(abort):
    header = _header_0_5_23(
        ["1", "2"],
        [None, {"type": "length", "length": 3}],
        [4, 5],
        [2, 1],
        [0, 3],
        [2, 0],
        abort=abort,
    )
    big = 2**40 + 7  # only an i64 column holds it
    frame = encode_batch_frame(header, [bytes(array("q", [10, big, 12]))])
    assert frame == encode_batch_frame(header, [[10, big, 12]], layout=LAYOUT_SGLANG_0_5_23)
    d = decode_batch_frame(frame)
    assert d.ok and d.layout == LAYOUT_SGLANG_0_5_23
    assert d.token_ids.dtype == np.int64
    ev = d.events
    assert [e.token_ids.tolist() for e in ev] == [[10, big], [12]]
    assert [e.prompt_tokens for e in ev] == [4, 5]
    assert [(e.cached_tokens, e.reasoning_tokens) for e in ev] == [(0, 2), (3, 0)]
    assert ev[1].finish_reason == FinishReason.length(3)


def test_seed_layout_reads_as_zero_cached_and_reasoning_tokens():
    d = decode_batch_frame(encode_batch_frame([["1"], [None], [4], [1]], [[10]]))
    assert d.ok and d.layout == LAYOUT_SEED
    assert (d.events[0].cached_tokens, d.events[0].reasoning_tokens) == (0, 0)


def test_sglang_0_5_23_layout_with_every_extras_family():
    _, seed_frame, _ = _family_frame()
    seed = decode_batch_frame(seed_frame)
    hlen = struct.unpack_from("<I", seed_frame, 1)[0]
    header = msgspec.msgpack.decode(seed_frame[5 : 5 + hlen])
    data = seed_frame[5 + hlen :]
    ids, rest = data[:12], data[12:]  # three i32 token ids, then the other columns
    new_header = _header_0_5_23(*header[:4], [1, 2], [0, 0], extras=header[4:])
    new_ids = bytes(array("q", array("i", ids)))
    d = decode_batch_frame(encode_batch_frame(new_header, [new_ids, rest]))
    assert d.ok
    for a, b in zip(seed.events, d.events):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert set(a.extras) == set(b.extras)
        for name in a.extras:
            for key in a.extras[name]:
                assert a.extras[name][key].tolist() == b.extras[name][key].tolist(), name
    assert [e.cached_tokens for e in d.events] == [1, 2]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda h: h[:17],  # between the layouts
        lambda h: [*h[:4], [1, 2, 3], *h[5:]],  # cached_tokens of the wrong length
        lambda h: [*h[:5], ["x", "y"], *h[6:]],  # reasoning_tokens not counts
        lambda h: [*h[:6], [1, 1], *h[7:]],  # out_lp lens sum, but no data for them
    ],
)
def test_malformed_sglang_0_5_23_headers(mutate):
    header = _header_0_5_23(["1", "2"], [None, None], [4, 5], [1, 1], [0, 0], [0, 0])
    d = decode_batch_frame(encode_batch_frame(mutate(header), [bytes(array("q", [1, 2]))]))
    assert not d.ok and d.rids == ["1", "2"]


def test_i32_token_ids_in_a_sglang_0_5_23_frame_are_rejected():
    header = _header_0_5_23(["1", "2"], [None, None], [4, 5], [1, 1], [0, 0], [0, 0])
    d = decode_batch_frame(encode_batch_frame(header, [bytes(array("i", [1, 2]))]))
    assert not d.ok and d.rids == ["1", "2"]


def test_encode_checks_the_layout():
    with pytest.raises(ValueError, match="layout"):
        encode_batch_frame([["1"], [None], [1], [0]], [], layout="nope")
    with pytest.raises(ValueError, match="at least 18"):
        encode_batch_frame([["1"], [None], [1], [0]], [], layout=LAYOUT_SGLANG_0_5_23)


@settings(max_examples=examples(200), suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(
            st.text(max_size=4),
            st.lists(st.integers(0, 2**63 - 1), max_size=4),
            st.integers(0, 10**6),
            st.integers(0, 10**6),
            st.integers(0, 10**6),
        ),
        max_size=6,
    )
)
def test_sglang_0_5_23_round_trip_property(reqs):
    header = _header_0_5_23(
        [r[0] for r in reqs],
        [None] * len(reqs),
        [r[2] for r in reqs],
        [len(r[1]) for r in reqs],
        [r[3] for r in reqs],
        [r[4] for r in reqs],
    )
    ids = [t for r in reqs for t in r[1]]
    d = decode_batch_frame(encode_batch_frame(header, [ids], layout=LAYOUT_SGLANG_0_5_23))
    assert d.ok
    assert [
        (e.rid, e.token_ids.tolist(), e.prompt_tokens, e.cached_tokens, e.reasoning_tokens)
        for e in d.events
    ] == [(r[0], r[1], r[2], r[3], r[4]) for r in reqs]
