"""gpt-oss's harmony format: tokenwire's own parser (``tokenwire.parsers.harmony``, text pieces)
against OpenAI's ``openai-harmony`` package (``StreamableParser``, token ids), on the
differential corpus's harmony outputs (``tests/parser_corpus.py``) and a few more harmony shapes:
does each give the answer the corpus states (reasoning, content, calls), and what does it cost
per token. The package's messages are read as vLLM's ``HarmonyParser`` reads them (``analysis``
is reasoning, ``final`` and recipient-less ``commentary`` content, ``functions.*`` recipients
calls).

    pip install openai-harmony          # not a tokenwire dependency
    python bench/harmony.py

``openai-harmony`` downloads its vocabulary on first use; offline, this writes it from the
gpt-oss tokenizer (the same ranks, checked by the package's own hash) into the user cache and
points ``TIKTOKEN_ENCODINGS_BASE`` there.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench/http.py would shadow the standard library's http: the tests' folder instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent / "tests"))

from parser_corpus import CASES, Case  # noqa: E402
from tokenwire import DecodeStream  # noqa: E402
from tokenwire.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, merge_tool_deltas  # noqa: E402
from tokenwire.parsers.output import OutputSpec  # noqa: E402

from conftest import real_tokenizer, tokenizer_dir  # noqa: E402

W = '{"city": "巴黎 🌧", "days": [1, 2]}'
EXTRA = [  # (name, output, reasoning, content, calls)
    (
        "header-recipient-first",
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant to=functions.now"
        "<|channel|>commentary json<|message|>{}<|call|>",
        "Think.",
        "",
        [("now", {})],
    ),
    (
        "two-finals",
        "<|channel|>final<|message|>One.<|end|><|start|>assistant<|channel|>final<|message|>"
        "Two.<|return|>",
        "",
        "One.Two.",
        [],
    ),
    (
        "preamble-then-call",
        "<|channel|>commentary<|message|>Looking 🔍.<|end|><|start|>assistant<|channel|>"
        f"commentary to=functions.get_weather <|constrain|>json<|message|>{W}<|call|>",
        "",
        "Looking 🔍.",
        [("get_weather", json.loads(W))],
    ),
    ("cut-in-header", "<|channel|>analysis<|message|>Hmm<|end|><|start|>assist", "Hmm", "", []),
    ("not-harmony", "plain text, no harmony", "", "plain text, no harmony", []),
]


def vocab_dir() -> str:
    """A folder with o200k_base.tiktoken made from the gpt-oss tokenizer's ranks."""
    folder = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tokenwire-bench"
    target = folder / "o200k_base.tiktoken"
    if not target.is_file():
        where = tokenizer_dir("gptoss")
        if isinstance(where, str):
            raise SystemExit(where)
        vocab = json.loads((Path(where) / "tokenizer.json").read_text())["model"]["vocab"]
        printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
        chars = printable + [256 + k for k in range(256 - len(printable))]
        order = printable + [b for b in range(256) if b not in printable]
        byte_of = {chr(c): b for c, b in zip(chars, order)}
        lines = (
            base64.b64encode(bytes(byte_of[ch] for ch in tok)).decode() + f" {rank}\n"
            for tok, rank in sorted(vocab.items(), key=lambda kv: kv[1])
        )
        folder.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(lines))
    return str(folder)


def harmony_parse(encoding, ids: list[int]) -> tuple[str, str, list, float]:
    """(reasoning, content, calls, seconds) from openai-harmony, a token at a time."""
    from openai_harmony import HarmonyError, Role, StreamableParser

    reasoning, content, calls = [], [], []
    t0 = time.perf_counter()
    parser = StreamableParser(encoding, role=Role.ASSISTANT)
    try:
        for i in ids:
            parser.process(i)
        parser.process_eos()
    except HarmonyError:
        pass
    seconds = time.perf_counter() - t0
    for msg in parser.messages:
        text = "".join(c.text for c in msg.content)
        if msg.recipient and msg.recipient.startswith("functions."):
            calls.append((msg.recipient.split(".", 1)[1], _json(text)))
        elif msg.channel == "analysis":
            reasoning.append(text)
        elif msg.channel == "final" or (msg.channel == "commentary" and not msg.recipient):
            content.append(text)
    return "".join(reasoning), "".join(content), calls, seconds


def tokenwire_parse(pieces: list[str]) -> tuple[str, str, list, float]:
    t0 = time.perf_counter()
    spec = OutputSpec(REASONING_PARSERS["gpt_oss"], False, TOOL_CALL_PARSERS["openai"], str)
    parser = spec.new()
    deltas = [parser.feed(p) for p in pieces] + [parser.finish()]
    seconds = time.perf_counter() - t0
    calls = merge_tool_deltas(c for d in deltas for c in d.tool_calls)
    return (
        "".join(d.reasoning for d in deltas),
        "".join(d.content for d in deltas),
        [(c.name, _json(c.arguments)) for c in calls],
        seconds,
    )


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None  # a call cut short: its arguments are not compared


def main() -> None:
    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", vocab_dir())
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    tok = real_tokenizer("gptoss")
    rows = [
        (c.id, c.text, c.reasoning_out, c.content_out, c.calls_out)
        for c in CASES
        if isinstance(c, Case) and c.tokenizer == "gptoss"
    ]
    rows += [(f"extra/{n}", *rest) for n, *rest in EXTRA]
    print(f"{'output':<44}{'tokenwire':>11}{'harmony':>9}")
    tw_ok = hm_ok = 0
    tw_s = hm_s = 0.0
    tokens = 0
    for name, text, reasoning, content, calls in rows:
        ids = tok.encode(text, add_special_tokens=False)
        stream = DecodeStream(tok, [], skip_special_tokens=False)
        pieces = [stream.push_token(i) for i in ids] + [stream.flush()]
        want = (reasoning.strip(), content.strip(), [(n, a) for n, a in calls])
        results = []
        for fn, arg in ((tokenwire_parse, pieces), (lambda x: harmony_parse(encoding, x), ids)):
            best = float("inf")
            for _ in range(20):
                r, c, k, s = fn(arg)
                best = min(best, s)
            results.append(((r.strip(), c.strip(), k) == want, best))
        (a, sa), (b, sb) = results
        tw_ok += a
        hm_ok += b
        tw_s += sa
        hm_s += sb
        tokens += len(ids)
        print(f"{name:<44}{'right' if a else 'WRONG':>11}{'right' if b else 'WRONG':>9}")
    print(f"right: tokenwire {tw_ok}/{len(rows)}, openai-harmony {hm_ok}/{len(rows)}")
    print(
        f"µs per token: tokenwire {tw_s / tokens * 1e6:.2f}, "
        f"openai-harmony {hm_s / tokens * 1e6:.2f} ({tokens} tokens)"
    )


if __name__ == "__main__":
    main()
