"""Output parsers: cost per token of streaming a realistic output through each reasoning and
tool-call parser, piece by piece as the detokenizer yields it (Qwen3 tokenizer), against one parse
of the whole text, and against the detokenization itself (what the frontend pays per token
anyway).

    python bench/parsers.py
"""

from __future__ import annotations

import json
import time

from tokenwire import DecodeStream, Tokenizer
from tokenwire.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS

ARGS = '{"city": "巴黎", "unit": "celsius", "days": [1, 2, 3], "note": "%s"}' % ("x y " * 40)
PROSE = (
    "Let me check the weather for you. The forecast service needs a city and units, and I will "
    "ask for three days so the answer covers the weekend as well. 天气预报需要城市名称。 "
) * 4
THINK = "The user wants the weather in Paris 🌧. I should call the tool with the city. " * 30

OUTPUTS = {
    "hermes": PROSE
    + "".join(
        f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>\n'
        for _ in range(2)
    ),
    "llama3_json": f'{{"name": "get_weather", "parameters": {ARGS}}}; '
    f'{{"name": "now", "parameters": {ARGS}}}',
    "mistral": PROSE + f"[TOOL_CALLS]get_weather[ARGS]{ARGS}[TOOL_CALLS]now[ARGS]{ARGS}",
    "pythonic": '[get_weather(city="巴黎", note="%s"), now()]' % ("x y " * 80),
    "deepseek_v3": PROSE
    + "<｜tool▁calls▁begin｜>"
    + "".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{ARGS}\n```"
        "<｜tool▁call▁end｜>"
        for _ in range(2)
    )
    + "<｜tool▁calls▁end｜>",
    "openai": "<|channel|>analysis<|message|>" + THINK + "<|end|><|start|>assistant<|channel|>"
    f"commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}<|call|>",
    "qwen3_coder": PROSE
    + "".join(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n巴黎\n</parameter>\n"
        f"<parameter=note>\n{'x y ' * 40}\n</parameter>\n<parameter=days>\n[1, 2, 3]\n"
        "</parameter>\n</function>\n</tool_call>\n"
        for _ in range(2)
    ),
    "kimi_k2": PROSE
    + "<|tool_calls_section_begin|>"
    + "".join(
        f"<|tool_call_begin|>functions.get_weather:{i}<|tool_call_argument_begin|>{ARGS}"
        "<|tool_call_end|>"
        for i in range(2)
    )
    + "<|tool_calls_section_end|>",
    "granite": PROSE
    + "<|tool_call|>"
    + json.dumps([{"name": "get_weather", "arguments": json.loads(ARGS)}] * 2, ensure_ascii=False),
    "functiongemma": PROSE
    + "".join(
        "<start_function_call>call:get_weather{city:<escape>巴黎<escape>,note:<escape>"
        f"{'x y ' * 40}<escape>,days:[1,2,3]}}<end_function_call>"
        for _ in range(2)
    ),
}
REASONING = {
    "qwen3": "<think>\n" + THINK + "\n</think>\n\n" + PROSE,
    "deepseek_r1": THINK + "\n</think>\n\n" + PROSE,
    "gpt_oss": OUTPUTS["openai"],
    "granite": "Here is my thought process:\n" + THINK + "\nHere is my response:\n" + PROSE,
}


def pieces(tok: Tokenizer, text: str) -> list[str]:
    stream = DecodeStream(tok, [], skip_special_tokens=False)
    return [stream.push_token(i) for i in tok.encode(text, add_special_tokens=False)]


def best(fn, runs: int = 5) -> float:
    out = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def main() -> None:
    tok = Tokenizer.default()
    print(
        f"{'parser':<14}{'tokens':>8}{'stream µs/tok':>15}{'whole µs/tok':>14}{'detok µs/tok':>14}"
    )
    rows = [(n, TOOL_CALL_PARSERS[n], t, "tool") for n, t in OUTPUTS.items()]
    rows += [(n, REASONING_PARSERS[n], t, "reasoning") for n, t in REASONING.items()]
    for name, cls, text, kind in rows:
        ps = pieces(tok, text)
        us = 1e6 / len(ps)
        stream_s = best(lambda c=cls, k=kind, p=ps: _stream(c, k, p))
        whole_s = best(lambda c=cls, k=kind, t=text: _make(c, k).parse(t))
        detok_s = best(lambda t=text: pieces(tok, t))
        cols = f"{stream_s * us:>15.2f}{whole_s * us:>14.2f}{detok_s * us:>14.2f}"
        print(f"{name:<14}{len(ps):>8}{cols}")


def _make(cls, kind: str):
    return cls(make_id=str) if kind == "tool" else cls()


def _stream(cls, kind: str, ps: list[str]) -> None:
    p = _make(cls, kind)
    for piece in ps:
        p.feed(piece)
    p.finish()


if __name__ == "__main__":
    main()
