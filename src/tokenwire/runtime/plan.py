"""``Plan``: what one HTTP request asks the engine for, whatever its API: prompts as token ids,
one normalized, verified ``SamplingParams``, and how the answer is to be shaped."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tokenwire.engine import LoraAdapter
from tokenwire.messages.sampling import SamplingParams
from tokenwire.multimodal import MediaItem, MMFeature
from tokenwire.parsers.output import OutputSpec

__all__ = ["Plan"]


@dataclass
class Plan:
    """What one HTTP request asks the engine for."""

    route: str  # "completion" | "chat" | "generate"
    prompts: list[list[int]]
    params: SamplingParams
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    model: str = ""
    rids: list[str] | None = None  # /generate: the client's request ids
    batch: bool = False  # /generate: the input was a list
    #: Scheduling priority for the engine (vLLM's: lower is sooner).
    priority: int = 0
    #: ``stream_options.continuous_usage_stats`` (with ``include_usage``): usage in every chunk.
    continuous_usage: bool = False
    #: vLLM's ``return_tokens_as_token_ids``: logprob tokens as ``"token_id:{id}"``.
    return_tokens_as_token_ids: bool = False
    #: Completions ``echo``: each prompt's text, given back before its output.
    echo: list[str] | None = None
    #: ``/generate`` ``return_logprob``: ``(logprob_start_len, top_logprobs_num,
    #: return_text_in_logprobs)``.
    sglang_logprobs: tuple[int, int, bool] | None = None
    #: ``/generate`` ``token_ids_logprob``: the engine's logprob columns are those ids'.
    sglang_logprobs_by_ids: bool = False
    #: vLLM's ``prompt_logprobs`` was asked for (the response carries them).
    prompt_logprobs: bool = False
    #: Chat: how outputs are parsed (reasoning, tool calls), None for plain text.
    output: OutputSpec | None = None
    #: Chat: ``parallel_tool_calls: false`` keeps only the first call.
    parallel_tool_calls: bool = True
    #: Chat: the message/delta keys the reasoning text goes under (none: it is dropped).
    reasoning_fields: tuple[str, ...] = ("reasoning",)
    #: The request field the grammar in ``params`` comes from (its refusal names it); None:
    #: ``/generate``'s, named as ``SamplingParams`` names them.
    grammar_field: str | None = None
    #: Chat (SGLang's ``stream_reasoning``): stream the thinking as it comes, else in one piece
    #: when it ends.
    stream_reasoning: bool = True
    #: vLLM's ``return_token_ids``: each choice's output ids (and, completions, its prompt's).
    return_token_ids: bool = False
    #: Chat: the prompt's ids at the top of the response (SGLang's ``return_prompt_token_ids``).
    return_prompt_token_ids: bool = False
    #: Chat (vLLM's ``return_prompt_text``): the rendered prompt, returned.
    prompt_text: str | None = None
    #: ``usage.prompt_tokens_details`` even with no cached tokens (SGLang's
    #: ``return_cached_tokens_details``, vLLM's ``--enable-prompt-tokens-details``).
    cached_details: bool = False
    #: What only some engines honour (``EngineRequest``'s fields of the same names).
    cache_salt: str | None = None
    lora: LoraAdapter | None = None
    data_parallel_rank: int | None = None
    session_id: str | None = None
    #: vLLM's beam search: ``(beam width, length penalty)``; the search runs in the frontend
    #: (``server/openai/beam.py``), so ``Runtime.submit`` submits nothing for the plan itself.
    beam: tuple[int, float] | None = None
    #: Media items, one list per prompt (None: text only), the request's ``mm_processor_kwargs``
    #: and ``media_io_kwargs``, and, once processed (``Runtime.prepare_media``), each prompt's
    #: features (its ids then have the placeholders expanded).
    media: list[list[MediaItem]] | None = None
    media_options: dict[str, Any] = field(default_factory=dict)
    mm_features: list[list[MMFeature]] | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of the request: each prompt counted once, whatever ``n`` (as OpenAI and
        vLLM count them)."""
        return sum(len(p) for p in self.prompts)
