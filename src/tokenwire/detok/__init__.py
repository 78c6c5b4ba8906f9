"""Detokenization: exact streaming decode (``DecodeStream``), batch stepping (``DecodeBatch``) and
the precomputed per-token tables behind the fast path."""

from tokenwire.detok.batch import DecodeBatch
from tokenwire.detok.stream import SAFE_SUFFIX_MAX, SAFE_SUFFIX_MIN, DecodeStream
from tokenwire.detok.tables import DecodeTable, build_decode_table, decode_table

__all__ = [
    "SAFE_SUFFIX_MAX",
    "SAFE_SUFFIX_MIN",
    "DecodeBatch",
    "DecodeStream",
    "DecodeTable",
    "build_decode_table",
    "decode_table",
]
