"""Engine output frames, byte-compatible with SGLang's scheduler output frames (two layouts).

Three tags:

- ``EGRESS_TAG_RESULT`` (1): ``[1][msgpack [rid: str, payload: bin]]`` — one control result.
- ``EGRESS_TAG_BATCH`` (2): ``[2][u32 LE header_len][header][data]`` — one decode step.
- ``EGRESS_TAG_ERROR`` (3): ``[3][msgpack [rid: str, message: str]]`` — one request failed.

A batch frame's header is a msgpack array of up to 16 columns, each with one entry per request
(optional ones may be empty, which reads as all zeros)::

     0 rids            1 finish_reasons (nil or a FinishReason dict)
     2 prompt_tokens   3 tok_lens
     4 out_lp_lens     5 in_lp_lens
     6 out_topk reqlens     7 out_topk poslens
     8 in_topk reqlens      9 in_topk poslens
    10 out_tokid reqlens   11 out_tokid poslens
    12 in_tokid reqlens    13 in_tokid poslens
    14 hidden reqlens      15 hidden poslens

For a (reqlens, poslens) family, request ``i`` has ``reqlens[i]`` positions, each position ``k``
``poslens[k]`` values, so ``sum(reqlens) == len(poslens)`` and the family's value columns hold
``sum(poslens)`` entries. The data is 14 back-to-back little-endian 4-byte columns, no padding:
token ids (i32); out/in logprob values (f32) and token ids (i32); out/in top-k values and ids;
out/in token-ids logprob values and ids; hidden states (f32) last. Their lengths follow from the
header and must add up to the data exactly.

SGLang 0.5.23's layout (``LAYOUT_SGLANG_0_5_23``) differs in two ways: token ids are 8-byte
little-endian (i64), and the header has two more columns after ``tok_lens``, ``cached_tokens``
(prompt tokens served from the prefix cache) and ``reasoning_tokens`` (output tokens so far that
are reasoning), then the same 12 optional columns, then trailing columns tokenwire does not use
(``weight_versions``, modality token counts, ``decode_latencies``, an abort flag): at least 18
columns in all, so a header of more than 16 reads as this layout. The seed's layout
(``LAYOUT_SEED``, above) reads as zero cached and reasoning tokens.

Encoding writes raw data columns (``bytes``, ``bytearray``, ``memoryview``: SGLang hands over
``bytes(array("i", ...))``) as they are; anything else is converted to 4-byte values, or 8-byte
token ids in SGLang 0.5.23's layout.

Decoding is zero-copy (numpy views into the frame) and all-or-nothing: a malformed frame delivers
nothing, only the rids its header names, so each of them can be told.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Annotated, Any, Union

import msgspec
import numpy as np

from tokenwire.messages.errors import CodecError
from tokenwire.messages.finish_reason import FinishReason

__all__ = [
    "EGRESS_TAG_BATCH",
    "EGRESS_TAG_ERROR",
    "EGRESS_TAG_RESULT",
    "FAMILIES",
    "FRAME_LAYOUTS",
    "LAYOUT_SEED",
    "LAYOUT_SGLANG_0_5_23",
    "MALFORMED_FRAME",
    "Decoded",
    "FrameEvent",
    "decode_batch_frame",
    "decode_error_frame",
    "decode_result_frame",
    "encode_batch_frame",
    "encode_error_frame",
    "encode_result_frame",
]

EGRESS_TAG_RESULT = 1
EGRESS_TAG_BATCH = 2
EGRESS_TAG_ERROR = 3

#: The seed's layout: i32 token ids, 4 to 16 header columns.
LAYOUT_SEED = "seed"
#: SGLang 0.5.23's layout: i64 token ids, ``cached_tokens`` and ``reasoning_tokens`` columns.
LAYOUT_SGLANG_0_5_23 = "sglang-0.5.23"
FRAME_LAYOUTS = (LAYOUT_SEED, LAYOUT_SGLANG_0_5_23)

#: What every rid of a rejected frame is told.
MALFORMED_FRAME = "malformed engine output frame"

#: Logprob / hidden-state families, in header and data order.
FAMILIES = ("out_lp", "in_lp", "out_topk", "in_topk", "out_tokid", "in_tokid", "hidden")
_SIMPLE_FAMILIES = 2  # out_lp, in_lp: one lens column each; the rest are (reqlens, poslens)
_MAX_COLUMNS = 16
#: SGLang 0.5.23: rids, finishes, prompt, tok_lens, cached, reasoning, 12 optional columns.
_MIN_COLUMNS_0_5_23 = 18
_N_DATA_COLUMNS = 14
_LEN = struct.Struct("<I")
_I32 = np.dtype("<i4")
_I64 = np.dtype("<i8")
_F32 = np.dtype("<f4")

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


# ---- encoding ------------------------------------------------------------------------------------


def _column_bytes(col: Any, ints: np.dtype) -> bytes:
    if isinstance(col, (bytes, bytearray, memoryview)):
        return col if isinstance(col, bytes) else bytes(col)  # raw: as it is
    if isinstance(col, np.ndarray):
        if col.dtype.kind == "f":
            return col.astype(_F32, copy=False).tobytes()
        return col.astype(ints, copy=False).tobytes()
    values = list(col)
    if any(isinstance(v, float) for v in values):
        return np.asarray(values, dtype=_F32).tobytes()
    return np.asarray(values, dtype=ints).tobytes()


def encode_batch_frame(
    header_cols: Sequence[Any], data_cols: Sequence[Any], *, layout: str = LAYOUT_SEED
) -> bytes:
    """A batch frame (tag byte included): ``header_cols`` as the msgpack header (in ``layout``'s
    column order), ``data_cols`` written back to back: raw columns (bytes-like) as they are, the
    others as little-endian f32 (float columns) or i32, except the token ids (the first column),
    i64 in ``LAYOUT_SGLANG_0_5_23``."""
    if layout not in FRAME_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(FRAME_LAYOUTS)}, got {layout!r}")
    if layout == LAYOUT_SGLANG_0_5_23 and len(header_cols) < _MIN_COLUMNS_0_5_23:
        raise ValueError(
            f"a {layout} header has at least {_MIN_COLUMNS_0_5_23} columns, got {len(header_cols)}"
        )
    header = _encoder.encode(list(header_cols))
    id_type = _I64 if layout == LAYOUT_SGLANG_0_5_23 else _I32
    data = b"".join(_column_bytes(c, id_type if k == 0 else _I32) for k, c in enumerate(data_cols))
    return b"".join((bytes((EGRESS_TAG_BATCH,)), _LEN.pack(len(header)), header, data))


def encode_result_frame(rid: str, payload: bytes) -> bytes:
    """A control-result frame."""
    return bytes((EGRESS_TAG_RESULT,)) + _encoder.encode([rid, payload])


def encode_error_frame(rid: str, message: str) -> bytes:
    """A per-request error frame."""
    return bytes((EGRESS_TAG_ERROR,)) + _encoder.encode([rid, message])


def decode_result_frame(frame: bytes) -> tuple[str, bytes]:
    """``(rid, payload)`` of a control-result frame; ``CodecError`` if malformed."""
    return _decode_pair(frame, EGRESS_TAG_RESULT, bytes)


def decode_error_frame(frame: bytes) -> tuple[str, str]:
    """``(rid, message)`` of an error frame; ``CodecError`` if malformed."""
    return _decode_pair(frame, EGRESS_TAG_ERROR, str)


def _decode_pair(frame: bytes, tag: int, second: type) -> tuple[str, Any]:
    if not frame or frame[0] != tag:
        raise CodecError(f"expected a frame with tag {tag}")
    try:
        value = _decoder.decode(memoryview(frame)[1:])
    except msgspec.DecodeError as exc:
        raise CodecError(f"frame body: {exc}") from None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[0], str)
        or not isinstance(value[1], second)
    ):
        raise CodecError(f"frame body must be [rid, {second.__name__}]")
    return value[0], value[1]


# ---- decoding ------------------------------------------------------------------------------------


class FrameEvent:
    """One request's part of a decode step."""

    __slots__ = (
        "cached_tokens",
        "extras",
        "finish_reason",
        "prompt_tokens",
        "reasoning_tokens",
        "rid",
        "token_ids",
    )

    def __init__(
        self,
        rid: str,
        token_ids: np.ndarray,
        finish_reason: FinishReason | None,
        prompt_tokens: int,
        extras: dict[str, Any] | None,
        cached_tokens: int = 0,
        reasoning_tokens: int = 0,
    ) -> None:
        self.rid = rid
        #: This step's token ids (an int32 or int64 view into the frame).
        self.token_ids = token_ids
        self.finish_reason = finish_reason
        self.prompt_tokens = prompt_tokens
        #: Prompt tokens served from the prefix cache; output tokens so far that are reasoning.
        self.cached_tokens = cached_tokens
        self.reasoning_tokens = reasoning_tokens
        #: None, or per family with values: ``{"values", "ids"}`` (simple families) or
        #: ``{"values", "ids", "poslens"}`` / ``{"values", "poslens"}`` (per-position families).
        self.extras = extras

    def __repr__(self) -> str:
        return (
            f"FrameEvent(rid={self.rid!r}, token_ids={self.token_ids.tolist()}, "
            f"finish_reason={self.finish_reason!r}, prompt_tokens={self.prompt_tokens})"
        )


class Decoded:
    """A decoded batch frame: columns for the shard, ``events`` per request for everyone else.

    ``ok`` is False for a malformed frame; then ``rids`` holds the rids its header named (possibly
    none) and there are no events. ``cached_tokens`` and ``reasoning_tokens`` are empty when the
    frame does not carry them (all zeros). ``engine``: which of several engines (data-parallel
    rank) made the step, for per-engine metrics (0 unless the engine says).
    """

    __slots__ = (
        "_events",
        "_families",
        "cached_tokens",
        "engine",
        "finish_reasons",
        "layout",
        "ok",
        "prompt_tokens",
        "reasoning_tokens",
        "rids",
        "tok_lens",
        "token_ids",
    )

    def __init__(
        self,
        ok: bool,
        rids: list[str],
        tok_lens: list[int] | None = None,
        token_ids: np.ndarray | None = None,
        finish_reasons: list[FinishReason | None] | None = None,
        prompt_tokens: list[int] | None = None,
        families: dict[str, tuple] | None = None,
        *,
        layout: str = LAYOUT_SEED,
        cached_tokens: list[int] | None = None,
        reasoning_tokens: list[int] | None = None,
    ) -> None:
        self.ok = ok
        self.layout = layout
        self.cached_tokens = cached_tokens or []
        self.reasoning_tokens = reasoning_tokens or []
        self.rids = rids
        self.tok_lens = tok_lens or []
        self.token_ids = token_ids if token_ids is not None else np.empty(0, dtype=_I32)
        self.finish_reasons = finish_reasons or []
        self.prompt_tokens = prompt_tokens or []
        self._families = families or {}
        self._events: list[FrameEvent] | None = None
        self.engine = 0

    def counts_at(self, i: int) -> tuple[int, int]:
        """Request ``i``'s ``(cached_tokens, reasoning_tokens)``."""
        cached = self.cached_tokens[i] if self.cached_tokens else 0
        return cached, self.reasoning_tokens[i] if self.reasoning_tokens else 0

    @property
    def has_extras(self) -> bool:
        """Whether any logprob/hidden-state family carries values."""
        return bool(self._families)

    def extras_at(self, i: int) -> dict[str, Any] | None:
        """Request ``i``'s logprob/hidden-state values, or None."""
        if not self._families:
            return None
        out: dict[str, Any] = {}
        for name, (offsets, cols, poslens, posoff) in self._families.items():
            a, b = offsets[i], offsets[i + 1]
            if poslens is None:
                if b > a:
                    out[name] = {"values": cols[0][a:b], "ids": cols[1][a:b]}
            elif b > a:
                pa, pb = int(posoff[a]), int(posoff[b])
                entry = {"poslens": poslens[a:b], "values": cols[0][pa:pb]}
                if len(cols) > 1:
                    entry["ids"] = cols[1][pa:pb]
                out[name] = entry
        return out or None

    @property
    def events(self) -> list[FrameEvent]:
        """One ``FrameEvent`` per request, in header order."""
        if self._events is None:
            events = []
            pos = 0
            for i, (rid, n) in enumerate(zip(self.rids, self.tok_lens)):
                events.append(
                    FrameEvent(
                        rid,
                        self.token_ids[pos : pos + n],
                        self.finish_reasons[i],
                        self.prompt_tokens[i],
                        self.extras_at(i),
                        *self.counts_at(i),
                    )
                )
                pos += n
            self._events = events
        return self._events


class _Malformed(Exception):
    pass


_COUNTS = list[Annotated[int, msgspec.Meta(ge=0)]]
#: The type of a header of each arity: rids, finish reasons (nil or a map), then count columns
#: (non-negative integers; bools are not integers here).
_HEADER_TYPES = {
    k: tuple.__class_getitem__(
        (list[str], list[Union[dict[str, Any], None]], *([_COUNTS] * (k - 2)))  # noqa: UP007
    )
    for k in range(4, _MAX_COLUMNS + 1)
}
_decode_header4 = msgspec.msgpack.Decoder(_HEADER_TYPES[4]).decode
#: SGLang 0.5.23's leading columns: rids, finish reasons, then 16 count columns.
_HEADER_TYPE_0_5_23 = tuple.__class_getitem__(
    (list[str], list[Union[dict[str, Any], None]], *([_COUNTS] * (_MIN_COLUMNS_0_5_23 - 2)))  # noqa: UP007
)


def _is_str_list(col: Any) -> bool:
    if not isinstance(col, list):
        return False
    try:
        msgspec.convert(col, list[str])
    except msgspec.ValidationError:
        return False
    return True


def _recover_rids(header: Any) -> list[str]:
    if isinstance(header, list) and header and _is_str_list(header[0]):
        return header[0]
    return []


def decode_batch_frame(frame: bytes | bytearray | memoryview) -> Decoded:
    """Decode a whole batch frame (tag byte included). Never raises: a malformed frame comes back
    with ``ok=False`` and the rids its header names."""
    buf = memoryview(frame)
    if buf.ndim != 1 or buf.itemsize != 1:
        buf = buf.cast("B")
    total = len(buf)
    if total < 5 or buf[0] != EGRESS_TAG_BATCH:
        return Decoded(False, [])
    (hlen,) = _LEN.unpack_from(buf, 1)
    if 5 + hlen > total:
        return Decoded(False, [])
    raw = buf[5 : 5 + hlen]
    try:
        # The common header (four columns), decoded and type-checked in one pass.
        header = list(_decode_header4(raw))
        checked = True
    except (msgspec.DecodeError, msgspec.ValidationError):
        checked = False
        try:
            header = _decoder.decode(raw)
        except msgspec.DecodeError:
            return Decoded(False, [])
    try:
        return _decode(header, buf, 5 + hlen, total, checked=checked)
    except _Malformed:
        return Decoded(False, _recover_rids(header))


def _decode(header: Any, buf: memoryview, start: int, total: int, *, checked: bool) -> Decoded:
    if not isinstance(header, list) or len(header) < 4:
        raise _Malformed
    layout = LAYOUT_SEED
    cached: list[int] = []
    reasoning: list[int] = []
    if len(header) > _MAX_COLUMNS:
        # SGLang 0.5.23: the two count columns out, the trailing ones ignored.
        if len(header) < _MIN_COLUMNS_0_5_23:
            raise _Malformed
        try:
            msgspec.convert(header[:_MIN_COLUMNS_0_5_23], _HEADER_TYPE_0_5_23)
        except msgspec.ValidationError:
            raise _Malformed from None
        layout = LAYOUT_SGLANG_0_5_23
        cached, reasoning = header[4], header[5]
        header = header[:4] + header[6:_MIN_COLUMNS_0_5_23]
    elif not checked:
        try:  # every column's element types in one pass (in C)
            msgspec.convert(header, _HEADER_TYPES[len(header)])
        except msgspec.ValidationError:
            raise _Malformed from None
    rids, finishes, prompt_tokens, tok_lens = header[0], header[1], header[2], header[3]
    n = len(rids)
    if len(finishes) != n or len(prompt_tokens) != n or len(tok_lens) != n:
        raise _Malformed
    if len(cached) not in (0, n) or len(reasoning) not in (0, n):
        raise _Malformed
    id_type = _I64 if layout == LAYOUT_SGLANG_0_5_23 else _I32
    counts = {"layout": layout, "cached_tokens": cached, "reasoning_tokens": reasoning}
    finish_reasons: list[FinishReason | None] = [None] * n
    if finishes.count(None) != n:
        for i, f in enumerate(finishes):
            if f is not None:
                finish_reasons[i] = FinishReason.from_json(f)
    n_tokens = sum(tok_lens)
    if not any(header[4:]):
        # No logprobs, no hidden states: the data is exactly the token ids.
        if start + id_type.itemsize * n_tokens != total:
            raise _Malformed
        ids = np.frombuffer(buf, dtype=id_type, count=n_tokens, offset=start)
        return Decoded(True, rids, tok_lens, ids, finish_reasons, prompt_tokens, **counts)
    optional = header[4:] + [[]] * (_MAX_COLUMNS - len(header))

    # Column lengths, in data order.
    lengths = [n_tokens]
    plans: dict[str, tuple[list[int], list[int] | None]] = {}
    for k, name in enumerate(FAMILIES[:_SIMPLE_FAMILIES]):
        lens = optional[k]
        if len(lens) not in (0, n):
            raise _Malformed
        total_values = sum(lens)
        lengths += [total_values, total_values]
        if total_values:
            plans[name] = (lens, None)
    for k, name in enumerate(FAMILIES[_SIMPLE_FAMILIES:]):
        reqlens = optional[_SIMPLE_FAMILIES + 2 * k]
        poslens = optional[_SIMPLE_FAMILIES + 2 * k + 1]
        if len(reqlens) not in (0, n) or sum(reqlens) != len(poslens):
            raise _Malformed
        total_values = sum(poslens)
        lengths += [total_values] if name == "hidden" else [total_values, total_values]
        if total_values:
            plans[name] = (reqlens, poslens)
    assert len(lengths) == _N_DATA_COLUMNS
    if start + id_type.itemsize * n_tokens + 4 * sum(lengths[1:]) != total:
        raise _Malformed

    # Zero-copy views, cursors laid end to end: no overlap, nothing out of range.
    views: list[np.ndarray] = []
    pos = start
    for k, count in enumerate(lengths):
        dtype = id_type if k == 0 else _I32 if k <= 12 and k % 2 == 0 else _F32
        views.append(np.frombuffer(buf, dtype=dtype, count=count, offset=pos))
        pos += dtype.itemsize * count

    families: dict[str, tuple] = {}
    col = 1
    for name in FAMILIES:
        width = 1 if name == "hidden" else 2
        cols = views[col : col + width]
        col += width
        if name not in plans:
            continue
        lens, poslens = plans[name]
        offsets = np.zeros(n + 1, dtype=np.int64)
        if lens:
            np.cumsum(lens, out=offsets[1:])
        if poslens is None:
            families[name] = (offsets.tolist(), cols, None, None)
        else:
            posoff = np.zeros(len(poslens) + 1, dtype=np.int64)
            np.cumsum(poslens, out=posoff[1:])
            families[name] = (offsets.tolist(), cols, np.asarray(poslens), posoff)
    return Decoded(
        True, rids, tok_lens, views[0], finish_reasons, prompt_tokens, families, **counts
    )
