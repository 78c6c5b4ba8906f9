"""Pooling inputs: validated, bounded before they are tokenized, truncated as vLLM truncates them,
and cross-encoder pairs built as vLLM builds them.

Bounds: at most ``MAX_POOLING_INPUTS`` inputs (or pairs) a request, counted before anything is
tokenized, and ``MAX_POOLING_TOKENS`` tokens in all, counted as the inputs are tokenized (token-id
inputs first), so a request past it is refused having tokenized at most one input more than the
bound (short texts are tokenized 64 at a time: at most one such chunk more); every text is refused
before tokenizing when it cannot fit the context whatever its tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenwire.context_length import PIECE_CHARS, encode_within, max_prompt_chars
from tokenwire.messages.errors import TokenizeError, ValidationError
from tokenwire.tokenizer import Tokenizer, all_ints

__all__ = [
    "MAX_POOLING_INPUTS",
    "MAX_POOLING_TOKENS",
    "PairTemplate",
    "ScoreData",
    "TokenBudget",
    "encode_pair",
    "pooling_inputs",
    "score_inputs",
    "tokenize_inputs",
    "truncate_text_to_tokens",
]

#: Most inputs (or query-document pairs) one request may carry (OpenAI's embeddings limit).
MAX_POOLING_INPUTS = 2048
#: Most tokens all of one request's inputs may come to (OpenAI's embeddings limit).
MAX_POOLING_TOKENS = 300_000
#: Short texts are tokenized this many at a time (one call for the batch, the budget checked
#: after each).
_CHUNK = 64

Input = str | list[int]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_count(count: int, field: str) -> None:
    if count > MAX_POOLING_INPUTS:
        raise ValidationError(
            f"{field} has {count} inputs; the limit is {MAX_POOLING_INPUTS} a request",
            param=field,
        )


def pooling_inputs(value: Any, field: str = "input") -> list[Input]:
    """The inputs of an embeddings (or pooling, classify) request: a string, a list of strings,
    a list of token ids, or a list of token-id lists; counted against ``MAX_POOLING_INPUTS``
    before anything is tokenized."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise ValidationError(
            f"{field} must be a string, a list of strings, a list of token ids or a list of "
            "token-id lists, and not empty",
            param=field,
        )
    if all_ints(value):
        return [list(value)]
    _check_count(len(value), field)
    out: list[Input] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, list) and item and all_ints(item):
            out.append(list(item))
        else:
            raise ValidationError(
                f"{field}[{i}] must be a string or a non-empty list of integer token ids",
                param=field,
            )
    return out


class TokenBudget:
    """The tokens one request's inputs may take in all (``MAX_POOLING_TOKENS``)."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int = MAX_POOLING_TOKENS) -> None:
        self.limit = limit
        self.left = limit

    def take(self, count: int, field: str) -> None:
        self.left -= count
        if self.left < 0:
            raise ValidationError(
                f"the inputs of this request come to more than {self.limit} tokens, the limit "
                "of one request",
                param=field,
            )


def _encode_many(tok: Tokenizer, texts: list[str], add_special: bool) -> list[list[int]]:
    """Several texts' ids at once, exactly as ``Tokenizer.encode`` gives each (tiktoken where
    it reproduces the tokenizer, else one batch call to ``tokenizers``)."""
    try:
        fast = tok.fast_bpe()
        if fast is not None:
            return [fast.encode(t, add_special) for t in texts]
        hf = tok.hf
        batch = getattr(hf, "encode_batch_fast", None) or hf.encode_batch
        return [e.ids for e in batch(texts, add_special_tokens=add_special)]
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise TokenizeError(str(exc)) from exc


def check_text_length(text: str, tok: Tokenizer, where: str, field: str) -> None:
    """Refuse, before tokenizing it, a text too long to fit the context whatever its tokens."""
    most = max_prompt_chars(tok)
    if most is not None and len(text) > most:
        raise ValidationError(
            f"{where} has {len(text)} characters: more tokens than this model's maximum context "
            f"length of {tok.max_model_len}",
            param=field,
        )


def _too_long(count: int, limit: int, field: str) -> ValidationError:
    return ValidationError(
        f"This model's maximum context length is {limit} tokens. However, your input contains "
        f"{count} tokens. Please reduce the length of the input.",
        param=field,
    )


def check_truncation(
    truncate: Any, max_len: int | None, field: str = "truncate_prompt_tokens"
) -> int | None:
    """``truncate_prompt_tokens`` (vLLM's: keep that many tokens; -1: as many as the context
    holds), checked: an integer of at least -1, at most the context length."""
    if truncate is None:
        return None
    if not _is_int(truncate) or truncate < -1:
        raise ValidationError(f"{field} must be an integer of at least -1", param=field)
    if max_len is not None and truncate > max_len:
        raise ValidationError(
            f"{field} ({truncate}) is greater than max_model_len ({max_len}). Please request a "
            "smaller truncation size.",
            param=field,
        )
    if truncate == -1:
        return max_len
    return truncate


def _trimmed(tok: Tokenizer, text: str, side: str) -> str:
    """A text that will be truncated, cut first to the characters its kept tokens can come
    from (vLLM trims the same way before it tokenizes)."""
    most = max_prompt_chars(tok)
    if most is None or len(text) <= most:
        return text
    return text[-most:] if side == "left" else text[:most]


def _encode_truncated(
    tok: Tokenizer, text: str, keep: int, side: str | None, add_special: bool
) -> list[int]:
    """A text's ids cut to ``keep``: by the tokenizer (its special tokens kept, the content
    cut on the right), as vLLM's tokenizer call truncates, or, when the request names the side,
    the whole encoding sliced on that side (vLLM's ``truncation_side``)."""
    hf = tok.hf
    text = _trimmed(tok, text, side or "right")
    try:
        if side is not None:
            ids = hf.encode(text, add_special_tokens=add_special).ids
            if len(ids) <= keep:
                return ids
            return ids[len(ids) - keep :] if side == "left" else ids[:keep]
        enc = hf.encode(text, add_special_tokens=False)
        specials = hf.num_special_tokens_to_add(False) if add_special else 0
        enc.truncate(max(keep - specials, 0))
        return hf.post_process(enc, None, add_special_tokens=add_special).ids[:keep]
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise TokenizeError(str(exc)) from exc


def tokenize_inputs(
    items: Sequence[Input],
    tok: Tokenizer,
    *,
    add_special: bool = True,
    truncate: int | None = None,
    side: str | None = None,
    max_len: int | None = None,
    budget: TokenBudget | None = None,
    field: str = "input",
) -> list[list[int]]:
    """Token ids of each input: texts encoded (with special tokens unless ``add_special`` is
    False), token-id inputs checked against the vocabulary; ``truncate`` keeps that many tokens
    (``side``: the end cut, None: the tokenizer's way, see ``_encode_truncated``); every input
    must fit ``max_len`` (the engine's context) after that, and all of them ``budget``."""
    budget = budget if budget is not None else TokenBudget()
    out: list[list[int] | None] = [None] * len(items)
    # Token-id inputs first: their tokens count against the budget before any text is tokenized.
    for i, item in enumerate(items):
        if isinstance(item, list):
            where = field if len(items) == 1 else f"{field}[{i}]"
            tok.validate_prompt_ids(item, field=where)
            ids = item
            if truncate is not None and len(ids) > truncate:
                ids = ids[len(ids) - truncate :] if side == "left" else ids[:truncate]
            budget.take(len(ids), field)
            out[i] = ids
    short: list[int] = []  # (texts tokenized together, a chunk at a time)
    for i, item in enumerate(items):
        if isinstance(item, list):
            continue
        if truncate is None and len(item) <= 2 * PIECE_CHARS:
            check_text_length(item, tok, "the input" if len(items) == 1 else f"{field}[{i}]", field)
            short.append(i)
            continue
        where = "the input" if len(items) == 1 else f"{field}[{i}]"
        if truncate is None:
            ids = encode_within(tok, item, add_special_tokens=add_special, where=where, field=field)
        else:
            ids = _encode_truncated(tok, item, truncate, side, add_special)
        budget.take(len(ids), field)
        out[i] = ids
    for start in range(0, len(short), _CHUNK):
        chunk = short[start : start + _CHUNK]
        encoded = _encode_many(tok, [items[i] for i in chunk], add_special)  # type: ignore[misc]
        for i, ids in zip(chunk, encoded):
            out[i] = ids
        budget.take(sum(map(len, encoded)), field)
    result: list[list[int]] = []
    for ids in out:
        assert ids is not None
        if not ids:
            raise ValidationError(f"{field} has an input with no tokens", param=field)
        if max_len is not None and len(ids) > max_len:
            raise _too_long(len(ids), max_len, field)
        result.append(ids)
    return result


# ---- score and rerank inputs ---------------------------------------------------------------------


@dataclass(frozen=True)
class ScoreData:
    """The two sides of a score request: ``queries`` (one, or one per document) and
    ``documents``."""

    queries: list[str]
    documents: list[str]

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """Each document with its query (one query serves every document)."""
        qs = self.queries * len(self.documents) if len(self.queries) == 1 else self.queries
        return list(zip(qs, self.documents))


def _score_texts(value: Any, field: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    out = []
    for i, item in enumerate(items):
        where = field if not isinstance(value, list) else f"{field}[{i}]"
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Mapping) and "content" in item:
            parts = item["content"]
            texts = (
                [p.get("text") for p in parts if isinstance(p, Mapping)]
                if isinstance(parts, list)
                else None
            )
            if (
                not texts
                or len(texts) != len(parts)
                or any(p.get("type") != "text" for p in parts)
                or not all(isinstance(t, str) for t in texts)
            ):
                raise ValidationError(
                    f"{where}: multimodal score inputs are not supported by this model (give "
                    "text, or content parts of type text)",
                    param=field,
                )
            out.append("".join(texts))  # (text parts joined with no separator, as vLLM's)
        else:
            raise ValidationError(f"{where} must be a string", param=field)
    return out


def score_inputs(first: Any, second: Any, fields: tuple[str, str]) -> ScoreData:
    """The queries and documents of a score or rerank request (each a string or a list of them;
    content-part objects of text are read as their text), paired 1:1, 1:N or N:N (vLLM's
    rule), the pairs counted against ``MAX_POOLING_INPUTS``."""
    queries = _score_texts(first, fields[0])
    docs = _score_texts(second, fields[1])
    if not queries:
        raise ValidationError(f"At least one {fields[0]} element must be given", param=fields[0])
    if not docs:
        raise ValidationError(f"At least one {fields[1]} element must be given", param=fields[1])
    if len(queries) > 1 and len(queries) != len(docs):
        raise ValidationError(
            f"{fields[0]} and {fields[1]} must be 1:1, 1:N or N:N, got {len(queries)}:{len(docs)}",
            param=fields[0],
        )
    _check_count(len(docs), fields[1])
    return ScoreData(queries, docs)


def truncate_text_to_tokens(tok: Tokenizer, text: str, max_tokens: int) -> str:
    """``text`` cut to its first ``max_tokens`` tokens, at a character boundary the tokenizer's
    offsets give (vLLM's ``max_tokens_per_query`` / ``max_tokens_per_doc``), repeated until the
    cut text tokenizes within the limit."""
    if max_tokens <= 0:
        return ""
    text = _trimmed(tok, text, "right")
    while text:
        enc = tok.hf.encode(text, add_special_tokens=False)
        if len(enc.ids) <= max_tokens:
            break
        end = min(enc.offsets[max_tokens - 1][1], enc.offsets[max_tokens][0])
        text = text[: min(end, len(text) - 1)]
    return text


#: Tokenizer classes whose Hugging Face encodings carry no ``token_type_ids``.
_NO_TYPE_IDS = (
    "Qwen2Tokenizer",
    "LlamaTokenizer",
    "GPT2Tokenizer",
    "GemmaTokenizer",
    "RobertaTokenizer",
    "XLMRobertaTokenizer",
    "CodeGenTokenizer",
)


def returns_type_ids(tok: Tokenizer) -> bool:
    """Whether the model's tokenizer gives ``token_type_ids`` with its encodings, as Hugging
    Face's does (its ``model_input_names``; BERT's do, most decoder models' do not)."""
    names = tok.config.get("model_input_names")
    if isinstance(names, list):
        return "token_type_ids" in names
    cls = str(tok.config.get("tokenizer_class") or "")
    return not cls.removesuffix("Fast").startswith(_NO_TYPE_IDS)


@dataclass(frozen=True)
class PairTemplate:
    """How a cross-encoder's query and document become one input: the tokenizer's pair encoding
    (``use_sep_token``: ``[CLS] q [SEP] d [SEP]``, token types 0 then 1), the two texts one after
    the other (an LLM as reranker), or a score template (``render``: ``--chat-template`` given
    the messages ``query`` and ``document``), tokenized with the tokenizer's special tokens."""

    use_sep_token: bool = True
    type_ids: bool = True
    render: Callable[[str, str], str] | None = None


def _longest_first(n1: int, n2: int, max_length: int) -> tuple[int, int]:
    """The lengths the Hugging Face tokenizer's ``longest_first`` truncation keeps of a pair."""
    swap = n1 > n2
    if swap:
        n1, n2 = n2, n1
    n2 = n1 if n1 > max_length else max(n1, max_length - n1)
    if n1 + n2 > max_length:
        n1 = max_length // 2
        n2 = n1 + max_length % 2
    return (n2, n1) if swap else (n1, n2)


def encode_pair(
    tok: Tokenizer,
    query: str,
    doc: str,
    template: PairTemplate,
    *,
    truncate: int | None = None,
    max_len: int | None = None,
    max_tokens_per_doc: int = 0,
    field: str = "documents",
) -> tuple[list[int], int | None]:
    """One query-document pair's token ids, and where its second half starts by token type
    (vLLM's ``compressed_token_type_ids``; None when the encoding has no token types), as vLLM's
    cross-encoder builds them: truncated to ``truncate`` tokens (``longest_first``) or, with
    ``max_tokens_per_doc``, the document alone; within ``max_len``."""
    hf = tok.hf
    query, doc = _trimmed(tok, query, "right"), _trimmed(tok, doc, "right")
    try:
        if template.render is not None:
            ids = hf.encode(template.render(query, doc), add_special_tokens=True).ids
            types = None
        elif not template.use_sep_token:
            ids = hf.encode(query + doc, add_special_tokens=True).ids
            types = None
        else:
            a = hf.encode(query, add_special_tokens=False)
            b = hf.encode(doc, add_special_tokens=False)
            specials = hf.num_special_tokens_to_add(True)
            limit = truncate
            if max_tokens_per_doc > 0:
                doc_limit = len(a.ids) + max_tokens_per_doc + specials
                limit = doc_limit if limit is None else min(limit, doc_limit)
                keep = max(limit - specials - len(a.ids), 0)
                if len(b.ids) > keep:
                    b.truncate(keep)
            elif limit is not None and len(a.ids) + len(b.ids) + specials > limit:
                n1, n2 = _longest_first(len(a.ids), len(b.ids), max(limit - specials, 0))
                a.truncate(n1)
                b.truncate(n2)
            enc = hf.post_process(a, b, add_special_tokens=True)
            ids, types = enc.ids, enc.type_ids
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise TokenizeError(str(exc)) from exc
    if truncate is not None and len(ids) > truncate:  # (vLLM's slice after tokenizing)
        ids = ids[:truncate]
        types = types[:truncate] if types is not None else None
    if max_len is not None and len(ids) > max_len:
        raise _too_long(len(ids), max_len, field)
    if types is None or not template.type_ids:
        return ids, None
    first_one = next((i for i, t in enumerate(types) if t == 1), len(types))
    if any(t != 1 for t in types[first_one:]) or any(t > 1 for t in types):
        raise ValidationError(
            "the tokenizer's pair encoding has token types other than zeros then ones",
            param=field,
        )
    return ids, first_one
