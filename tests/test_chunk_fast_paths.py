"""The streamed chunk's fast paths give the bytes of the general ones: steps' plain chunks taken
from a sink without a ``Frame`` each (``EgressSink.take_steps``) and formatted from their text
(``OpenAIStreamer.feed_steps``), the parsers' one-look fast path (``OutputParser.feed_plain``),
the chunk pieces precomputed from the one shape (``ChunkWriter.text_delta``), and the chat
template's render cache."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire import Tokenizer
from tokenwire.chat import render
from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.messages.egress import EgressSink, StepChunks
from tokenwire.parsers import REASONING_PARSERS
from tokenwire.parsers.output import OutputParser
from tokenwire.runtime import Features
from tokenwire.server import ServerConfig, create_app
from tokenwire.server.openai.chunks import ChunkWriter, delta_fields, text_fields
from tokenwire.server.openai.parse import parse_chat, parse_completion
from tokenwire.server.openai.stream import OpenAIStreamer

TOK = Tokenizer.default()
#: Pieces with and without the markup's characters, split anywhere.
PIECES = [
    "<think>",
    "</think>",
    "<",
    "/",
    "think",
    ">",
    "a",
    " b",
    "é",
    "\n",
    "\n\nHuman",
    "x<y",
    "",
]


def _runtime(reasoning: str | None = "qwen3", field: str = "reasoning"):
    features = Features(reasoning_parser=reasoning, reasoning_field=field)
    if getattr(REASONING_PARSERS.get(reasoning or ""), "needs_template", False):
        # (the hf parsers read the checkpoint's response_template: the corpus's one)
        from parser_corpus import HF_TEMPLATE
        from tokenwire.parsers import ResponseTemplate

        features = dataclasses.replace(
            features, response_template=ResponseTemplate.load(HF_TEMPLATE)
        )
    engine = SyntheticEngine(TOK, SyntheticConfig())
    return create_app(TOK, engine, ServerConfig(model_name="m", features=features)).runtime


def _plan(rt, body):
    body = {"model": "m", "stream": True, "max_tokens": 64, **body}
    parse = parse_chat if "messages" in body else parse_completion
    return parse(body, TOK, rt.models, features=rt.features)


def _streamers(rt, body):
    """Two streamers of the same request, each over a sink of its own."""
    out = []
    plan = _plan(rt, body)  # (one plan: the same id in both)
    for k in range(2):
        sink = EgressSink(capacity=1 << 10)
        sink.row = 0
        out.append((OpenAIStreamer(rt, plan, [(f"r{k}", 0, sink)], (0,)), sink))
    return out


def _both_ways(rt, body, pieces: list[str], batch: int) -> None:
    """``pieces`` as one-token steps into both sinks, ``batch`` steps at a time: the general
    path (``drain`` and ``feed``) and the fast one (``take_steps`` and ``feed_steps``) write the
    same bytes."""
    (general, sink_a), (fast, sink_b) = _streamers(rt, body)
    assert fast.takes_steps
    wrote_general, wrote_fast = [], []
    for start in range(0, len(pieces), batch):
        for k, text in enumerate(pieces[start : start + batch], start):
            step = StepChunks(["r"], [100 + k], [5], [text], [k + 1], [0])
            sink_a.try_send(step)
            sink_b.try_send(step)
        wrote_general.append(general.feed([(0, item) for item in sink_a.drain()]))
        steps = sink_b.take_steps()
        assert steps is not None and not len(sink_b)
        wrote_fast.append(fast.feed_steps(steps))
    assert wrote_fast == wrote_general
    if general.parsed is not None:
        assert fast.parsed is not None
        a, b = general.parsed[0].parser, fast.parsed[0].parser
        assert (a.reasoning_tokens, a._chars, a._pending) == (
            b.reasoning_tokens,
            b._chars,
            b._pending,
        )
        assert general.parsed[0].final("", []) == fast.parsed[0].final("", [])


BODIES = [
    {"prompt": "hi"},
    {"prompt": "hi", "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    {"messages": [{"role": "user", "content": "hi"}]},
    {"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}},
    {"messages": [{"role": "user", "content": "hi"}], "include_reasoning": False},
]


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("start", ["<think>", "", "<thi", "plain"])
@pytest.mark.parametrize("batch", [1, 3])
def test_steps_fast_path_writes_the_general_paths_bytes(body, start, batch):
    rng = random.Random(hash((start, batch)) & 0xFFFF)
    pieces = [start, *(rng.choice(PIECES) for _ in range(60))]
    _both_ways(_runtime(), body, pieces, batch)


@pytest.mark.parametrize("parser", sorted(REASONING_PARSERS))
@pytest.mark.parametrize("field", ["reasoning", "both"])
def test_every_reasoning_parser_fast_path_writes_the_same_bytes(parser, field):
    rt = _runtime(parser, field)
    cls = REASONING_PARSERS[parser]
    starts = getattr(cls, "start_tags", ("<think>",))
    ends = getattr(cls, "end_tags", ("</think>",))
    rng = random.Random(parser)
    for _ in range(4):
        pieces = [rng.choice([*starts, ""])]
        pieces += [rng.choice([*PIECES, *ends, ends[0][:2], "[", "H"]) for _ in range(40)]
        _both_ways(rt, {"messages": [{"role": "user", "content": "hi"}]}, pieces, 2)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(sorted(REASONING_PARSERS)),
    st.lists(
        st.sampled_from([*PIECES, "[THINK]", "[/THINK]", "Here is my response:"]), max_size=30
    ),
    st.booleans(),
)
def test_feed_plain_takes_a_piece_as_feed_does(parser, pieces, in_prompt):
    cls = REASONING_PARSERS[parser]
    if getattr(cls, "needs_template", False):  # (the hf parser: bound to the corpus's template)
        from parser_corpus import HF_TEMPLATE
        from tokenwire.parsers import ResponseTemplate

        cls = cls.for_template(ResponseTemplate.load(HF_TEMPLATE))
    plain = OutputParser(cls(prompt_in_reasoning=in_prompt), None)
    general = OutputParser(cls(prompt_in_reasoning=in_prompt), None)
    got_plain, got_general = [], []
    for text in pieces:
        d = general.feed(text, [1])
        got_general.append((d.reasoning, d.content))
        kind = plain.feed_plain(text, 1)
        if kind == 1:
            got_plain.append((text, ""))
        elif kind == 2:
            got_plain.append(("", text))
        else:
            d = plain.feed(text, [1])
            got_plain.append((d.reasoning, d.content))
    assert got_plain == got_general
    assert plain.reasoning_tokens == general.reasoning_tokens
    end_plain, end_general = plain.finish(), general.finish()
    assert (end_plain.reasoning, end_plain.content) == (end_general.reasoning, end_general.content)


def test_take_steps_leaves_other_items_to_drain():
    sink = EgressSink()
    sink.row = 0
    assert sink.take_steps() is None  # nothing waits
    step = StepChunks(["r"], [7], [1], ["a"], [1], [0])
    sink.try_send(step)
    sink.try_send(step.chunk(0))  # a Frame: the general path takes all
    assert sink.take_steps() is None and len(sink) == 2
    sink.drain()
    sink.try_send(step)
    sink.try_send(StepChunks(["x", "r"], [8, 9], [1, 1], ["b", "c"], [5, 2], [1]))
    assert sink.take_steps() == [("a", 7, 1), ("c", 9, 2)] and not len(sink)


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("keys", [("content",), ("reasoning",), ("reasoning", "reasoning_content")])
def test_precomputed_pieces_are_the_shapes_encoding(chat, keys):
    rt = _runtime()
    body = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    writer = ChunkWriter(_plan(rt, body), (0,))
    for text in ["", "plain", 'quo"te\\', "\n\u2028é\x00", "tokenwire-text-slot"]:
        fields = delta_fields(dict.fromkeys(keys, text)) if chat else text_fields(text)
        expected = writer.chunk(0, fields, 3)
        assert writer.text_delta(0, keys if chat else (), text, 3) == expected


def test_render_cache_returns_the_render_and_skips_clock_templates(monkeypatch):
    calls = []
    real = render._render

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(render, "_render", counted)
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    msgs = [{"role": "user", "content": "hi"}]
    first = render.render_chat(template, msgs, bos_token="", eos_token="")
    again = render.render_chat(template, [dict(m) for m in msgs], bos_token="", eos_token="")
    assert first == again == "<user>hi" and len(calls) == 1
    other = render.render_chat(
        template, [{"role": "user", "content": "ho"}], bos_token="", eos_token=""
    )
    assert other == "<user>ho" and len(calls) == 2
    # Continuing the final message cuts the cached text as it cuts a fresh one.
    cut = render.render_chat(
        template + "<end>", msgs, bos_token="", eos_token="", continue_final_message=True
    )
    assert (
        cut
        == render.render_chat(
            template + "<end>", msgs, bos_token="", eos_token="", continue_final_message=True
        )
        == "<user>hi"
    )
    clock = template + "{{ strftime_now('%Y') }}"
    render.render_chat(clock, msgs, bos_token="", eos_token="")
    render.render_chat(clock, msgs, bos_token="", eos_token="")
    assert len(calls) == 5  # (the clock's template rendered each time)


async def test_a_producer_on_the_loops_thread_schedules_without_waking_the_loop():
    import asyncio
    import threading

    loop = asyncio.get_running_loop()
    woken: list[int] = []
    real = loop.call_soon_threadsafe

    def counted(*args, **kwargs):
        woken.append(1)
        return real(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    try:
        sink = EgressSink()
        got: list[int] = []
        sink.attach(lambda: got.append(len(sink.drain())))
        sink.try_send("a")  # on the loop's thread: no wake-up through the pipe
        for _ in range(3):
            await asyncio.sleep(0)
        assert got == [1] and woken == []
        thread = threading.Thread(target=sink.try_send, args=("b",))
        thread.start()
        thread.join()
        for _ in range(50):
            await asyncio.sleep(0.001)
            if len(got) == 2:
                break
        assert got == [1, 1] and woken == [1]  # (from another thread: the loop is woken)
    finally:
        del loop.call_soon_threadsafe
