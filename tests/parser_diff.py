"""Running the parser corpus (``parser_corpus.py``) through tokenwire's parsers and, in a
subprocess under the vLLM environment's python, through vLLM's parsers of the same names.

The corpus is tokenized with tokenwire's bundled Qwen3 tokenizer with every family's marker
strings (``parser_corpus.MARKERS``) added as special tokens, so each marker is one token as in its
own family's tokenizer (the Mistral cases before v11 use one without ``[ARGS]``), and gpt-oss's
harmony outputs with the real gpt-oss tokenizer (vLLM parses harmony from its token ids). Both
sides get the same tokenizer files, so they see the same tokens and the same pieces of text.
"""

from __future__ import annotations

import bisect
import codecs
import itertools
import json
import lzma
import random
import subprocess
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken

from parser_corpus import (
    HF_TEMPLATE,
    MARKERS,
    MISTRAL_V3_MARKERS,
    THINK_FORMATS,
    TOOLS,
    Case,
    prompt_text,
)
from tokenwire import DecodeStream, Tokenizer
from tokenwire.parsers import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ResponseTemplate,
    merge_tool_deltas,
    prompt_opens_reasoning,
)
from tokenwire.parsers.output import OutputSpec

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "vllm_parser_runner.py"
SGLANG_RUNNER = HERE / "sglang_parser_runner.py"

#: SGLang 0.5.23's names for tokenwire's parsers (the diff runs the one that reads the same
#: markup; a family SGLang has no parser for is missing on its side).
SGLANG_TOOL_NAMES = {
    "hermes": "hermes",
    "qwen3_json": "qwen25",
    "llama3_json": "llama3",
    "mistral": "mistral",
    "pythonic": "pythonic",
    "llama4_pythonic": "pythonic",
    "deepseek_v3": "deepseekv3",
    "deepseek_v31": "deepseekv31",
    "deepseek_v32": "deepseekv32",
    "deepseek_v4": "deepseekv4",
    "deepseek_v41": "deepseekv41",
    "kimi_k2": "kimi_k2",
    "kimi_k3": "kimi_k3",
    "qwen3_coder": "qwen3_coder",
    "qwen3_xml": "qwen3_coder",
    "step3p5": "step3p5",
    "glm45": "glm45",
    "glm47": "glm47",
    "poolside_v1": "poolside_v1",
    "ling3": "ling3",
    "minimax_m2": "minimax-m2",
    "minimax_m3": "minimax-m3",
    "step3": "step3",
    "internlm": "interns1",
    "hy_v3": "hunyuan",
    "gigachat3": "gigachat3",
    "gigachat35": "gigachat35",
    "openai": "gpt-oss",
    "gemma4": "gemma4",
    "inkling": "inkling",
    "iquest_q1": "iquest_q1",
    "apertus": "apertus2509",
    "cohere_command3": "cohere_command4",
    "cohere_command4": "cohere_command4",
    "dots": "dots",
    "k2_horizon": "k2_horizon",
    "lfm2": "lfm2",
    "mimo": "mimo",
    "minicpm5": "minicpm5",
    "hf": "response_template",
    "muse_glimmer": "muse",
}
SGLANG_REASONING_NAMES = {
    "qwen3": "qwen3",
    "qwen3_thinking": "qwen3-thinking",
    "deepseek_r1": "deepseek-r1",
    "deepseek_v3": "deepseek-v3",
    "deepseek_v4": "deepseek-v4",
    "deepseek_v41": "deepseek-v41",
    "glm45": "glm45",
    "glm47": "glm45",
    "ling3": "ling3",
    "hy_v3": "hunyuan",
    "gpt_oss": "gpt-oss",
    "k2_horizon": "k2_horizon",
    "kimi": "kimi",
    "kimi_k2": "kimi_k2",
    "kimi_k3": "kimi_k3",
    "mimo": "mimo",
    "poolside_v1": "poolside_v1",
    "minimax_m2": "minimax",
    "minimax_m2_append_think": "minimax-append-think",
    "minimax_m3": "minimax-m3",
    "step3": "step3",
    "step3p5": "step3p5",
    "mistral": "mistral",
    "nemotron_v3": "nemotron_3",
    "granite_thinking_parser": "granite_thinking_parser",
    "gemma4": "gemma4",
    "inkling": "inkling",
    "cohere_command3": "cohere_command4",
    "cohere_command4": "cohere_command4",
    "apertus": "apertus2509",
    "hf": "response_template",
    "muse_glimmer": "muse",
}
#: Random splits per case (each side gets the same token groupings; tokenwire also byte splits).
RANDOM_SPLITS = 2


@dataclass
class Result:
    """What a parse gave: thinking, answer, and calls (name, arguments text)."""

    reasoning: str
    content: str
    calls: list[tuple[str, str]]

    def normal(self) -> tuple[str, str, list[tuple[str, Any]]]:
        """The result as compared: text without surrounding space, arguments as JSON values
        (arguments that are no JSON, a truncated call's, as text)."""
        return (
            self.reasoning.strip(),
            self.content.strip(),
            [(name, _value(args)) for name, args in self.calls],
        )


def _value(args: str) -> Any:
    try:
        return json.loads(args)
    except ValueError:
        return ("not JSON", args.strip())


# ---- tokenizers ------------------------------------------------------------------------------


def _base_qwen3() -> tuple[str, dict[str, Any], dict[str, Any]]:
    base = resources.files("tokenwire") / "_data" / "qwen3"
    raw = lzma.decompress((base / "tokenizer.json.xz").read_bytes()).decode("utf-8")
    config = json.loads((base / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["response_template"] = HF_TEMPLATE  # for the hf parsers
    model = json.loads((base / "config.json").read_text(encoding="utf-8"))
    return raw, config, model


def _marker_hf(variant: str) -> tokenizers.Tokenizer:
    raw, _, _ = _base_qwen3()
    hf = tokenizers.Tokenizer.from_str(raw)
    markers = MARKERS if variant == "markers" else MISTRAL_V3_MARKERS
    hf.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in markers])
    return hf


@cache
def marker_tokenizer(variant: str) -> Tokenizer:
    """The corpus tokenizer: ``markers`` (every family's markers), or ``mistral_v3`` (without
    ``[ARGS]``, as Mistral's tokenizers before v11)."""
    _, config, model = _base_qwen3()
    return Tokenizer(_marker_hf(variant), config, model_config=model, name=f"qwen3+{variant}")


def write_marker_tokenizer(variant: str, folder: Path) -> str:
    """The corpus tokenizer's files in ``folder``, for vLLM to load."""
    _, config, model = _base_qwen3()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(_marker_hf(variant).to_str(), encoding="utf-8")
    # The added tokens are the tokenizer.json's: a config listing them again would replace them.
    config = {k: v for k, v in config.items() if k != "added_tokens_decoder"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps(model), encoding="utf-8")
    return str(folder)


def case_tokenizer(case: Case, real_tokenizer) -> Tokenizer:
    """The tokenizer a case's output is written with."""
    if case.tokenizer == "gptoss":
        return real_tokenizer("gptoss")
    return marker_tokenizer(case.tokenizer)


# ---- splits ----------------------------------------------------------------------------------


def token_pieces(tok: Tokenizer, text: str) -> tuple[list[int], list[str]]:
    """The output's tokens and the text each adds as the detokenizer streams them."""
    ids = tok.encode(text, add_special_tokens=False)
    stream = DecodeStream(tok, [], skip_special_tokens=False)
    pieces = [stream.push_token(i) for i in ids]
    pieces[-1:] = [pieces[-1] + stream.flush()] if pieces else []
    assert "".join(pieces) == text, "the tokenizer does not round-trip the output"
    return ids, pieces


def byte_cuts(case_id: str, text: str) -> list[list[int]]:
    """Random byte offsets to cut the output at (``RANDOM_SPLITS`` sets, fixed per case)."""
    size = len(text.encode("utf-8"))
    rng = random.Random(case_id)
    return [sorted(rng.sample(range(1, size), min(size - 1, 12))) for _ in range(RANDOM_SPLITS)]


def token_chunkings(case_id: str, text: str, ids: list[int], pieces: list[str]) -> list[list]:
    """``[(text, ids), ...]`` chunkings of the output as a server streams them: one token per
    chunk, then the random byte cuts moved to the next token boundary (several tokens a chunk,
    as a stream interval or speculative decoding hands them over)."""
    out = [[(p, [i]) for i, p in zip(ids, pieces)]]
    ends = list(itertools.accumulate(len(p.encode("utf-8")) for p in pieces))
    for cuts in byte_cuts(case_id, text):
        bounds = sorted({0, len(ids), *(bisect.bisect_left(ends, c) + 1 for c in cuts)})
        out.append([("".join(pieces[a:b]), ids[a:b]) for a, b in itertools.pairwise(bounds)])
    return out


def byte_splits(case_id: str, text: str) -> list[list[str]]:
    """The output cut at the random byte offsets, decoded as a UTF-8 stream decoder would (a
    character cut in two comes whole with the later piece)."""
    data = text.encode("utf-8")
    out = []
    for cuts in byte_cuts(case_id, text):
        decoder = codecs.getincrementaldecoder("utf-8")()
        bounds = [0, *cuts, len(data)]
        out.append(
            [decoder.decode(data[a:b], final=b == len(data)) for a, b in itertools.pairwise(bounds)]
        )
    return out


# ---- tokenwire -------------------------------------------------------------------------------


def _bound(cls: Any) -> Any:
    """A parser class, bound to the corpus tokenizer's response_template if it reads one."""
    if getattr(cls, "needs_template", False):
        return cls.for_template(_hf_template())
    return cls


@cache
def _hf_template() -> ResponseTemplate:
    return ResponseTemplate.load(HF_TEMPLATE)


def tokenwire_spec(case: Case) -> OutputSpec:
    reasoning = _bound(REASONING_PARSERS[case.reasoning]) if case.reasoning else None
    opens = reasoning is not None and prompt_opens_reasoning(prompt_text(case), reasoning)
    tools = _bound(TOOL_CALL_PARSERS[case.tool]) if case.tool else None
    return OutputSpec(reasoning, opens, tools, lambda i: f"call{i}", tool_schemas=TOOLS)


def tokenwire_parse(case: Case, pieces: list[str]) -> Result:
    parser = tokenwire_spec(case).new()
    deltas = [parser.feed(p) for p in pieces] + [parser.finish()]
    calls = merge_tool_deltas(c for d in deltas for c in d.tool_calls)
    return Result(
        "".join(d.reasoning for d in deltas),
        "".join(d.content for d in deltas),
        [(c.name, c.arguments) for c in calls],
    )


# ---- vLLM ------------------------------------------------------------------------------------


def vllm_job(cases: list[Case], real_tokenizer, folders: dict[str, str]) -> dict[str, Any]:
    """The runner's input for ``cases`` (``folders``: each tokenizer's files, by name)."""
    items = []
    for case in cases:
        tok = case_tokenizer(case, real_tokenizer)
        ids, pieces = token_pieces(tok, case.text)
        items.append(
            {
                "id": case.id,
                "tool": case.tool,
                "reasoning": case.reasoning,
                "tokenizer": case.tokenizer,
                "text": case.text,
                "ids": ids,
                "prompt_ids": tok.encode(prompt_text(case), add_special_tokens=False),
                "kwargs": case.kwargs,
                "tools": TOOLS if case.tool else None,
                "chunkings": token_chunkings(case.id, case.text, ids, pieces),
            }
        )
    markers = {"markers": MARKERS, "mistral_v3": MISTRAL_V3_MARKERS}
    return {"tokenizers": folders, "markers": markers, "cases": items}


def sglang_job(cases: list[Case], real_tokenizer, folders: dict[str, str]) -> dict[str, Any]:
    """The SGLang runner's input: the vLLM job's cases with SGLang's names for their parsers
    and whether the prompt opened the thinking (SGLang's template manager's
    ``force_reasoning``: a template that opens it, or a prompt that did)."""
    job = vllm_job(cases, real_tokenizer, folders)
    for item, case in zip(job["cases"], cases):
        item["sglang_tool"] = SGLANG_TOOL_NAMES.get(case.tool or "")
        item["sglang_reasoning"] = SGLANG_REASONING_NAMES.get(case.reasoning or "")
        fmt = THINK_FORMATS.get(case.reasoning or "")
        opens = case.reasoning is not None and prompt_opens_reasoning(
            prompt_text(case), _bound(REASONING_PARSERS[case.reasoning])
        )
        item["forced"] = bool(opens or (fmt is not None and fmt.implicit))
        item["prompt"] = prompt_text(case)
        del item["ids"], item["prompt_ids"]
    return job


def run_sglang(python: str, job: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """SGLang's results for a job (one subprocess for all of it)."""
    return run_vllm(python, job, timeout, runner=SGLANG_RUNNER, peer="SGLang")


def run_vllm(
    python: str,
    job: dict[str, Any],
    timeout: float = 600,
    *,
    runner: Path = RUNNER,
    peer: str = "vLLM",
    pythonpath: str | None = None,
) -> dict[str, Any]:
    """vLLM's results for a job (one subprocess for all of it; ``pythonpath``: packages
    beyond its environment's, such as the one vLLM's Cohere parsers import)."""
    env = _vllm_env()
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [python, str(runner)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{peer}'s parser run failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout)


def _vllm_env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="CRITICAL", PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    return env


def vllm_result(raw: dict[str, Any]) -> Result | str:
    if "error" in raw:
        return raw["error"]
    return Result(raw["reasoning"] or "", raw["content"] or "", [tuple(c) for c in raw["calls"]])
