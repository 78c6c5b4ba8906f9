"""``FinishReason``: why a request ended, in exactly SGLang's wire shapes.

    {"type": "stop", "matched": 9}            a stop token (EOS or one of stop_token_ids)
    {"type": "stop", "matched": "</s>"}       a stop string (or the pattern of a stop regex)
    {"type": "stop", "matched": [9, 10]}      a stop token sequence
    {"type": "length", "length": 8}           max_new_tokens reached
    {"type": "abort", "message": "Aborted", "status_code": null, "err_type": null}

A shape tokenwire does not know (a new ``type``, or a known type with fields of other types) is kept
verbatim and written back unchanged, so a newer engine never breaks the frontend.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Union

__all__ = ["FinishReason", "Matched"]

Matched = Union[int, str, list[int]]  # noqa: UP007 (a runtime alias; Python 3.10 has no int | str | list[int] alias)

_KNOWN_KEYS = {
    "stop": ("matched",),
    "length": ("length",),
    "abort": ("message", "status_code", "err_type"),
}


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _valid_matched(x: object) -> bool:
    return (
        x is None
        or _is_int(x)
        or isinstance(x, str)
        or (isinstance(x, list) and all(_is_int(i) for i in x))
    )


class FinishReason:
    """One finish reason. Build with ``stop``/``length``/``abort`` or ``from_json``."""

    __slots__ = ("_extra", "_fields", "kind")

    def __init__(self, kind: str, fields: dict[str, Any], extra: dict[str, Any] | None = None):
        #: ``"stop"``, ``"length"``, ``"abort"``, or ``"unknown"`` for a shape kept verbatim.
        self.kind = kind
        self._fields = fields
        self._extra = extra or {}

    # ---- construction ----------------------------------------------------------------------------

    @classmethod
    def stop(cls, matched: Matched | None = None) -> FinishReason:
        """Stopped by a stop token, token sequence, string or regex (``matched``), or EOS."""
        return cls("stop", {"matched": matched})

    @classmethod
    def length(cls, length: int | None) -> FinishReason:
        """Stopped at ``max_new_tokens``."""
        return cls("length", {"length": length})

    @classmethod
    def abort(
        cls,
        message: str | None = "Aborted",
        *,
        status_code: int | None = None,
        err_type: str | None = None,
    ) -> FinishReason:
        """Aborted (by the client, the server or the engine)."""
        return cls("abort", {"message": message, "status_code": status_code, "err_type": err_type})

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> FinishReason:
        """Parse a wire dict. Unknown types, and known ones whose fields have other types, are
        kept verbatim (``kind == "unknown"``)."""
        if not isinstance(value, Mapping):
            raise TypeError(f"a finish reason is a JSON object, got {type(value).__name__}")
        data = dict(value)
        kind = data.get("type")
        keys = _KNOWN_KEYS.get(kind) if isinstance(kind, str) else None
        if keys is not None:
            fields = {k: data.get(k) for k in keys}
            ok = {
                "stop": lambda f: _valid_matched(f["matched"]),
                "length": lambda f: f["length"] is None or _is_int(f["length"]),
                "abort": lambda f: (
                    (f["message"] is None or isinstance(f["message"], str))
                    and (f["status_code"] is None or _is_int(f["status_code"]))
                    and (f["err_type"] is None or isinstance(f["err_type"], str))
                ),
            }[kind](fields)
            if ok:
                extra = {k: v for k, v in data.items() if k != "type" and k not in keys}
                return cls(kind, fields, extra)
        return cls("unknown", data)

    def to_json(self) -> dict[str, Any]:
        """The wire dict (every field of a known type written, nulls included)."""
        if self.kind == "unknown":
            return dict(self._fields)
        out: dict[str, Any] = {"type": self.kind}
        out.update(self._fields)
        out.update(self._extra)
        return out

    # ---- accessors -------------------------------------------------------------------------------

    @property
    def type(self) -> Any:
        """The wire ``type`` (for an unknown shape, whatever it carried)."""
        return self._fields.get("type") if self.kind == "unknown" else self.kind

    def matched(self) -> Matched | None:
        """The stop value, for a stop; None otherwise."""
        return self._fields["matched"] if self.kind == "stop" else None

    @property
    def length_value(self) -> int | None:
        """The ``length`` of a length finish; None otherwise."""
        return self._fields["length"] if self.kind == "length" else None

    @property
    def message(self) -> str | None:
        """The message of an abort; None otherwise."""
        return self._fields["message"] if self.kind == "abort" else None

    def abort_status(self) -> tuple[int, str] | None:
        """``(status_code, message)`` for an abort that carries a status code; None otherwise."""
        if self.kind != "abort" or self._fields["status_code"] is None:
            return None
        return self._fields["status_code"], self._fields["message"] or "request aborted"

    @property
    def openai_finish_reason(self) -> str:
        """OpenAI's ``finish_reason``: ``"stop"``, ``"length"`` or ``"abort"`` (vLLM's word for an
        aborted request); an unknown shape gives its own ``type`` when that is a string."""
        if self.kind != "unknown":
            return self.kind
        t = self._fields.get("type")
        return t if isinstance(t, str) else "stop"

    def stop_reason(self, eos_token_ids: Collection[int] = ()) -> int | str | None:
        """vLLM's ``stop_reason``: the stop string or stop token id that ended the request, a stop
        token sequence written as vLLM writes it (``"[2318, 310, 2305]"``), or None (EOS, length,
        abort)."""
        matched = self.matched()
        if _is_int(matched) and matched in eos_token_ids:
            return None
        if isinstance(matched, list):
            return str(matched)
        return matched

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FinishReason) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(repr(sorted(self.to_json().items(), key=lambda kv: kv[0])))

    def __repr__(self) -> str:
        return f"FinishReason({self.to_json()!r})"
