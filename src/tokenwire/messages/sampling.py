"""``SamplingParams``: everything a request asks of generation, validated once at the door.

Fields, defaults and checks follow SGLang's ``SamplingParams`` (``from_dict`` -> ``normalize`` ->
``verify``), with the hard limits of its Rust server port: at most 32 stop strings and 32 stop
regexes of at most 256 bytes each, ``n == 1`` (fan-out is the HTTP layer's job), ``beam_width`` 1.
Every bad value is a ``ValidationError`` that names the field (as the client spelled it, when a
``names`` mapping says how) and the value; nothing is ever silently replaced by a default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import msgspec

from tokenwire.messages.errors import CodecError, ValidationError, quote
from tokenwire.messages.regex import StopRegex, admit_stop_regex

if TYPE_CHECKING:
    from tokenwire.tokenizer import Tokenizer

__all__ = [
    "DEFAULT_MAX_STOP_STR_LEN",
    "MAX_STOP_COUNT",
    "MAX_STOP_REGEX_COUNT",
    "MAX_STOP_TOKEN_SEQUENCE_LEN",
    "MAX_STOP_REGEX_LEN",
    "SAMPLING_EPS",
    "TOP_K_ALL",
    "SamplingParams",
]

#: ``top_k`` meaning "the whole vocabulary".
TOP_K_ALL = 1 << 30
#: Most stop strings a request may carry.
MAX_STOP_COUNT = 32
#: Longest stop string, in UTF-8 bytes, unless the server says otherwise (``--max-stop-str-len``).
#: Stop strings are delimiters: those real clients send (lm-eval, benchmark tools, chat stacks)
#: are tens of bytes; 1 KiB leaves ample room while bounding a request's stop state.
DEFAULT_MAX_STOP_STR_LEN = 1024
#: Longest stop token sequence (a list inside ``stop_token_ids``), in tokens.
MAX_STOP_TOKEN_SEQUENCE_LEN = 64
#: Most stop regexes a request may carry.
MAX_STOP_REGEX_COUNT = 32
#: Longest stop regex, in UTF-8 bytes.
MAX_STOP_REGEX_LEN = 256
#: Temperatures in ``[0, SAMPLING_EPS)`` mean greedy decoding.
SAMPLING_EPS = 1e-6
#: The largest ``logit_bias`` magnitude (OpenAI's range, which vLLM clamps to).
LOGIT_BIAS_LIMIT = 100

_GRAMMARS = ("json_schema", "regex", "ebnf", "structural_tag")


def _is_int(v: object) -> bool:
    """An integer that fits the engine wire format (signed 64-bit)."""
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_json(v: object, depth: int = 0) -> bool:
    if depth > 32:
        return False
    if isinstance(v, int) and not isinstance(v, bool):
        return _is_int(v)
    if v is None or isinstance(v, (bool, float, str)):
        return True
    if isinstance(v, list):
        return all(_is_json(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _is_json(x, depth + 1) for k, x in v.items())
    return False


@dataclass(eq=True)
class SamplingParams:
    """Sampling parameters of one request (one choice: ``n`` is always 1 here)."""

    max_new_tokens: int | None = 128
    stop: str | list[str] | None = None
    #: Token ids, and (vLLM) token id sequences as lists: ``[2, [318, 310, 305]]``.
    stop_token_ids: list[int | list[int]] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    beam_width: int | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[str, float] | None = None
    custom_params: dict[str, Any] | None = None
    stream_interval: int | None = None
    sampling_seed: int | None = None
    #: Log probabilities to report per output token: None for none; N >= 0 for the chosen
    #: token's and the N most likely ones' (vLLM's ``SamplingParams.logprobs``). Set by the
    #: HTTP layer, not a ``sampling_params`` key.
    logprobs: int | None = None
    #: The same for each prompt token (vLLM's ``prompt_logprobs``; the first has none).
    prompt_logprobs: int | None = None
    # vLLM's engine-side sampling fields, carried to an engine as vLLM's frontend sends them (set
    # by the HTTP layer from a request's fields, never ``sampling_params`` keys):
    #: Only these ids may be sampled.
    allowed_token_ids: list[int] | None = None
    #: Id sequences that may not be generated (``bad_words``, tokenized as vLLM does).
    bad_words_token_ids: list[list[int]] | None = None
    #: Report the logprobs of these ids at every position (``logprobs`` is their count).
    logprob_token_ids: list[int] | None = None
    #: Most tokens of thinking before the engine ends it.
    thinking_token_budget: int | None = None
    #: vLLM's ``extra_args`` (``vllm_xargs``, ``kv_transfer_params``...), for engine extensions.
    extra_args: dict[str, Any] | None = None
    #: vLLM's repetition detection (``max_pattern_size``, ``min_pattern_size``, ``min_count``).
    repetition_detection: dict[str, int] | None = None
    # Set by normalize():
    stop_strs: list[str] | None = None
    stop_regex_strs: list[str] | None = None
    stop_str_max_len: int = 0
    stop_regex_max_len: int = 0
    normalized: bool = False

    def __post_init__(self) -> None:
        if self.top_k == -1:
            self.top_k = TOP_K_ALL

    # ---- construction from a request -------------------------------------------------------------

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any] | None, *, names: Mapping[str, str] | None = None
    ) -> SamplingParams:
        """Build from a JSON object (SGLang's ``sampling_params``). An explicit null means the
        default, except ``max_new_tokens: null``, which means no limit. Unknown keys and values of
        the wrong type are ``ValidationError``s."""
        nm = _Names(names)
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ValidationError(
                f"sampling_params must be an object, got {type(data).__name__}",
                param="sampling_params",
            )
        unknown = [k for k in data if k not in _INPUT_FIELDS]
        if unknown:
            key = unknown[0]
            raise ValidationError(f"unknown sampling parameter {key!r}", param=nm(str(key)))
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if value is None:
                if key == "max_new_tokens":
                    kwargs[key] = None
                continue
            kwargs[key] = _coerce(key, value, nm)
        for g in _GRAMMARS:
            if kwargs.get(g) == "":
                del kwargs[g]
        return cls(**kwargs)

    # ---- normalize / verify ----------------------------------------------------------------------

    def normalize(
        self,
        tokenizer: Tokenizer | None,
        *,
        names: Mapping[str, str] | None = None,
        max_stop_str_len: int = DEFAULT_MAX_STOP_STR_LEN,
    ) -> SamplingParams:
        """Derive the internal fields (idempotent): stop lists and their bounds, greedy decoding
        for temperatures below ``SAMPLING_EPS``, ``top_k`` -1 as ``TOP_K_ALL``. Stop strings
        (each at most ``max_stop_str_len`` UTF-8 bytes), stop regexes and ``min_new_tokens > 0``
        need a tokenizer."""
        nm = _Names(names)
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_COUNT:
            raise ValidationError(
                f"{nm('stop')} has {len(stops)} strings, more than the limit of {MAX_STOP_COUNT}",
                param=nm("stop"),
            )
        if any(s == "" for s in stops):
            raise ValidationError(f"{nm('stop')} strings must not be empty", param=nm("stop"))
        for s in stops:
            # Four bytes per character at most: only long strings need encoding to be sure.
            if len(s) * 4 > max_stop_str_len and len(s.encode("utf-8")) > max_stop_str_len:
                raise ValidationError(
                    f"{nm('stop')} strings must be at most {max_stop_str_len} bytes (UTF-8), "
                    f"got one of {len(s.encode('utf-8'))}",
                    param=nm("stop"),
                )
        patterns = (
            [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex or [])
        )
        if len(patterns) > MAX_STOP_REGEX_COUNT:
            raise ValidationError(
                f"{nm('stop_regex')} has {len(patterns)} patterns, more than the limit of "
                f"{MAX_STOP_REGEX_COUNT}",
                param=nm("stop_regex"),
            )
        admitted = [self._admit(p, nm) for p in patterns]
        if tokenizer is None:
            for key, used in (
                ("stop", bool(stops)),
                ("stop_regex", bool(patterns)),
                ("min_new_tokens", self.min_new_tokens > 0),
            ):
                if used:
                    raise ValidationError(
                        f"{nm(key)} requires a tokenizer (stop matching decodes the output; "
                        "min_new_tokens needs the EOS token)",
                        param=nm(key),
                    )
        self.stop_strs = stops
        self.stop_str_max_len = max((len(s.encode("utf-8")) for s in stops), default=0)
        self.stop_regex_strs = patterns
        self.stop_regex_max_len = max((r.max_len for r in admitted), default=0)
        if 0 <= self.temperature < SAMPLING_EPS:
            self.temperature = 1.0
            self.top_k = 1
        if self.top_k == -1:
            self.top_k = TOP_K_ALL
        self.normalized = True
        return self

    @staticmethod
    def _admit(pattern: str, nm: _Names) -> StopRegex:
        try:
            return admit_stop_regex(pattern)
        except ValidationError as exc:
            detail = exc.detail.replace("stop_regex", nm("stop_regex"), 1)
            raise ValidationError(detail, param=nm("stop_regex")) from None

    @property
    def stop_regexes(self) -> list[StopRegex]:
        """The admitted stop regexes (from the admission cache)."""
        return [admit_stop_regex(p) for p in self.stop_regex_strs or []]

    def verify(self, vocab_size: int, *, names: Mapping[str, str] | None = None) -> None:
        """Check every value's range, in SGLang's order; the first failure is raised."""
        nm = _Names(names)

        def fail(key: str, what: str) -> None:
            raise ValidationError(f"{nm(key)} {what}", param=nm(key))

        if not math.isfinite(self.temperature) or self.temperature < 0.0:
            fail("temperature", f"must be a non-negative finite number, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            fail("top_p", f"must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            fail("min_p", f"must be in [0, 1], got {self.min_p}")
        if self.top_k != -1 and self.top_k < 1:
            fail("top_k", f"must be -1 (disabled) or at least 1, got {self.top_k}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            fail("frequency_penalty", f"must be in [-2, 2], got {self.frequency_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            fail("presence_penalty", f"must be in [-2, 2], got {self.presence_penalty}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            fail(
                "repetition_penalty",
                f"must be in (0, 2] (1.0 = no penalty), got {self.repetition_penalty}",
            )
        if self.min_new_tokens < 0:
            fail("min_new_tokens", f"must be at least 0, got {self.min_new_tokens}")
        if self.max_new_tokens is not None:
            if self.max_new_tokens < 0:
                fail("max_new_tokens", f"must be at least 0, got {self.max_new_tokens}")
            if self.min_new_tokens > self.max_new_tokens:
                fail(
                    "min_new_tokens",
                    f"must be in [0, {nm('max_new_tokens')}={self.max_new_tokens}], "
                    f"got {self.min_new_tokens}",
                )
        for key in self.logit_bias or {}:
            if not (isinstance(key, str) and key.isascii() and key.isdecimal()):
                fail("logit_bias", f"keys must be decimal token ids, got {quote(key)}")
            if len(key) > 20 or not int(key) < vocab_size:
                fail(
                    "logit_bias",
                    f"keys must be token ids in [0, {vocab_size - 1}], got {quote(key)}",
                )
        if sum(getattr(self, g) is not None for g in _GRAMMARS) > 1:
            given = ", ".join(nm(g) for g in _GRAMMARS if getattr(self, g) is not None)
            raise ValidationError(
                f"Only one of json_schema, regex, ebnf or structural_tag can be set (got {given})",
                param=nm(next(g for g in _GRAMMARS if getattr(self, g) is not None)),
            )
        if self.n != 1:
            fail("n", f"must be 1 here (requests with n > 1 are fanned out), got {self.n}")
        if self.beam_width is not None and self.beam_width != 1:
            fail("beam_width", f"must be 1 (beam search is not supported), got {self.beam_width}")
        for entry in self.stop_token_ids or []:
            for token_id in entry if isinstance(entry, list) else [entry]:
                if not 0 <= token_id < vocab_size:
                    fail(
                        "stop_token_ids",
                        f"contains the out-of-vocab token id {token_id}: token ids must be in "
                        f"[0, {vocab_size - 1}] (Vocabulary size: {vocab_size})",
                    )
        if self.stream_interval is not None and self.stream_interval < 1:
            fail("stream_interval", f"must be at least 1, got {self.stream_interval}")

    @property
    def stop_token_sequences(self) -> list[list[int]]:
        """The token id sequences among ``stop_token_ids``, in order."""
        return [list(e) for e in self.stop_token_ids or [] if isinstance(e, list)]

    def for_engine(self, *, stop_token_sequences: bool) -> SamplingParams:
        """These parameters as an engine gets them: without the stop token sequences when it
        cannot match them (the frontend does)."""
        if stop_token_sequences or not self.stop_token_sequences:
            return self
        ids = [e for e in self.stop_token_ids or [] if not isinstance(e, list)]
        return replace(self, stop_token_ids=ids or None)

    # ---- engine wire format ----------------------------------------------------------------------

    def to_wire(self) -> bytes:
        """A positional msgpack array, one fixed slot per field (nil for unset)."""
        return _ENCODER.encode([getattr(self, f) for f in _WIRE_FIELDS])

    @classmethod
    def from_wire(cls, data: bytes) -> SamplingParams:
        """Inverse of ``to_wire``."""
        try:
            values = msgspec.msgpack.decode(data)
        except msgspec.DecodeError as exc:
            raise CodecError(f"sampling params: {exc}") from None
        if not isinstance(values, list) or len(values) != len(_WIRE_FIELDS):
            raise CodecError(f"sampling params: expected an array of {len(_WIRE_FIELDS)} slots")
        obj = cls.__new__(cls)
        for name, value in zip(_WIRE_FIELDS, values):
            object.__setattr__(obj, name, value)
        return obj


_WIRE_FIELDS = tuple(f.name for f in fields(SamplingParams))
_INPUT_FIELDS = frozenset(_WIRE_FIELDS) - {
    "logprobs",
    "prompt_logprobs",
    "allowed_token_ids",
    "bad_words_token_ids",
    "logprob_token_ids",
    "thinking_token_budget",
    "extra_args",
    "repetition_detection",
    "stop_strs",
    "stop_regex_strs",
    "stop_str_max_len",
    "stop_regex_max_len",
    "normalized",
}
_ENCODER = msgspec.msgpack.Encoder()


class _Names:
    """Maps internal field names to the names the client used."""

    __slots__ = ("_m",)

    def __init__(self, mapping: Mapping[str, str] | None) -> None:
        self._m = mapping or {}

    def __call__(self, key: str) -> str:
        return self._m.get(key, key)


_FLOAT_FIELDS = {
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
}
_INT_FIELDS = {"max_new_tokens", "top_k", "min_new_tokens", "n", "beam_width", "stream_interval"}
_BOOL_FIELDS = {
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
}


def _coerce(key: str, value: Any, nm: _Names) -> Any:
    """Type-check one request value (never converting a wrong type into something else)."""

    def bad(what: str) -> ValidationError:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        return ValidationError(f"{nm(key)} must be {what}, got {shown}", param=nm(key))

    if key in _FLOAT_FIELDS:
        if not _is_number(value):
            raise bad("a number")
        try:
            return float(value)
        except OverflowError:
            raise bad("a finite number") from None
    if key in _INT_FIELDS:
        if not _is_int(value):
            raise bad("a (64-bit) integer")
        return value
    if key in _BOOL_FIELDS:
        if not isinstance(value, bool):
            raise bad("a boolean")
        return value
    if key in ("stop", "stop_regex"):
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return list(value)
        raise bad("a string or a list of strings")
    if key == "stop_token_ids":
        if not isinstance(value, list):
            raise bad("a list of token ids or token id sequences")
        out: list[int | list[int]] = []
        for t in value:
            if isinstance(t, list):
                if not t or len(t) > MAX_STOP_TOKEN_SEQUENCE_LEN:
                    raise bad(
                        f"a list of token ids or token id sequences of 1 to "
                        f"{MAX_STOP_TOKEN_SEQUENCE_LEN} ids (bad element {t!r})"
                    )
                for x in t:
                    if not _is_int(x) or x < 0:
                        raise bad(f"a list of non-negative integer token ids (bad element {x!r})")
                out.append(list(t))
            elif not _is_int(t) or t < 0:
                raise bad(f"a list of non-negative integer token ids (bad element {t!r})")
            else:
                out.append(t)
        return out
    if key in _GRAMMARS:
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if key == "logit_bias":
        if not isinstance(value, dict):
            raise bad("an object mapping token ids to biases")
        for k, v in value.items():
            if not _is_number(v) or not -LOGIT_BIAS_LIMIT <= v <= LOGIT_BIAS_LIMIT:
                raise ValidationError(
                    f"{nm(key)}[{quote(k)}] must be a number in [-{LOGIT_BIAS_LIMIT}, "
                    f"{LOGIT_BIAS_LIMIT}], got {quote(v)}",
                    param=nm(key),
                )
        return {str(k): float(v) for k, v in value.items()}
    if key == "custom_params":
        if not isinstance(value, dict) or not _is_json(value):
            raise bad("a JSON object (integers within 64 bits)")
        return value
    if key == "sampling_seed":
        if isinstance(value, int) and not isinstance(value, bool) and not _is_int(value):
            # (vLLM's words: its clients' tests look for them)
            low = value < 0
            bound = -(2**63) if low else 2**63 - 1
            kind = "greater_than_equal" if low else "less_than_equal"
            raise ValidationError(
                f"{nm(key)} must be a 64-bit integer ({kind}: Input should be "
                f"{'greater' if low else 'less'} than or equal to {bound}), got {value}",
                param=nm(key),
            )
        if not _is_int(value):
            raise bad("a (64-bit) integer")
        return value
    raise AssertionError(key)  # pragma: no cover - every input field is handled above
