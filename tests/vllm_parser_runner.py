"""vLLM's own parsers over the differential corpus, run under the vLLM environment's python (the
tokenwire test environment has no vllm; tokenwire never imports it).

Reads one JSON document on stdin::

    {"tokenizers": {"NAME": "DIR", ...},
     "cases": [{"id", "tool", "reasoning", "tokenizer", "text", "ids", "prompt_ids",
                "kwargs", "tools", "chunkings": [[[text, [ids]], ...], ...]}, ...]}

and writes one JSON document on stdout: per case, the whole parse (``Parser.parse``, as vLLM's
chat completion does for a non-streamed response) and one streamed parse per chunking
(``Parser.parse_delta`` per chunk, as its streaming response does), each as
``{"reasoning", "content", "calls": [[name, arguments], ...]}`` or ``{"error": "..."}`` (a
parser name vLLM does not register: ``{"missing": true}``). The
parser classes come from ``ParserManager.get_parser``, as ``vllm serve --enable-auto-tool-choice
--tool-call-parser X --reasoning-parser Y`` builds them.

    python tests/vllm_parser_runner.py < input.json > output.json
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
import warnings

#: tokenwire's reasoning-parser names that vLLM registers under another name.
VLLM_REASONING_NAMES = {"gpt_oss": "openai_gptoss"}
#: Formats vLLM parses as harmony (its HarmonyParser, over token ids).
HARMONY = {"openai", "gpt_oss"}


def _quiet() -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "CRITICAL")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)


def _error(exc: BaseException) -> dict:
    last = traceback.extract_tb(exc.__traceback__)[-1]
    where = f"{os.path.basename(last.filename)}:{last.lineno}"
    return {"error": f"{type(exc).__name__}: {exc} ({where})"[:500]}


def main() -> None:
    _quiet()
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager
    from vllm.tokenizers import get_tokenizer

    job = json.load(sys.stdin)
    tokenizers = {name: get_tokenizer(path) for name, path in job["tokenizers"].items()}
    out = {"vocab": {}, "cases": {}}
    for name, tok in tokenizers.items():
        vocab = tok.get_vocab()
        out["vocab"][name] = {m: vocab.get(m) for m in job.get("markers", {}).get(name, [])}

    for case in job["cases"]:
        tok = tokenizers[case["tokenizer"]]
        tool, reasoning = case["tool"], case["reasoning"]
        harmony = tool in HARMONY or reasoning in HARMONY
        try:
            parser_cls = ParserManager.get_parser(
                tool_parser_name=tool,
                reasoning_parser_name=VLLM_REASONING_NAMES.get(reasoning, reasoning),
                enable_auto_tools=tool is not None,
                is_harmony=harmony,
            )
        except Exception as exc:  # an unknown name, say
            if "has not been registered" in str(exc):
                out["cases"][case["id"]] = {"missing": True}
            else:
                out["cases"][case["id"]] = {"whole": _error(exc), "streams": []}
            continue
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        if case["kwargs"]:  # as vLLM's serving has them on the request too
            body["chat_template_kwargs"] = dict(case["kwargs"])
        if case["tools"]:
            body["tools"] = case["tools"]
            body["tool_choice"] = "auto"

        def new_parser(tok=tok, body=body, case=case, parser_cls=parser_cls):
            request = ChatCompletionRequest(**body)
            parser = parser_cls(
                tok, request.tools, chat_template_kwargs=dict(case["kwargs"]), model_config=None
            )
            return parser, request

        result = {}
        try:
            parser, request = new_parser()
            r, c, calls = parser.parse(
                case["text"],
                request,
                enable_auto_tools=tool is not None,
                model_output_token_ids=case["ids"],
            )
            result["whole"] = {
                "reasoning": r,
                "content": c,
                "calls": [[f.name, f.arguments] for f in calls or []],
            }
        except Exception as exc:
            result["whole"] = _error(exc)
        streams = []
        for chunks in case["chunkings"]:
            try:
                streams.append(_stream(new_parser, chunks, case["prompt_ids"]))
            except Exception as exc:
                streams.append(_error(exc))
        result["streams"] = streams
        out["cases"][case["id"]] = result
    json.dump(out, sys.stdout)


def _stream(new_parser, chunks, prompt_ids) -> dict:
    parser, request = new_parser()
    reasoning = content = ""
    calls: dict[int, list] = {}
    for k, (text, ids) in enumerate(chunks):
        delta = parser.parse_delta(
            text, list(ids), request, prompt_token_ids=prompt_ids, finished=k == len(chunks) - 1
        )
        if delta is None:
            continue
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            call = calls.setdefault(tc.index, [None, ""])
            fn = tc.function
            if fn is None:
                continue
            if isinstance(fn, dict):  # some parsers hand model_dump()ed functions
                name, arguments = fn.get("name"), fn.get("arguments")
            else:
                name, arguments = fn.name, fn.arguments
            if name and call[0] is None:
                call[0] = name
            call[1] += arguments or ""
    return {
        "reasoning": reasoning or None,
        "content": content or None,
        "calls": [calls[i] for i in sorted(calls)],
    }


if __name__ == "__main__":
    main()
