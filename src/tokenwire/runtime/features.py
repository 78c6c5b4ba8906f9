"""``Features``: the server's options about model output (vLLM's names): which reasoning and
tool-call parsers read it, where the thinking text goes, chat templates, logprob bounds, and
whether the engine constrains decoding."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenwire.chat import CONTENT_FORMATS
from tokenwire.generation_config import GenerationDefaults
from tokenwire.multimodal import MediaLimits, ModelMedia
from tokenwire.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from tokenwire.parsers.names import resolve_reasoning_parser, resolve_tool_parser

__all__ = ["DEFAULT_FEATURES", "REASONING_FIELDS", "STRICT_LEVELS", "Features"]

#: ``--tool-strict-level`` choices (vLLM's names; SGLang's ``SGLANG_TOOL_STRICT_LEVEL`` 0, 1, 2):
#: ``auto`` constrains a ``tool_choice: auto`` call's arguments for the tools marked ``strict``,
#: ``function`` constrains every call to the request's functions, ``parameter`` also pins every
#: tool's arguments to its schema; ``off`` (vLLM's ``VLLM_ENFORCE_STRICT_TOOL_CALLING=0``)
#: constrains none.
STRICT_LEVELS = ("auto", "function", "parameter", "off")

#: ``--reasoning-field`` choices: vLLM's current field, SGLang's/DeepSeek's, or both.
REASONING_FIELDS = ("reasoning", "reasoning_content", "both")


@dataclass(frozen=True)
class Features:
    """Server options about model output (``tokenwire serve`` flags, vLLM's names)."""

    #: ``--reasoning-parser``: a name in ``REASONING_PARSERS`` (a peer's alias of one is taken
    #: as that name).
    reasoning_parser: str | None = None
    #: ``--reasoning-field``: where the thinking text goes in messages and deltas.
    reasoning_field: str = "reasoning"
    #: ``--tool-call-parser``: a name in ``TOOL_CALL_PARSERS`` (or a peer's alias of one).
    tool_call_parser: str | None = None
    #: ``--enable-auto-tool-choice``: parse the model's own tool calls (``tool_choice: auto``).
    enable_auto_tool_choice: bool = False
    #: ``--max-logprobs``: most top logprobs a request may ask for per token (vLLM's 20).
    max_logprobs: int = 20
    #: Whether the engine constrains decoding (JSON schema, regex, grammar).
    structured_outputs: bool = False
    #: The request fields only some engines honour that this one does (``REQUEST_FIELDS``).
    engine_fields: frozenset[str] = frozenset()
    #: The served model's multimodal side (None: text only) and the items a prompt may carry.
    media: ModelMedia | None = None
    media_limits: MediaLimits | None = None
    #: ``--chat-template``: replaces the tokenizer's template (the template text).
    chat_template: str | None = None
    #: ``--chat-template-content-format``: ``auto``, ``string`` or ``openai``.
    chat_template_content_format: str = "auto"
    #: ``--trust-request-chat-template``: a request's own ``chat_template`` is used.
    trust_request_chat_template: bool = False
    #: ``--generation-config`` / ``--override-generation-config``: sampling defaults for requests
    #: that omit a field (the model's ``generation_config.json``).
    generation_defaults: GenerationDefaults = field(default_factory=GenerationDefaults)
    #: ``--enable-prompt-tokens-details``: usage always carries
    #: ``prompt_tokens_details.cached_tokens`` (otherwise only when the engine reports some).
    prompt_tokens_details: bool = False
    #: ``--default-chat-template-kwargs``: chat template arguments a request's own override.
    default_chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: ``--return-tokens-as-token-ids``: logprob tokens as ``token_id:N`` unless a request's
    #: ``return_tokens_as_token_ids`` says otherwise (vLLM's flag).
    return_tokens_as_token_ids: bool = False
    #: The checkpoint's ``response_template`` (a ``ResponseTemplate``), which the ``hf``
    #: parsers read.
    response_template: Any = None
    #: ``--tool-strict-level``: how a strict function tool constrains a ``tool_choice: auto``
    #: call (``STRICT_LEVELS``).
    tool_strict_level: str = "auto"

    def __post_init__(self) -> None:
        if self.reasoning_parser is not None:
            name = resolve_reasoning_parser(self.reasoning_parser)
            if name is None:
                raise ValueError(
                    f"reasoning parser must be one of {', '.join(REASONING_PARSERS)} (or a "
                    f"peer's name for one), got {self.reasoning_parser!r}"
                )
            object.__setattr__(self, "reasoning_parser", name)
        if self.tool_call_parser is not None:
            name = resolve_tool_parser(self.tool_call_parser)
            if name is None:
                raise ValueError(
                    f"tool-call parser must be one of {', '.join(TOOL_CALL_PARSERS)} (or a "
                    f"peer's name for one), got {self.tool_call_parser!r}"
                )
            object.__setattr__(self, "tool_call_parser", name)
        if self.tool_strict_level not in STRICT_LEVELS:
            raise ValueError(f"tool strict level must be one of {', '.join(STRICT_LEVELS)}")
        if self.reasoning_field not in REASONING_FIELDS:
            raise ValueError(f"reasoning field must be one of {', '.join(REASONING_FIELDS)}")
        if self.max_logprobs < 0:
            raise ValueError("max logprobs must be at least 0")
        if self.chat_template_content_format not in CONTENT_FORMATS:
            raise ValueError(f"chat template content format must be one of {CONTENT_FORMATS}")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")

    def reasoning_fields(self) -> tuple[str, ...]:
        """The message/delta keys the thinking text goes under."""
        if self.reasoning_field == "both":
            return ("reasoning", "reasoning_content")
        return (self.reasoning_field,)


DEFAULT_FEATURES = Features()
