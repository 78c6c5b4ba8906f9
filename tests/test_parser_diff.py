"""The parser corpus (``parser_corpus.py``): every reasoning and tool-call format's outputs give
what their model meant, whatever the split, and what vLLM's parser of the same name gives,
except where the case is named below with the reason tokenwire's answer is the right one
(docs/output.md, "Parsers checked against vLLM").

Each output is parsed whole, then streamed: one token a piece, at random byte offsets, and in
chunks of several tokens (those byte offsets moved to the next token boundary). vLLM gets the
whole output (its non-streamed chat completion) and the token chunkings, with the token ids, as
its streamed chat completion does; tokenwire's pieces are the text its detokenizer gives. The
vLLM side runs in one subprocess under the vLLM environment's python (``vllm_parser_runner.py``);
without that environment those tests skip, as the other real-vLLM tests do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from parser_corpus import CASES, MARKERS, MISTRAL_V3_MARKERS, Case
from parser_diff import (
    Result,
    byte_splits,
    case_tokenizer,
    marker_tokenizer,
    run_vllm,
    token_chunkings,
    token_pieces,
    tokenwire_parse,
    vllm_job,
    vllm_result,
    write_marker_tokenizer,
)
from vllm_helpers import vllm_env

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


# ---- against vLLM --------------------------------------------------------------------------------

#: Why tokenwire's answer differs from vLLM's, by reason (docs/output.md, "Where tokenwire and vLLM
#: differ", says more of each).
REASONS = {
    "marker-in-string": "vLLM ends the call at a marker written inside a string argument",
    "cut-call-whole": "vLLM's non-streamed parse drops or returns as content a call the token "
    "limit cut, which its stream sends",
    "cut-call-arguments": "vLLM's stream leaves a cut call's arguments no JSON",
    "grouped-deltas": "vLLM's parser loses or garbles text when a delta holds several tokens",
    "held-prefix": "vLLM's stream holds back the start of a possible tag and never sends it",
    "marker-first-stream": "vLLM's stream reads calls only when the output opens with them",
    "no-streaming": "vLLM's phi4_mini_json parser sends nothing when streaming",
    "list-regex": "vLLM's phi4_mini_json regex ends the call list at the first ]",
    "partial-json-stream": "vLLM streams arguments as diffs of re-serialized partial JSON: "
    "garbled, doubled or empty",
    "untyped-values": "vLLM's step3 parser leaves object, array and null values as strings",
    "functiongemma-values": "vLLM's functiongemma parser reads only <escape>d values",
    "cut-block": "a block read whole at its end stays content when the output never closes it",
    "olmo3-calls": "vLLM's olmo3 parser drops the text before calls, and its stream finds none",
    "lost-text": "vLLM's stream drops text that looks like the start of a call",
    "dsml-without-block": "vLLM takes an invoke outside a function_calls block as a call",
    "granite-reasoning": "vLLM's granite reasoning stream leaks the opening phrase and keeps the "
    "answer's calls in content",
    "unclosed-thinking": "vLLM's non-streamed parse makes thinking the output never closed content",
    "hunyuan-token-ids": "vLLM's hunyuan_a13b reasoning stream matches Hunyuan's own token ids",
    "think-tag-kept": "vLLM's step3 parser keeps an opening <think> in the reasoning",
    "response-tags": "vLLM's ernie45 stream leaves <response> tags in the content",
    "leading-space": "vLLM's pythonic and llama3_json parsers miss calls after a newline",
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
}


@pytest.fixture(scope="module")
def vllm_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """vLLM's parse of every case, whole and streamed (one subprocess for the corpus)."""
    env = vllm_env()
    if env is None:
        pytest.skip(
            "the vLLM CPU environment is not built: run `python scripts/vllm_cpu_env.py` "
            "(about 5 minutes and 3.5 GB, once)"
        )
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
    return run_vllm(env["python"], vllm_job(cases, real_tokenizer, folders))


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


@pytest.mark.vllm
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_against_vllm(vllm_results: dict[str, Any], case: Case) -> None:
    """tokenwire's answer is vLLM's, whole and streamed, except in the named differences,
    which do differ (an entry that no longer does fails, so the list stays true)."""
    raw = vllm_results["cases"].get(case.id)
    if raw is None:
        real_tokenizer(case.tokenizer)  # skips, saying why the tokenizer is missing
    ours = tokenwire_parse(case, [case.text]).normal()
    runs = {
        W: [_normal(raw["whole"])],
        T: [_normal(raw["streams"][0])],
        G: [_normal(s) for s in raw["streams"][1:]],
    }
    modes, reason = DIFFERENCES.get(case.id, ((), ""))
    assert not reason or reason in REASONS
    for mode, theirs in runs.items():
        if mode in modes:
            assert any(t != ours for t in theirs), f"{case.id} {mode} now agrees with vLLM"
        else:
            for t in theirs:
                assert t == ours, f"{case.id}: vLLM's {mode} run differs"


def test_differences_name_corpus_cases() -> None:
    ids = {c.id for c in CASES}
    assert set(DIFFERENCES) <= ids
    assert {reason for _, reason in DIFFERENCES.values()} == set(REASONS)


def test_readme_says_why_they_differ() -> None:
    """The reference (docs/output.md) explains every reason, naming its cases."""
    readme = (Path(__file__).resolve().parent.parent / "docs" / "output.md").read_text(
        encoding="utf-8"
    )
    assert f"Of {len(CASES)} outputs, {len(DIFFERENCES)} differ" in " ".join(readme.split())
    for case, (_, reason) in DIFFERENCES.items():
        section = readme.split(f"- `{reason}`: ", 1)
        assert len(section) == 2, f"docs/output.md has no entry for {reason}"
        entry = section[1].split("\n- `", 1)[0]
        assert f"`{case}`" in entry, f"docs/output.md's {reason} misses {case}"
