"""SGLang 0.5.23's own parsers over the differential corpus, run under the SGLang parsers
environment's python (``scripts/sglang_parsers_env.py``; tokenwire never imports sglang).

Reads the job ``vllm_parser_runner.py`` reads (one JSON document on stdin), each case also
carrying ``sglang_tool`` / ``sglang_reasoning`` (SGLang's names for the case's parsers),
``forced`` (the prompt opened the thinking, as SGLang's template manager tells it) and
``prompt`` (the prompt's text, the prefix SGLang's response-template parsers read), and writes
the same shape of results: per case the whole parse and one streamed parse per chunking.

The calls are SGLang's serving code's (``entrypoints/openai/serving_chat.py``): the whole output
goes through ``ReasoningParser.parse_non_stream`` (``stream_reasoning=False``), then, if
``FunctionCallParser.has_tool_call``, ``parse_non_stream`` (no call parsed: the text is the
content); a stream goes chunk by chunk through ``parse_stream_chunk`` of each, the last chunk
followed by ``parse_stream_end`` of each and the unstreamed arguments check. A name SGLang does
not register gives ``{"missing": true}``.

    python tests/sglang_parser_runner.py < input.json > output.json
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
import warnings


def _quiet() -> None:
    os.environ.setdefault("SGLANG_LOG_LEVEL", "error")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)


def _error(exc: BaseException) -> dict:
    last = traceback.extract_tb(exc.__traceback__)[-1]
    where = f"{os.path.basename(last.filename)}:{last.lineno}"
    return {"error": f"{type(exc).__name__}: {exc} ({where})"[:500]}


def main() -> None:
    _quiet()
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser
    from transformers import AutoTokenizer

    job = json.load(sys.stdin)
    tokenizers = {n: AutoTokenizer.from_pretrained(p) for n, p in job["tokenizers"].items()}
    tools_known = set(FunctionCallParser.ToolCallParserEnum)
    reasoning_known = set(ReasoningParser.DetectorMap)
    out: dict = {"names": {"tool": sorted(tools_known), "reasoning": sorted(reasoning_known)}}
    out["cases"] = {}
    for case in job["cases"]:
        tool, reasoning = case.get("sglang_tool"), case.get("sglang_reasoning")
        if (case["tool"] and tool not in tools_known) or (
            case["reasoning"] and reasoning not in reasoning_known
        ):
            out["cases"][case["id"]] = {"missing": True}
            continue
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "chat_template_kwargs": dict(case["kwargs"]) or None,
        }
        if "reasoning_effort" in case["kwargs"]:  # the request field SGLang reads it from
            body["reasoning_effort"] = case["kwargs"]["reasoning_effort"]
        if case["tools"]:
            body["tools"] = case["tools"]
            body["tool_choice"] = "auto"
        spec = (
            tool,
            reasoning,
            case["forced"],
            body,
            tokenizers[case["tokenizer"]],
            case["prompt"],
        )
        result = {}
        try:
            result["whole"] = _whole(spec, case["text"], ChatCompletionRequest, Tool)
        except Exception as exc:
            result["whole"] = _error(exc)
        streams = []
        for chunks in case["chunkings"]:
            try:
                pieces = [text for text, _ in chunks]
                streams.append(_stream(spec, pieces, ChatCompletionRequest, Tool))
            except Exception as exc:
                streams.append(_error(exc))
        result["streams"] = streams
        out["cases"][case["id"]] = result
    json.dump(out, sys.stdout)


def _parsers(spec, request_cls, tool_cls, *, stream: bool):
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    tool, reasoning, forced, body, tokenizer, prompt = spec
    request = request_cls(**body)
    rp = None
    if reasoning:
        rp = ReasoningParser(
            model_type=reasoning,
            stream_reasoning=stream,
            force_reasoning=forced,
            request=request,
            tokenizer=tokenizer,
            tool_call_parser_active=tool is not None,
            prefix=prompt,
        )
    fp = None
    if tool:
        tools = [tool_cls(**t) for t in body["tools"]]
        fp = FunctionCallParser(tools, tool, tokenizer=tokenizer, prefix=prompt)
    return rp, fp


def _whole(spec, text, request_cls, tool_cls) -> dict:
    rp, fp = _parsers(spec, request_cls, tool_cls, stream=False)
    reasoning = None
    if rp is not None:
        reasoning, text = rp.parse_non_stream(text)
    calls = []
    if fp is not None and text and fp.has_tool_call(text):
        rest, items = fp.parse_non_stream(text)
        if items:  # no call parsed: SGLang answers with the text as it was
            text = rest
            calls = [[c.name, c.parameters] for c in items]
    return {"reasoning": reasoning or None, "content": text or None, "calls": calls}


def _stream(spec, pieces, request_cls, tool_cls) -> dict:
    rp, fp = _parsers(spec, request_cls, tool_cls, stream=True)
    reasoning = content = ""
    calls: dict[int, list] = {}

    def add(items) -> None:
        for item in items:
            call = calls.setdefault(item.tool_index, [None, ""])
            if item.name and call[0] is None:
                call[0] = item.name
            call[1] += item.parameters or ""

    for k, piece in enumerate(pieces):
        last = k == len(pieces) - 1
        delta = piece
        if rp is not None:
            r, delta = rp.parse_stream_chunk(piece)
            if last:
                end_r, end_n = rp.parse_stream_end()
                r = (r or "") + (end_r or "")
                delta = (delta or "") + (end_n or "")
            reasoning += r or ""
            delta = delta or ""
        if fp is None:
            content += delta
            continue
        normal, items = fp.parse_stream_chunk(delta)
        if last:
            end_text, end_items = fp.parse_stream_end()
            normal = (normal or "") + end_text
            items = list(items) + list(end_items)
        content += normal or ""
        add(items)
        if last:
            rest = _unstreamed(fp)
            if rest is not None:
                calls.setdefault(rest[0], [None, ""])[1] += rest[1]
    return {
        "reasoning": reasoning or None,
        "content": content or None,
        "calls": [calls[i] for i in sorted(calls)],
    }


def _unstreamed(parser) -> tuple[int, str] | None:
    """SGLang's ``_check_for_unstreamed_tool_args``: the last call's arguments the stream has
    not sent yet."""
    detector = getattr(parser, "detector", parser)
    prev = getattr(detector, "prev_tool_call_arr", None)
    streamed = getattr(detector, "streamed_args_for_tool", None)
    if not prev or not streamed:
        return None
    index = len(prev) - 1
    if index >= len(streamed):
        return None
    expected = prev[index].get("arguments", {})
    expected = expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)
    actual = streamed[index]
    rest = expected[len(actual) :] if expected.startswith(actual) else ""
    return (index, rest) if rest else None


if __name__ == "__main__":
    main()
