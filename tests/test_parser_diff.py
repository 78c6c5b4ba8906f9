"""The parser corpus (``parser_corpus.py``): every reasoning and tool-call format's outputs give
what their model meant, whatever the split, and what the peers' parsers of the same format give
(vLLM 0.32's, and SGLang 0.5.23's own function-call and reasoning parsers), except where the
case is named below with the reason tokenwire's answer is the right one (docs/parsers.md,
"Why they differ").

Each output is parsed whole, then streamed: one token a piece, at random byte offsets, and in
chunks of several tokens (those byte offsets moved to the next token boundary). Each peer gets
the whole output (its non-streamed chat completion) and the token chunkings, as its streamed
chat completion does; tokenwire's pieces are the text its detokenizer gives. Each peer runs in
one subprocess of its own environment (``vllm_parser_runner.py`` under the vLLM CPU
environment's python, ``sglang_parser_runner.py`` under the parser peers' environment's); without
those environments these tests skip, as the other real-vLLM tests do.
"""

from __future__ import annotations

from typing import Any

import pytest

from parser_corpus import CASES, MARKERS, MISTRAL_V3_MARKERS, Case
from parser_diff import (
    SGLANG_REASONING_NAMES,
    SGLANG_TOOL_NAMES,
    Result,
    byte_splits,
    case_tokenizer,
    marker_tokenizer,
    run_sglang,
    run_vllm,
    sglang_job,
    token_chunkings,
    token_pieces,
    tokenwire_parse,
    vllm_job,
    vllm_result,
    write_marker_tokenizer,
)
from vllm_helpers import peers_env, vllm_env

from conftest import real_tokenizer, tokenizer_dir

CASE_PARAMS = [pytest.param(c, id=c.id) for c in CASES]


def _expected(case: Case) -> tuple[str, str, list[tuple[str, Any]]]:
    return case.reasoning_out.strip(), case.content_out.strip(), list(case.calls_out)


def _got(case: Case, result: Result) -> tuple[str, str, list[tuple[str, Any]]]:
    """The result as the case states its answer (a truncated call's arguments unchecked)."""
    reasoning, content, calls = result.normal()
    wanted = dict(enumerate(case.calls_out))
    calls = [
        (name, None if wanted.get(k, ("", 0))[1] is None else args)
        for k, (name, args) in enumerate(calls)
    ]
    return reasoning, content, calls


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_corpus_output(case: Case) -> None:
    """The whole output gives what the model meant; every split of it gives the same."""
    whole = tokenwire_parse(case, [case.text])
    assert _got(case, whole) == _expected(case)
    ids, pieces = token_pieces(case_tokenizer(case, real_tokenizer), case.text)
    splits = [pieces, *byte_splits(case.id, case.text)]
    splits += [
        [text for text, _ in chunks]
        for chunks in token_chunkings(case.id, case.text, ids, pieces)[1:]
    ]
    for split in splits:
        assert tokenwire_parse(case, split) == whole


def test_markers_are_single_tokens() -> None:
    """The corpus tokenizer has each family's markers as one token, as their models do."""
    tok = marker_tokenizer("markers")
    for marker in MARKERS:
        assert len(tok.encode(marker, add_special_tokens=False)) == 1, marker
    assert len(marker_tokenizer("mistral_v3").encode("[ARGS]", add_special_tokens=False)) > 1


# ---- against the peers: vLLM and SGLang ---------------------------------------------------------

#: Why tokenwire's answer differs from a peer's, by reason (docs/parsers.md says more of each and
#: lists the cases).
REASONS = {
    "marker-in-string": "the peer ends the call at a marker written inside a string argument",
    "cut-call-whole": "the peer's non-streamed parse (or its stream) drops, or returns as "
    "content, a call the token limit cut",
    "cut-call-arguments": "the peer's stream leaves a cut call's arguments no JSON",
    "cut-call-closed": "the peer closes a cut call's partial JSON into an object; tokenwire "
    "passes on what the model wrote",
    "cut-param-empty": "the peer adds the parameter the token limit cut as an empty string",
    "grouped-deltas": "the peer loses or garbles text when a delta holds several tokens",
    "held-prefix": "the peer's stream holds back the start of a possible tag and never sends it",
    "marker-first-stream": "the peer's stream reads calls only when the output opens with them",
    "no-streaming": "the peer's phi4_mini_json parser sends nothing when streaming",
    "list-regex": "the peer's phi4_mini_json regex ends the call list at the first ]",
    "partial-json-stream": "the peer streams arguments as diffs of re-serialized partial JSON: "
    "garbled, doubled or empty",
    "untyped-values": "the peer leaves object, array and null values as strings",
    "nullable-string": "the peer keeps null as the text 'null' (or a boolean as 'true') for a "
    "parameter its schema lets be a string",
    "functiongemma-values": "the peer's functiongemma parser reads only <escape>d values",
    "cut-block": "a block read whole at its end stays content in tokenwire when the output "
    "never closes it; the peer sends a cut call or drops it",
    "olmo3-calls": "the peer's olmo3 parser drops the text before calls, and its stream finds none",
    "lost-text": "the peer's stream drops text that looks like the start of a call",
    "lost-call": "the peer's parse loses a call (one with no arguments, after another)",
    "dsml-without-block": "the peer takes an invoke outside its calls block as a call",
    "function-without-block": "the peer takes a <function= outside a <tool_call> block as a call",
    "granite-reasoning": "the peer's granite reasoning stream leaks the opening phrase and keeps "
    "the answer's calls in content",
    "unclosed-thinking": "the peer's non-streamed parse makes thinking the output never closed "
    "content",
    "hunyuan-token-ids": "the peer's hunyuan_a13b reasoning stream matches Hunyuan's own token ids",
    "think-tag-kept": "the peer keeps an opening thinking tag in the reasoning",
    "response-tags": "the peer leaves the answer's wrapper tags (<response>, Cohere's "
    "<|START_RESPONSE|>, Kimi K3's response channel, Inkling's <|end_message|>) in the content",
    "leading-space": "the peer's pythonic and llama3_json parsers miss calls after a newline",
    "empty-arguments": "the peer gives a call written with no arguments the empty text, not {}",
    "special-token-in-string": "the peer drops a special token written inside a string argument",
    "markup-in-value": "the peer drops an argument whose value holds the format's own tags",
    "thinking-assumed": "the peer takes an output with no thinking tag for thinking (it assumes "
    "the template opened it); tokenwire reads the prompt",
    "minicpm5-content": "the peer's minicpm5 parse drops the text before the calls, and its "
    "stream leaves the calls' markup in the content",
    "muse-commentary": "the peer's muse_glimmer parser drops to=commentary messages and an "
    "answer outside messages",
    "prompt-prefix": "the peer's non-streamed hf parse does not read the thinking the prompt "
    "opened",
    "interns1-format": "the peer's interns1 parser reads Intern-S1's '<|action_start|> "
    "<|plugin|>' (with a space) only, not InternLM2's",
    "mistral-json-list": "the peer's mistral parser reads only tokenizer v11's name[ARGS] calls, "
    "not the JSON list of older Mistral tokenizers",
    "cohere-response": "the peer's cohere reasoning drops the <|START_RESPONSE|> answer",
}

W, T, G = "whole", "tokens", "grouped"
#: The cases where tokenwire and vLLM differ: in which runs (the whole output; streamed a token
#: at a time; streamed in several-token chunks), and why.
DIFFERENCES: dict[str, tuple[tuple[str, ...], str]] = {
    "tool/hermes/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/hermes/truncated": ((W,), "cut-call-whole"),
    "tool/hermes/near-miss": ((T, G), "held-prefix"),
    "tool/longcat/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/longcat/truncated": ((W,), "cut-call-whole"),
    "tool/longcat/near-miss": ((T, G), "held-prefix"),
    "tool/qwen3_coder/truncated": ((T, G), "cut-call-arguments"),
    "tool/qwen3_xml/truncated": ((T, G), "cut-call-arguments"),
    "tool/seed_oss/truncated": ((W, T, G), "cut-call-arguments"),
    "tool/deepseek_v3/several-calls": ((G,), "grouped-deltas"),
    "tool/deepseek_v3/nested-unicode": ((G,), "grouped-deltas"),
    "tool/deepseek_v3/markup-in-string": ((T, G), "marker-in-string"),
    "tool/deepseek_v3/truncated": ((W,), "cut-call-whole"),
    "tool/deepseek_v3/after-reasoning": ((G,), "grouped-deltas"),
    "tool/deepseek_v31/several-calls": ((G,), "grouped-deltas"),
    "tool/deepseek_v31/nested-unicode": ((G,), "grouped-deltas"),
    "tool/deepseek_v31/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/deepseek_v31/truncated": ((W,), "cut-call-whole"),
    "tool/deepseek_v31/after-reasoning": ((G,), "grouped-deltas"),
    "tool/deepseek_v32/near-miss": ((W, T, G), "dsml-without-block"),
    "tool/deepseek_v32/after-reasoning": ((G,), "grouped-deltas"),
    "tool/step3/several-calls": ((T,), "partial-json-stream"),
    "tool/step3/nested-unicode": ((W, T, G), "untyped-values"),
    "tool/step3/markup-in-string": ((W, T, G), "untyped-values"),
    "tool/step3/truncated": ((W, T, G), "cut-call-whole"),
    "tool/step3/after-reasoning": ((G,), "partial-json-stream"),
    "tool/granite/after-reasoning": ((T, G), "granite-reasoning"),
    "tool/granite-20b-fc/several-calls": ((T, G), "marker-first-stream"),
    "tool/granite-20b-fc/nested-unicode": ((T, G), "marker-first-stream"),
    "tool/granite-20b-fc/markup-in-string": ((W,), "marker-in-string"),
    "tool/granite-20b-fc/truncated": ((W, T, G), "cut-call-whole"),
    "tool/granite-20b-fc/after-reasoning": ((T, G), "granite-reasoning"),
    "tool/internlm/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/internlm/truncated": ((W, T, G), "cut-call-whole"),
    "tool/internlm/near-miss": ((T, G), "lost-text"),
    "tool/jamba/several-calls": ((T, G), "partial-json-stream"),
    "tool/jamba/nested-unicode": ((T, G), "partial-json-stream"),
    "tool/jamba/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/jamba/truncated": ((W, T, G), "cut-call-whole"),
    "tool/jamba/after-reasoning": ((T, G), "partial-json-stream"),
    "tool/hunyuan_a13b/several-calls": ((T, G), "marker-first-stream"),
    "tool/hunyuan_a13b/nested-unicode": ((T, G), "marker-first-stream"),
    "tool/hunyuan_a13b/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/hunyuan_a13b/truncated": ((W, T, G), "cut-call-whole"),
    "tool/hunyuan_a13b/after-reasoning": ((T, G), "hunyuan-token-ids"),
    "tool/phi4_mini_json/several-calls": ((T, G), "no-streaming"),
    "tool/phi4_mini_json/nested-unicode": ((W, T, G), "list-regex"),
    "tool/phi4_mini_json/markup-in-string": ((W, T, G), "list-regex"),
    "tool/phi4_mini_json/truncated": ((W, T, G), "cut-call-whole"),
    "tool/phi4_mini_json/near-miss": ((T, G), "no-streaming"),
    "tool/phi4_mini_json/plain": ((T, G), "no-streaming"),
    "tool/phi4_mini_json/after-reasoning": ((T, G), "no-streaming"),
    "tool/xlam/several-calls": ((G,), "partial-json-stream"),
    "tool/xlam/nested-unicode": ((T, G), "partial-json-stream"),
    "tool/xlam/markup-in-string": ((T, G), "partial-json-stream"),
    "tool/xlam/truncated": ((W, T, G), "cut-call-whole"),
    "tool/xlam/after-reasoning": ((T, G), "partial-json-stream"),
    "tool/xlam/fenced": ((T, G), "partial-json-stream"),
    "tool/xlam/tool-calls-tag": ((G,), "partial-json-stream"),
    "tool/gigachat3/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/gigachat3/truncated": ((W,), "cut-call-whole"),
    "tool/functiongemma/several-calls": ((W, T, G), "functiongemma-values"),
    "tool/functiongemma/nested-unicode": ((W, T, G), "functiongemma-values"),
    "tool/functiongemma/markup-in-string": ((W, T, G), "functiongemma-values"),
    "tool/functiongemma/truncated": ((W, T, G), "cut-block"),
    "tool/functiongemma/after-reasoning": ((W, T, G), "functiongemma-values"),
    "tool/olmo3/several-calls": ((W, T, G), "olmo3-calls"),
    "tool/olmo3/nested-unicode": ((W, T, G), "olmo3-calls"),
    "tool/olmo3/markup-in-string": ((W, T), "marker-in-string"),
    "tool/olmo3/after-reasoning": ((W, T, G), "olmo3-calls"),
    "tool/llama3_json/several-calls": ((T, G), "partial-json-stream"),
    "tool/llama3_json/truncated": ((W, T, G), "cut-call-whole"),
    "tool/llama3_json/after-reasoning": ((T, G), "leading-space"),
    "tool/pythonic/markup-in-string": ((T,), "partial-json-stream"),
    "tool/pythonic/truncated": ((T, G), "cut-block"),
    "tool/pythonic/near-miss": ((T, G), "lost-text"),
    "tool/pythonic/after-reasoning": ((W, T, G), "leading-space"),
    "tool/mistral/markup-in-string": ((W, T, G), "marker-in-string"),
    "reasoning/deepseek_r1/markup-in-text": ((G,), "grouped-deltas"),
    "reasoning/granite/think-answer": ((T, G), "granite-reasoning"),
    "reasoning/granite/truncated": ((W, T, G), "granite-reasoning"),
    "reasoning/granite/markup-in-text": ((T, G), "granite-reasoning"),
    "reasoning/hunyuan_a13b/think-answer": ((T, G), "hunyuan-token-ids"),
    "reasoning/hunyuan_a13b/truncated": ((W, T, G), "hunyuan-token-ids"),
    "reasoning/hunyuan_a13b/no-thinking": ((G,), "hunyuan-token-ids"),
    "reasoning/hunyuan_a13b/markup-in-text": ((T, G), "hunyuan-token-ids"),
    "reasoning/step3/think-answer": ((W, T, G), "think-tag-kept"),
    "reasoning/step3/truncated": ((W, T, G), "think-tag-kept"),
    "reasoning/step3/markup-in-text": ((W, T, G), "think-tag-kept"),
    "reasoning/ernie45/think-answer": ((T, G), "response-tags"),
    "reasoning/ernie45/prompt-opened": ((T, G), "response-tags"),
    "reasoning/ernie45/no-start-tag": ((T, G), "response-tags"),
    "reasoning/ernie45/markup-in-text": ((T, G), "response-tags"),
    "reasoning/olmo3/truncated": ((W,), "unclosed-thinking"),
    # the newer families
    "tool/muse_glimmer/several-calls": ((W, T, G), "muse-commentary"),
    "tool/muse_glimmer/nested-unicode": ((W, T, G), "muse-commentary"),
    "tool/muse_glimmer/truncated": ((W, T, G), "cut-call-whole"),
    "tool/muse_glimmer/near-miss": ((T, G), "muse-commentary"),
    "tool/muse_glimmer/plain": ((T, G), "muse-commentary"),
    "tool/muse_glimmer/after-reasoning": ((W, T, G), "muse-commentary"),
    "tool/hf/truncated": ((W, T, G), "cut-block"),
    "tool/qwen3_json/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/qwen3_json/truncated": ((W,), "cut-call-whole"),
    "tool/qwen3_json/near-miss": ((T, G), "held-prefix"),
    "tool/granite4/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/granite4/truncated": ((W, T, G), "cut-call-whole"),
    "tool/granite4/near-miss": ((T, G), "held-prefix"),
    "tool/ernie45/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/ernie45/truncated": ((W, T, G), "cut-call-whole"),
    "tool/ernie45/after-reasoning": ((G,), "grouped-deltas"),
    "tool/llama4_json/several-calls": ((T, G), "partial-json-stream"),
    "tool/llama4_json/truncated": ((W, T, G), "cut-call-whole"),
    "tool/llama4_json/after-reasoning": ((T, G), "leading-space"),
    "tool/llama4_pythonic/markup-in-string": ((T,), "partial-json-stream"),
    "tool/llama4_pythonic/truncated": ((T, G), "cut-block"),
    "tool/llama4_pythonic/near-miss": ((T, G), "lost-text"),
    "tool/llama4_pythonic/after-reasoning": ((W, T, G), "leading-space"),
    "tool/apertus/several-calls": ((G,), "grouped-deltas"),
    "tool/apertus/nested-unicode": ((G,), "grouped-deltas"),
    "tool/apertus/markup-in-string": ((T, G), "marker-in-string"),
    "tool/apertus/truncated": ((W, T, G), "cut-call-closed"),
    "tool/cohere_command3/several-calls": ((W, T, G), "empty-arguments"),
    "tool/cohere_command3/markup-in-string": ((W, T, G), "special-token-in-string"),
    "tool/cohere_command4/several-calls": ((W, T, G), "empty-arguments"),
    "tool/cohere_command4/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/cohere_command4/near-miss": ((W, T, G), "thinking-assumed"),
    "tool/cohere_command4/plain": ((W, T, G), "thinking-assumed"),
    "tool/inkling/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/step3p5/truncated": ((T, G), "cut-call-arguments"),
    "tool/mimo/truncated": ((T, G), "cut-call-arguments"),
    "tool/mimo/near-miss": ((W, T, G), "function-without-block"),
    "tool/poolside_v1/truncated": ((W, T, G), "cut-call-whole"),
    "tool/poolside_v1/after-reasoning": ((G,), "grouped-deltas"),
    "tool/hy_v3/markup-in-string": ((W, T, G), "untyped-values"),
    "tool/hy_v3/truncated": ((T, G), "cut-call-arguments"),
    "tool/hy_v3/near-miss": ((W, T, G), "lost-text"),
    "tool/hy_v3/after-reasoning": ((G,), "grouped-deltas"),
    "tool/hy_v4/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/hy_v4/truncated": ((W, T, G), "cut-call-whole"),
    "tool/hy_v4/after-reasoning": ((G,), "grouped-deltas"),
    "tool/k2_horizon/truncated": ((W, T, G), "cut-call-whole"),
    "tool/dots/truncated": ((W, T, G), "cut-call-whole"),
    "tool/dots/near-miss": ((T, G), "held-prefix"),
    "tool/minicpm5/several-calls": ((W, T), "minicpm5-content"),
    "tool/minicpm5/nested-unicode": ((W, T), "minicpm5-content"),
    "tool/minicpm5/markup-in-string": ((W, T, G), "markup-in-value"),
    "tool/minicpm5/truncated": ((W, T, G), "cut-call-whole"),
    "tool/minicpm5/near-miss": ((T, G), "lost-text"),
    "tool/minicpm5/after-reasoning": ((W, T), "minicpm5-content"),
    "tool/deepseek_v4/near-miss": ((W, T, G), "dsml-without-block"),
    "tool/deepseek_v41/near-miss": ((W, T, G), "dsml-without-block"),
    "tool/kimi_k3/truncated": ((W, T, G), "cut-call-whole"),
    "tool/kimi_k3/after-reasoning": ((W, T, G), "response-tags"),
    "tool/gemma4/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/gemma4/truncated": ((W, T, G), "cut-block"),
    "tool/lfm2/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/lfm2/truncated": ((T, G), "cut-block"),
    "tool/minimax_m3/markup-in-string": ((W, T, G), "markup-in-value"),
    "tool/minimax_m3/truncated": ((W, T, G), "cut-block"),
    "reasoning/hf/prompt-opened": ((W,), "prompt-prefix"),
    "reasoning/muse_glimmer/no-thinking": ((T, G), "muse-commentary"),
    "reasoning/hy_v3/think-answer": ((G,), "grouped-deltas"),
    "reasoning/hy_v3/markup-in-text": ((G,), "grouped-deltas"),
    "reasoning/hy_v4/think-answer": ((G,), "grouped-deltas"),
    "reasoning/hy_v4/no-thinking": ((W, T, G), "thinking-assumed"),
    "reasoning/holo2/think-answer": ((G,), "grouped-deltas"),
    "reasoning/holo2/markup-in-text": ((G,), "grouped-deltas"),
    "reasoning/poolside_v1/think-answer": ((G,), "grouped-deltas"),
    "reasoning/poolside_v1/markup-in-text": ((G,), "grouped-deltas"),
    "reasoning/cohere_command4/no-thinking": ((W, T, G), "thinking-assumed"),
    "reasoning/inkling/think-answer": ((T, G), "response-tags"),
    "reasoning/inkling/markup-in-text": ((T, G), "response-tags"),
    "reasoning/k2_horizon/truncated": ((W,), "unclosed-thinking"),
    "reasoning/plamo3/no-thinking": ((W, T, G), "thinking-assumed"),
}

#: The cases where tokenwire and SGLang 0.5.23 differ.
SGLANG_DIFFERENCES: dict[str, tuple[tuple[str, ...], str]] = {
    "tool/hermes/several-calls": ((G,), "grouped-deltas"),
    "tool/hermes/markup-in-string": ((W, G), "marker-in-string"),
    "tool/hermes/truncated": ((W, T, G), "cut-call-whole"),
    "tool/hermes/near-miss": ((T, G), "lost-text"),
    "tool/qwen3_coder/truncated": ((W, T, G), "cut-param-empty"),
    "tool/qwen3_xml/truncated": ((W, T, G), "cut-param-empty"),
    "tool/qwen3_xml/near-miss": ((T, G), "held-prefix"),
    "tool/glm45/several-calls": ((G,), "grouped-deltas"),
    "tool/glm45/nested-unicode": ((G,), "grouped-deltas"),
    "tool/glm45/markup-in-string": ((W, T, G), "nullable-string"),
    "tool/glm45/truncated": ((W, T, G), "cut-call-whole"),
    "tool/glm45/after-reasoning": ((G,), "grouped-deltas"),
    "tool/glm47/several-calls": ((G,), "lost-call"),
    "tool/glm47/truncated": ((W, T, G), "cut-call-whole"),
    "tool/glm47/near-miss": ((T, G), "held-prefix"),
    "tool/minimax_m2/markup-in-string": ((G,), "nullable-string"),
    "tool/minimax_m2/truncated": ((W,), "cut-call-whole"),
    "tool/kimi_k2/truncated": ((W,), "cut-call-whole"),
    "tool/deepseek_v3/several-calls": ((G,), "grouped-deltas"),
    "tool/deepseek_v3/nested-unicode": ((G,), "grouped-deltas"),
    "tool/deepseek_v3/markup-in-string": ((W, G), "marker-in-string"),
    "tool/deepseek_v3/truncated": ((W, T, G), "cut-call-whole"),
    "tool/deepseek_v3/near-miss": ((T, G), "lost-text"),
    "tool/deepseek_v3/after-reasoning": ((G,), "grouped-deltas"),
    "tool/deepseek_v31/several-calls": ((G,), "grouped-deltas"),
    "tool/deepseek_v31/nested-unicode": ((G,), "grouped-deltas"),
    "tool/deepseek_v31/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/deepseek_v31/truncated": ((W, G), "cut-call-whole"),
    "tool/deepseek_v31/after-reasoning": ((G,), "grouped-deltas"),
    "tool/deepseek_v32/truncated": ((W, T, G), "cut-call-whole"),
    "tool/deepseek_v32/near-miss": ((T, G), "lost-text"),
    "tool/step3/several-calls": ((W,), "lost-call"),
    "tool/step3/truncated": ((W,), "cut-call-whole"),
    "tool/internlm/several-calls": ((W, T, G), "interns1-format"),
    "tool/internlm/nested-unicode": ((W, T, G), "interns1-format"),
    "tool/internlm/markup-in-string": ((W, T, G), "interns1-format"),
    "tool/internlm/truncated": ((W, T, G), "interns1-format"),
    "tool/internlm/after-reasoning": ((W, T, G), "interns1-format"),
    "tool/gigachat3/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/gigachat3/truncated": ((W,), "cut-call-whole"),
    "tool/llama3_json/truncated": ((W, T, G), "cut-call-whole"),
    "tool/llama3_json/after-reasoning": ((W, G), "leading-space"),
    "tool/pythonic/markup-in-string": ((T, G), "marker-in-string"),
    "tool/pythonic/truncated": ((T, G), "cut-block"),
    "tool/mistral/truncated": ((W, T, G), "cut-call-whole"),
    "tool/mistral/near-miss": ((T, G), "lost-text"),
    "tool/openai/several-calls": ((G,), "grouped-deltas"),
    "tool/openai/markup-in-string": ((G,), "marker-in-string"),
    "tool/openai/truncated": ((W, T, G), "cut-call-whole"),
    "tool/muse_glimmer/truncated": ((W, T, G), "cut-call-whole"),
    "tool/hf/truncated": ((T, G), "cut-block"),
    "tool/qwen3_json/several-calls": ((G,), "grouped-deltas"),
    "tool/qwen3_json/nested-unicode": ((G,), "grouped-deltas"),
    "tool/qwen3_json/truncated": ((W, T, G), "cut-call-whole"),
    "tool/qwen3_json/near-miss": ((T, G), "lost-text"),
    "tool/qwen3_json/after-reasoning": ((G,), "grouped-deltas"),
    "tool/iquest_q1/truncated": ((W, T, G), "cut-call-whole"),
    "tool/llama4_pythonic/markup-in-string": ((T, G), "marker-in-string"),
    "tool/llama4_pythonic/truncated": ((T, G), "cut-block"),
    "tool/apertus/truncated": ((W, T, G), "cut-call-whole"),
    "tool/cohere_command3/several-calls": ((W, T, G), "response-tags"),
    "tool/cohere_command3/nested-unicode": ((W, T, G), "response-tags"),
    "tool/cohere_command3/truncated": ((W, T, G), "response-tags"),
    "tool/cohere_command3/near-miss": ((T, G), "held-prefix"),
    "tool/cohere_command3/after-reasoning": ((W, T, G), "response-tags"),
    "tool/cohere_command4/several-calls": ((W, T, G), "response-tags"),
    "tool/cohere_command4/nested-unicode": ((W, T, G), "response-tags"),
    "tool/cohere_command4/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/cohere_command4/truncated": ((W, T, G), "response-tags"),
    "tool/cohere_command4/after-reasoning": ((W, T, G), "response-tags"),
    "tool/inkling/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/inkling/truncated": ((W, T, G), "cut-call-whole"),
    "tool/step3p5/truncated": ((W, T, G), "cut-param-empty"),
    "tool/mimo/truncated": ((W, T, G), "cut-call-whole"),
    "tool/ling3/several-calls": ((G,), "lost-call"),
    "tool/ling3/nested-unicode": ((G,), "grouped-deltas"),
    "tool/ling3/markup-in-string": ((W, T, G), "nullable-string"),
    "tool/ling3/truncated": ((W, T, G), "cut-call-whole"),
    "tool/ling3/near-miss": ((T, G), "held-prefix"),
    "tool/poolside_v1/truncated": ((W, T, G), "cut-call-whole"),
    "tool/hy_v3/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/hy_v3/truncated": ((W, T, G), "cut-call-whole"),
    "tool/hy_v3/near-miss": ((T, G), "lost-text"),
    "tool/k2_horizon/markup-in-string": ((W, T, G), "nullable-string"),
    "tool/k2_horizon/truncated": ((W, T, G), "cut-call-whole"),
    "tool/dots/truncated": ((W, T, G), "cut-call-whole"),
    "tool/dots/near-miss": ((T, G), "held-prefix"),
    "tool/minicpm5/markup-in-string": ((W, T, G), "markup-in-value"),
    "tool/minicpm5/truncated": ((W, T, G), "cut-call-whole"),
    "tool/minicpm5/near-miss": ((T, G), "lost-text"),
    "tool/deepseek_v4/truncated": ((W, T, G), "cut-call-whole"),
    "tool/deepseek_v4/near-miss": ((T, G), "lost-text"),
    "tool/deepseek_v41/truncated": ((W, T, G), "cut-call-whole"),
    "tool/deepseek_v41/near-miss": ((T, G), "lost-text"),
    "tool/gigachat35/truncated": ((W, T, G), "cut-call-whole"),
    "tool/kimi_k3/truncated": ((W, T, G), "cut-call-whole"),
    "tool/gemma4/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/gemma4/truncated": ((T, G), "cut-block"),
    "tool/lfm2/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/lfm2/truncated": ((T, G), "cut-block"),
    "tool/minimax_m3/markup-in-string": ((W, T, G), "marker-in-string"),
    "tool/minimax_m3/truncated": ((T, G), "cut-block"),
    "reasoning/ling3/truncated": ((W, T, G), "unclosed-thinking"),
    "reasoning/cohere_command3/think-answer": ((W, T, G), "cohere-response"),
    "reasoning/cohere_command3/truncated": ((T, G), "think-tag-kept"),
    "reasoning/cohere_command3/no-thinking": ((W, T, G), "thinking-assumed"),
    "reasoning/cohere_command3/markup-in-text": ((W, T, G), "cohere-response"),
    "reasoning/cohere_command4/think-answer": ((W, T, G), "cohere-response"),
    "reasoning/cohere_command4/truncated": ((T, G), "think-tag-kept"),
    "reasoning/cohere_command4/no-thinking": ((W, T, G), "thinking-assumed"),
    "reasoning/cohere_command4/markup-in-text": ((W, T, G), "cohere-response"),
    "tool/mistral/v3-json-list": ((W, T, G), "mistral-json-list"),
    "tool/mistral/v3-nested": ((W, T, G), "mistral-json-list"),
    "tool/k2_horizon/typed": ((W, T, G), "nullable-string"),
}

#: Parsers a peer has none of (the cases that use them are not run on its side).
VLLM_MISSING = {
    "tool": {"iquest_q1", "step5", "gigachat35"},
    "reasoning": {"apertus", "kimi", "qwen3_thinking", "step5"},
}


def _missing(case: Case, peer: str) -> bool:
    """Whether the peer has no parser for one of the case's."""
    if peer == "SGLang":
        tool = case.tool and case.tool not in SGLANG_TOOL_NAMES
        reasoning = case.reasoning and case.reasoning not in SGLANG_REASONING_NAMES
        return bool(tool or reasoning)
    return case.tool in VLLM_MISSING["tool"] or case.reasoning in VLLM_MISSING["reasoning"]


def _folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Case], dict[str, str]]:
    base = tmp_path_factory.mktemp("tokenizers")
    folders = {
        "markers": write_marker_tokenizer("markers", base / "markers"),
        "mistral_v3": write_marker_tokenizer("mistral_v3", base / "mistral_v3"),
    }
    cases = list(CASES)
    where = tokenizer_dir("gptoss")
    if isinstance(where, str):  # no gpt-oss tokenizer: those cases skip with the reason
        cases = [c for c in cases if c.tokenizer != "gptoss"]
    else:
        folders["gptoss"] = str(where)
    return cases, folders


def _peers_env() -> dict[str, str]:
    env = peers_env()
    if env is None:
        pytest.skip(
            "the parser peers' environment is not built: run `python scripts/parser_peers_env.py` "
            "(after scripts/vllm_cpu_env.py; about a minute and 250 MB, once)"
        )
    return env


@pytest.fixture(scope="module")
def vllm_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """vLLM's parse of every case, whole and streamed (one subprocess for the corpus)."""
    env = vllm_env()
    if env is None:
        pytest.skip(
            "the vLLM CPU environment is not built: run `python scripts/vllm_cpu_env.py` "
            "(about 5 minutes and 3.5 GB, once)"
        )
    extras = _peers_env()["vllm_extras"]  # cohere-melody, which vLLM's Cohere parsers import
    cases, folders = _folders(tmp_path_factory)
    return run_vllm(env["python"], vllm_job(cases, real_tokenizer, folders), pythonpath=extras)


@pytest.fixture(scope="module")
def sglang_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """SGLang 0.5.23's parse of every case, whole and streamed (one subprocess)."""
    env = _peers_env()
    cases, folders = _folders(tmp_path_factory)
    return run_sglang(env["python"], sglang_job(cases, real_tokenizer, folders))


@pytest.mark.vllm
@pytest.mark.parametrize("variant", ["markers", "mistral_v3"])
def test_vllm_sees_the_same_tokens(vllm_results: dict[str, Any], variant: str) -> None:
    """vLLM's tokenizer maps every marker to the id tokenwire's does."""
    tok = marker_tokenizer(variant)
    markers = MARKERS if variant == "markers" else MISTRAL_V3_MARKERS
    assert vllm_results["vocab"][variant] == {m: tok.token_to_id(m) for m in markers}


def _normal(raw: dict[str, Any]) -> Any:
    result = vllm_result(raw)
    return result if isinstance(result, str) else result.normal()


def _against(results: dict[str, Any], case: Case, differences: dict, peer: str) -> None:
    raw = results["cases"].get(case.id)
    if raw is None:
        real_tokenizer(case.tokenizer)  # skips, saying why the tokenizer is missing
    assert bool(raw.get("missing")) == _missing(case, peer), f"{case.id}: {peer}'s parser"
    if raw.get("missing"):
        return
    ours = tokenwire_parse(case, [case.text]).normal()
    runs = {
        W: [_normal(raw["whole"])],
        T: [_normal(raw["streams"][0])],
        G: [_normal(s) for s in raw["streams"][1:]],
    }
    modes, reason = differences.get(case.id, ((), ""))
    assert not reason or reason in REASONS
    for mode, theirs in runs.items():
        if mode in modes:
            assert any(t != ours for t in theirs), f"{case.id} {mode} now agrees with {peer}"
        else:
            for t in theirs:
                assert t == ours, f"{case.id}: {peer}'s {mode} run differs"


@pytest.mark.vllm
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_against_vllm(vllm_results: dict[str, Any], case: Case) -> None:
    """tokenwire's answer is vLLM's, whole and streamed, except in the named differences,
    which do differ (an entry that no longer does fails, so the list stays true)."""
    _against(vllm_results, case, DIFFERENCES, "vLLM")


@pytest.mark.vllm
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_against_sglang(sglang_results: dict[str, Any], case: Case) -> None:
    """The same against SGLang 0.5.23's own function-call and reasoning parsers."""
    _against(sglang_results, case, SGLANG_DIFFERENCES, "SGLang")


def test_sglang_registers_the_names_the_diff_runs(sglang_results: dict[str, Any]) -> None:
    """Every SGLang name the differential maps a family to is one SGLang registers."""
    names = sglang_results["names"]
    assert set(SGLANG_TOOL_NAMES.values()) <= set(names["tool"])
    assert set(SGLANG_REASONING_NAMES.values()) <= set(names["reasoning"])


def test_differences_name_corpus_cases() -> None:
    ids = {c.id for c in CASES}
    assert set(DIFFERENCES) <= ids
    assert set(SGLANG_DIFFERENCES) <= ids
    used = {r for _, r in [*DIFFERENCES.values(), *SGLANG_DIFFERENCES.values()]}
    assert used == set(REASONS)


def test_docs_say_why_they_differ() -> None:
    """docs/parsers.md's tables are the ones the corpus and the difference lists give (run
    ``python tests/parser_docs.py`` to write them)."""
    from parser_docs import DOCS, render

    text = DOCS.read_text(encoding="utf-8")
    assert render(DIFFERENCES, SGLANG_DIFFERENCES, REASONS, _missing) in text
