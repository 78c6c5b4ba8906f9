"""``Tokenizer``: a strict, fast wrapper over a Hugging Face tokenizer and its configs."""

from __future__ import annotations

import functools
import json
import lzma
import os
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from importlib import resources
from typing import Annotated, Any, TypeVar

import msgspec
import tokenizers

from tokenwire.fast_bpe import FastBpe
from tokenwire.messages.errors import DecodeError, TokenizeError, ValidationError

__all__ = ["DEFAULT_TOKENIZER_NAME", "Tokenizer", "all_ints"]

T = TypeVar("T")

DEFAULT_TOKENIZER_NAME = "Qwen/Qwen3-0.6B"
_DEFAULT_DIR = "qwen3"


_INT_LIST = list[int]


def all_ints(values: list[Any]) -> bool:
    """Whether every item of ``values`` is an integer (not a bool), as a token-id list must be:
    checked in one pass of msgspec's C code, item by item in Python only when that refuses."""
    try:
        msgspec.convert(values, _INT_LIST)
    except msgspec.ValidationError:
        return all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    return True


@functools.lru_cache(maxsize=16)
def _ids_below(n: int) -> Any:
    """The msgspec type of a list of token ids in ``[0, n)``."""
    return list[Annotated[int, msgspec.Meta(ge=0, lt=n)]]


def _token_content(value: Any) -> str | None:
    """The text of a ``tokenizer_config.json`` token entry (a string or an AddedToken dict)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _pick_chat_template(value: Any) -> str | None:
    """``chat_template`` is a string or a list of ``{"name", "template"}``; pick the default one."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {e.get("name"): e.get("template") for e in value if isinstance(e, dict)}
        chosen = named.get("default") or next(iter(named.values()), None)
        return chosen if isinstance(chosen, str) else None
    return None


class Tokenizer:
    """A Hugging Face tokenizer plus what its configs say about the model.

    ``decode`` is strict: an id the tokenizer cannot map back to a token raises ``DecodeError``
    (``tokenizers`` itself drops such ids silently). ``vocab_size`` counts tokenizer ids (added
    tokens included); ``model_vocab_size`` is the model's embedding size when larger, so that ids in
    ``[vocab_size, model_vocab_size)`` are valid prompt input the tokenizer cannot decode.
    """

    def __init__(
        self,
        hf_tokenizer: tokenizers.Tokenizer,
        config: dict[str, Any] | None = None,
        *,
        model_config: dict[str, Any] | None = None,
        generation_config: dict[str, Any] | None = None,
        chat_template: str | None = None,
        model_vocab_size: int | None = None,
        name: str = "tokenizer",
    ) -> None:
        # A served prompt is never padded or truncated (some tokenizer.json files configure both for
        # training): that would silently change the request.
        hf_tokenizer.no_padding()
        hf_tokenizer.no_truncation()
        self._tok = hf_tokenizer
        self._encode_fast = getattr(hf_tokenizer, "encode_batch_fast", None)
        self.name = name
        self.config: dict[str, Any] = dict(config or {})
        model_config = dict(model_config or {})
        generation_config = dict(generation_config or {})
        #: The model folder's ``generation_config.json`` (empty when it has none).
        self.generation_config: dict[str, Any] = generation_config

        vocab = hf_tokenizer.get_vocab(with_added_tokens=True)
        ids = set(vocab.values())
        self.vocab_size: int = (max(ids) + 1) if ids else 0
        self._has_holes = len(ids) != self.vocab_size
        self._known: bytearray | None = None
        if self._has_holes:
            known = bytearray(self.vocab_size)
            for i in ids:
                known[i] = 1
            self._known = known
        added = hf_tokenizer.get_added_tokens_decoder()
        self._special_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)

        if model_vocab_size is None:
            mv = model_config.get("vocab_size")
            if mv is None and isinstance(model_config.get("text_config"), dict):
                mv = model_config["text_config"].get("vocab_size")
            model_vocab_size = mv if isinstance(mv, int) and not isinstance(mv, bool) else None
        if model_vocab_size is not None and model_vocab_size < 0:
            raise ValueError(f"model_vocab_size must be >= 0, got {model_vocab_size}")
        self.model_vocab_size: int = max(self.vocab_size, model_vocab_size or 0)

        self.bos_token: str | None = _token_content(self.config.get("bos_token"))
        self.eos_token: str | None = _token_content(self.config.get("eos_token"))
        self.pad_token: str | None = _token_content(self.config.get("pad_token"))
        self.unk_token: str | None = _token_content(self.config.get("unk_token"))
        bos_id = self.token_to_id(self.bos_token) if self.bos_token else None
        if bos_id is None:
            cfg_bos = model_config.get("bos_token_id")
            bos_id = cfg_bos if isinstance(cfg_bos, int) and not isinstance(cfg_bos, bool) else None
        self.bos_token_id: int | None = bos_id
        eos: list[int] = []
        if self.eos_token and self.token_to_id(self.eos_token) is not None:
            eos.append(self.token_to_id(self.eos_token))  # type: ignore[arg-type]
        for source in (model_config, generation_config):
            value = source.get("eos_token_id")
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, int) and not isinstance(v, bool) and v not in eos:
                    eos.append(v)
        self.eos_token_ids: tuple[int, ...] = tuple(eos)
        self.chat_template: str | None = chat_template or _pick_chat_template(
            self.config.get("chat_template")
        )
        ctx = model_config.get("max_position_embeddings")
        if not (isinstance(ctx, int) and ctx > 0):
            ctx = self.config.get("model_max_length")
            ctx = ctx if isinstance(ctx, int) and 0 < ctx < 10**9 else None
        #: The model's context length (prompt plus generated tokens), when the configs say it.
        self.max_model_len: int | None = ctx
        self.add_bos_token: bool = bool(self.config.get("add_bos_token", False))

        self._derived: dict[Hashable, Any] = {}
        self._single: dict[bool, list[str]] = {}
        self._window_memo: dict[bool, dict[tuple[int, ...], str]] = {True: {}, False: {}}
        self._generic_shared: dict[bool, Any] = {}
        # (Reentrant: a derived value may be built from another, a decode table from encode.)
        self._tables_lock = threading.RLock()

    # ---- construction ----------------------------------------------------------------------------

    @classmethod
    def from_file(
        cls, tokenizer_json_path: str | os.PathLike[str], *, model_vocab_size: int | None = None
    ) -> Tokenizer:
        """Load ``tokenizer.json``; ``tokenizer_config.json`` and ``config.json`` beside it are
        read when present."""
        path = os.fspath(tokenizer_json_path)
        return cls._from_parts(
            tokenizers.Tokenizer.from_file(path),
            os.path.dirname(os.path.abspath(path)),
            model_vocab_size=model_vocab_size,
            name=path,
        )

    @classmethod
    def from_pretrained(
        cls, dir_or_hub_id: str | os.PathLike[str], *, model_vocab_size: int | None = None
    ) -> Tokenizer:
        """Load from a model directory (``tokenizer.json``, ``tokenizer_config.json``, optionally
        ``config.json``, ``generation_config.json`` and ``chat_template.jinja``) or, when no such
        directory exists, from the Hugging Face hub by repository id."""
        source = os.fspath(dir_or_hub_id)
        if os.path.isdir(source):
            directory = source
        else:
            directory = cls._download(source)
        path = os.path.join(directory, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no tokenizer.json in {source!r}")
        return cls._from_parts(
            tokenizers.Tokenizer.from_file(path),
            directory,
            model_vocab_size=model_vocab_size,
            name=source,
        )

    @staticmethod
    def _download(repo_id: str) -> str:
        """Fetch a hub repository's tokenizer files into the local cache; return its directory."""
        try:
            from huggingface_hub import snapshot_download
        except ImportError as exc:  # pragma: no cover - huggingface_hub is a dependency
            raise FileNotFoundError(
                f"{repo_id!r} is not a directory and huggingface_hub is not installed"
            ) from exc
        return snapshot_download(
            repo_id,
            allow_patterns=[
                "tokenizer.json",
                "tokenizer_config.json",
                "config.json",
                "generation_config.json",
                "chat_template.jinja",
                "special_tokens_map.json",
            ],
        )

    @classmethod
    def _from_parts(
        cls,
        hf: tokenizers.Tokenizer,
        directory: str,
        *,
        model_vocab_size: int | None,
        name: str,
    ) -> Tokenizer:
        template = None
        jinja_path = os.path.join(directory, "chat_template.jinja")
        if os.path.isfile(jinja_path):
            with open(jinja_path, encoding="utf-8") as f:
                template = f.read()
        return cls(
            hf,
            _read_json(os.path.join(directory, "tokenizer_config.json")),
            model_config=_read_json(os.path.join(directory, "config.json")),
            generation_config=_read_json(os.path.join(directory, "generation_config.json")),
            chat_template=template,
            model_vocab_size=model_vocab_size,
            name=name,
        )

    @classmethod
    def default(cls, *, model_vocab_size: int | None = None) -> Tokenizer:
        """The tokenizer bundled with tokenwire: Qwen3 (Apache-2.0), model vocab 151936."""
        base = resources.files("tokenwire") / "_data" / _DEFAULT_DIR
        raw = lzma.decompress((base / "tokenizer.json.xz").read_bytes())
        config = json.loads((base / "tokenizer_config.json").read_text(encoding="utf-8"))
        model_config = json.loads((base / "config.json").read_text(encoding="utf-8"))
        return cls(
            tokenizers.Tokenizer.from_str(raw.decode("utf-8")),
            config,
            model_config=model_config,
            model_vocab_size=model_vocab_size,
            name=DEFAULT_TOKENIZER_NAME,
        )

    # ---- vocabulary ------------------------------------------------------------------------------

    @property
    def hf(self) -> tokenizers.Tokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    def is_known(self, token_id: int) -> bool:
        """Whether the tokenizer can map ``token_id`` back to a token."""
        if not 0 <= token_id < self.vocab_size:
            return False
        return self._known is None or bool(self._known[token_id])

    def id_to_token(self, token_id: int) -> str | None:
        """The token string of ``token_id``, or None when the tokenizer cannot map it."""
        if not self.is_known(token_id):
            return None
        return self._tok.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        """The id of ``token``, or None when it is not in the vocabulary."""
        return self._tok.token_to_id(token)

    def is_special(self, token_id: int) -> bool:
        """Whether ``token_id`` is a special added token (dropped by ``skip_special_tokens``)."""
        return token_id in self._special_ids

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the special added tokens."""
        return self._special_ids

    # ---- encode / decode -------------------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``TokenizeError`` if the tokenizer fails."""
        try:
            fast = self.fast_bpe()
            if fast is not None:  # tiktoken, where it reproduces this tokenizer exactly
                return fast.encode(text, add_special_tokens)
            if self._encode_fast is not None:  # no offsets computed: faster
                return self._encode_fast([text], add_special_tokens=add_special_tokens)[0].ids
            return self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise TokenizeError(str(exc)) from exc

    def check_decodable(self, ids: Sequence[int]) -> None:
        """Raise ``DecodeError`` naming the first id the tokenizer cannot map."""
        if not ids:
            return
        n = self.vocab_size
        known = self._known
        if known is None and min(ids) >= 0 and max(ids) < n:
            return
        for pos, i in enumerate(ids):
            if not (0 <= i < n) or (known is not None and not known[i]):
                raise DecodeError(
                    f"token id {i} (position {pos}) is not in the tokenizer vocabulary "
                    f"(tokenizer ids are 0..{n - 1})"
                )

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``, exactly as ``tokenizers`` decodes them; strict about unknown ids."""
        ids = ids if isinstance(ids, list) else list(ids)
        if ids and type(ids[0]) is not int:
            ids = [int(i) for i in ids]
        self.check_decodable(ids)
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def validate_prompt_ids(self, ids: Sequence[int], *, field: str = "prompt") -> None:
        """Every id must be an integer in ``[0, model_vocab_size)``; otherwise ``ValidationError``
        naming the first bad position and value."""
        n = self.model_vocab_size
        try:  # (the usual case, valid ids, in one pass of msgspec's C code)
            msgspec.convert(ids, _ids_below(n))
            return
        except msgspec.ValidationError:
            pass  # (the first bad one named below)
        for pos, i in enumerate(ids):
            if isinstance(i, bool) or not isinstance(i, int):
                raise ValidationError(
                    f"{field}[{pos}] = {i!r} is not an integer token id", param=field
                )
            if not 0 <= i < n:
                raise ValidationError(
                    f"{field}[{pos}] = {i} is out of range: token ids must be in [0, {n})",
                    param=field,
                )

    # ---- tables derived from the vocabulary -----------------------------------------------------

    def derived(self, key: Hashable, build: Callable[[Tokenizer], T]) -> T:
        """A value derived from this tokenizer (a decode table, say), built once by
        ``build(self)`` (thread-safe) and kept as long as the tokenizer."""
        try:
            return self._derived[key]
        except KeyError:
            pass
        with self._tables_lock:
            if key not in self._derived:
                self._derived[key] = build(self)
            return self._derived[key]

    def fast_bpe(self) -> FastBpe | None:
        """The tiktoken path ``encode`` takes when it reproduces this tokenizer exactly (checked
        once, when first asked for: about a second), or None."""
        return self.derived("fast_bpe", _build_fast_bpe)

    def single_token_texts(self, skip_special_tokens: bool = True) -> list[str]:
        """``decode([id])`` for every tokenizer id (computed once, in one batch call)."""
        key = bool(skip_special_tokens)
        texts = self._single.get(key)
        if texts is None:
            with self._tables_lock:
                texts = self._single.get(key)
                if texts is None:
                    texts = self._tok.decode_batch(
                        [[i] for i in range(self.vocab_size)], skip_special_tokens=key
                    )
                    self._single[key] = texts
        return texts

    def window_memo(self, skip_special_tokens: bool = True) -> dict[tuple[int, ...], str]:
        """A shared memo of ``decode(window)`` for short windows (used by the generic stream)."""
        return self._window_memo[bool(skip_special_tokens)]

    def __repr__(self) -> str:
        return (
            f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, "
            f"model_vocab_size={self.model_vocab_size})"
        )


def _build_fast_bpe(tok: Tokenizer) -> FastBpe | None:
    return FastBpe.build(tok.hf, tok.name)
