"""DetokShard: stop strings (vLLM's and SGLang's cases), regexes, token stops, hold-back, errors,
backpressure, and streamed == non-streamed on real tokenizers."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tokenwire import FinishReason, SamplingParams, Tokenizer
from tokenwire.messages.egress import Done, EgressSink, Error, Frame
from tokenwire.messages.frames import decode_batch_frame, encode_batch_frame
from tokenwire.shard import DetokShard

from conftest import examples, real_tokenizer
from helpers import BYTE_EOS, b, byte_tokenizer


def frame(rows: Sequence[tuple[str, Sequence[int], dict | None]], prompt: int = 2):
    """A decoded batch frame: rows of (rid, token ids, finish dict)."""
    header = [
        [r[0] for r in rows],
        [r[2] for r in rows],
        [prompt] * len(rows),
        [len(r[1]) for r in rows],
    ]
    return decode_batch_frame(encode_batch_frame(header, [[t for r in rows for t in r[1]]]))


class Run:
    """One request through a shard, with a record of engine aborts."""

    def __init__(
        self,
        tok: Tokenizer,
        params: SamplingParams,
        *,
        capacity: int = 1024,
        prompt: Sequence[int] | None = None,
        **kw,
    ):
        self.aborted: list[str] = []
        self.shard = DetokShard(self.aborted.append, **kw)
        self.sink = EgressSink(capacity=capacity)
        self.tok = tok
        params.normalize(tok)
        self.shard.register("r", self.sink, tok, b("> ") if prompt is None else prompt, params)

    def step(self, ids: Sequence[int], finish: dict | None = None) -> None:
        self.shard.on_frame(frame([("r", ids, finish)]))

    def items(self):
        return self.sink.drain()


def run_text(
    text: str,
    stops,
    *,
    min_new_tokens: int = 0,
    no_stop_trim: bool = False,
    stop_regex=None,
    per_step: int = 1,
):
    """Generate ``text`` one byte token per step (length finish on the last); return (deltas,
    final item, run)."""
    tok = byte_tokenizer()
    params = SamplingParams(
        stop=stops, min_new_tokens=min_new_tokens, no_stop_trim=no_stop_trim, stop_regex=stop_regex
    )
    run = Run(tok, params)
    ids = b(text)
    for i in range(0, len(ids), per_step):
        chunk = ids[i : i + per_step]
        last = i + per_step >= len(ids)
        run.step(chunk, {"type": "length", "length": len(ids)} if last else None)
        if "r" not in run.shard:
            break
    items = run.items()
    assert isinstance(items[-1], Done), items[-1]
    return [it.event.text for it in items], items[-1].event, run


VLLM_CASES = [
    ("hello", ["ll"], {}, "he", "ll"),
    ("hello", ["e"], {"min_new_tokens": 3}, "hello", None),
    (" The user is a", ["a", "is"], {}, " The user ", "is"),
    ("ab", ["ab", "b"], {}, "", "ab"),
    ("ab", ["b", "ab"], {}, "a", "b"),
    ("abc", ["abc", "b"], {}, "a", "b"),
    ("你好世界", ["世界"], {}, "你好", "世界"),
    (" 1, 2, 3", ["3"], {}, " 1, 2, ", "3"),
    (" 1, 2, 3", ["3"], {"no_stop_trim": True}, " 1, 2, 3", "3"),
    ("a STOP b STOP", ["STOP"], {}, "a ", "STOP"),
    ("no stop here", ["xyz"], {}, "no stop here", None),
]


@pytest.mark.parametrize("per_step", [1, 3])
@pytest.mark.parametrize(("text", "stops", "kw", "out", "matched"), VLLM_CASES)
def test_stop_string_cases(text, stops, kw, out, matched, per_step):
    deltas, final, run = run_text(text, stops, per_step=per_step, **kw)
    assert "".join(deltas) == out
    if matched is None:
        assert final.finish_reason == FinishReason.length(len(b(text)))
        assert run.aborted == []
    else:
        assert final.finish_reason == FinishReason.stop(matched)
        # Engines do not know stop strings: the shard aborts the request, unless the engine
        # finished it in the same step anyway.
        steps = -(-len(b(text)) // per_step)
        stop_step = -(-final.completion_tokens // per_step)
        assert run.aborted == (["r"] if stop_step < steps else [])
    assert len(run.shard) == 0 and run.shard.live_slots == 0


def test_tokens_after_the_stop_in_a_step_are_dropped_and_counted_up_to_it():
    deltas, final, _ = run_text("abXYcd", ["XY"], per_step=6)
    assert "".join(deltas) == "ab"
    assert final.completion_tokens == 4  # a, b, X, Y
    assert final.token_ids == b("abXY")


def test_partial_stop_strings_never_reach_the_client():
    deltas, _final, _ = run_text("a STO STOX Sx STOP z", ["STOP"])
    assert "".join(deltas) == "a STO STOX Sx "
    streamed = ""
    for d in deltas:
        streamed += d
        # no delivered prefix ends with the beginning of "STOP" that later completed it
        assert not streamed.endswith(("S", "ST", "STO")) or streamed in ("a STO", "a STO STO")
    for d in deltas[:-1]:
        assert "STOP" not in d


def test_held_text_is_delivered_when_the_engine_finishes():
    deltas, final, _ = run_text("the end ST", ["STOP"])
    assert "".join(deltas) == "the end ST"
    assert final.text.endswith("ST")


def test_stop_regex():
    deltas, final, run = run_text("order 12345 now", None, stop_regex=[r"\d{3}"])
    assert "".join(deltas) == "order 123"  # the matched text stays
    assert final.finish_reason == FinishReason.stop(r"\d{3}")
    assert run.aborted == ["r"]


def test_stop_regex_spanning_delivered_text():
    # "ab" is delivered before "c" completes the match: regex matches may start in old text.
    deltas, final, _ = run_text("xxabcyy", None, stop_regex=["abc"])
    assert "".join(deltas) == "xxabc"
    assert final.finish_reason == FinishReason.stop("abc")


def test_string_and_regex_earliest_wins_strings_first_on_ties():
    deltas, final, _ = run_text("hello world", ["lo w"], stop_regex=["l+o"])
    assert "".join(deltas) == "hello" and final.finish_reason.matched() == "l+o"
    deltas, final, _ = run_text("hello world", ["llo"], stop_regex=["l+o"])
    assert "".join(deltas) == "he" and final.finish_reason.matched() == "llo"


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("no_trim", [False, True])
def test_eos_and_stop_token_ids(skip, no_trim):
    tok = byte_tokenizer()
    params = SamplingParams(
        skip_special_tokens=skip, no_stop_trim=no_trim, stop_token_ids=[ord("!")]
    )
    # EOS
    run = Run(tok, params)
    run.step(b("hi"))
    run.step([BYTE_EOS], {"type": "stop", "matched": BYTE_EOS})
    items = run.items()
    text = "".join(i.event.text for i in items)
    expected = "hi" + ("<eos>" if (no_trim and not skip) else "")
    assert text == expected
    assert items[-1].event.completion_tokens == 3
    assert items[-1].event.finish_reason.stop_reason(tok.eos_token_ids) is None
    assert run.aborted == []  # the engine stopped it itself
    # stop_token_ids: the stop token's text is not emitted unless no_stop_trim
    run = Run(tok, SamplingParams(no_stop_trim=no_trim, stop_token_ids=[ord("!")]))
    run.step(b("ok"))
    run.step(b("!"), {"type": "stop", "matched": ord("!")})
    items = run.items()
    assert "".join(i.event.text for i in items) == ("ok!" if no_trim else "ok")
    assert items[-1].event.finish_reason.stop_reason(tok.eos_token_ids) == ord("!")


def test_decode_error_ends_only_that_request():
    tok = byte_tokenizer()
    aborted: list[str] = []
    shard = DetokShard(aborted.append, padding="empty")  # the server's choice
    sinks = {r: EgressSink() for r in ("a", "b")}
    for r, s in sinks.items():
        shard.register(r, s, tok, b("p"), SamplingParams().normalize(tok))
    shard.on_frame(frame([("a", b("x"), None), ("b", b("y"), None)]))
    # 290: a padding id (no text, counted); 300: past the model's vocabulary (an error)
    shard.on_frame(frame([("a", [290], None), ("b", b("z"), None)]))
    shard.on_frame(frame([("a", [300], None), ("b", b("!"), {"type": "length", "length": 3})]))
    a_items = sinks["a"].drain()
    assert isinstance(a_items[-1], Error) and "300" in str(a_items[-1].error)
    assert "".join(i.event.text for i in a_items[:-1]) == "x"
    assert a_items[-2].event.completion_tokens == 2
    assert aborted == ["a"]
    b_items = sinks["b"].drain()
    assert "".join(i.event.text for i in b_items) == "yz!" and isinstance(b_items[-1], Done)
    assert len(shard) == 0 and shard.live_slots == 0


def test_padding_id_is_an_error_unless_the_shard_says_empty():
    """``DetokShard`` keeps ``DecodeStream``'s strict default; the server's runtime asks for
    ``padding="empty"`` (stock vLLM's output)."""
    from tokenwire.engine.synthetic import SyntheticEngine
    from tokenwire.runtime import Runtime
    from tokenwire.server import ServerConfig

    tok = byte_tokenizer()
    aborted: list[str] = []
    shard = DetokShard(aborted.append)
    sink = EgressSink()
    shard.register("a", sink, tok, b("p"), SamplingParams().normalize(tok))
    shard.on_frame(frame([("a", b("x"), None)]))
    shard.on_frame(frame([("a", [290], None)]))
    items = sink.drain()
    assert isinstance(items[-1], Error) and "padding" in str(items[-1].error)
    assert aborted == ["a"] and len(shard) == 0
    runtime = Runtime(tok, SyntheticEngine(tok), ServerConfig())
    assert runtime.shard.padding == "empty"


def test_malformed_frame_and_unknown_rids():
    tok = byte_tokenizer()
    aborted: list[str] = []
    shard = DetokShard(aborted.append)
    sink = EgressSink()
    shard.register("a", sink, tok, [], SamplingParams().normalize(tok))
    shard.on_frame(frame([("ghost", b("x"), None)]))  # late chunk for an unknown rid: dropped
    assert sink.drain() == []
    bad = decode_batch_frame(encode_batch_frame([["a", "ghost"], [None, None], [1, 1], [5, 5]], []))
    assert not bad.ok
    shard.on_frame(bad)
    (item,) = sink.drain()
    assert isinstance(item, Error)
    assert str(item.error) == "internal error: malformed engine output frame"
    assert len(shard) == 0
    # The request is ended in the engine too (no zombie decoding outside the concurrency limit);
    # a rid the shard does not know is not its to abort.
    assert aborted == ["a"]


def test_backpressure_merges_and_delivers_everything():
    tok = byte_tokenizer()
    run = Run(tok, SamplingParams(stop=["QQ"]), capacity=2)
    text = "slow client, fast engine. " * 20
    ids = b(text)
    for i, t in enumerate(ids):
        run.step([t], {"type": "length", "length": len(ids)} if i == len(ids) - 1 else None)
    items = run.items()
    assert len(items) == 2  # everything merged into the newest pending item
    assert isinstance(items[-1], Done)
    assert "".join(i.event.text for i in items) == text
    assert sum(len(i.event.token_ids) for i in items) == len(ids)
    assert items[-1].event.completion_tokens == len(ids)
    assert run.aborted == []


def test_backpressure_cap_ends_the_request():
    tok = byte_tokenizer()
    run = Run(tok, SamplingParams(), capacity=1, max_pending=10)
    for t in b("0123456789abcdef"):
        run.step([t])
    items = run.items()
    assert isinstance(items[-1], Error) and items[-1].error.status == 429
    assert run.aborted == ["r"]
    assert len(run.shard) == 0
    assert sum(len(i.event.text) for i in items[:-1]) <= 10


def test_a_client_that_stopped_reading_is_abandoned():
    tok = byte_tokenizer()
    run = Run(tok, SamplingParams(), capacity=1, max_stall=30.0)
    abandoned = []
    run.sink.on_abandon = lambda: abandoned.append(True)
    for t in b("abc"):
        run.step([t])  # merged into the pending item: the client is not idle for long yet
    assert run.aborted == [] and len(run.shard) == 1
    run.sink._taken_at -= 31  # nothing taken for longer than max_stall
    run.step(b("d"))
    assert run.aborted == ["r"] and len(run.shard) == 0 and abandoned == [True]
    items = run.items()
    assert isinstance(items[-1], Error) and "has not read" in str(items[-1].error)
    assert "".join(i.event.text for i in items[:-1]) == "abc"


def test_closed_sink_aborts():
    tok = byte_tokenizer()
    run = Run(tok, SamplingParams())
    run.step(b("a"))
    run.sink.close()
    run.step(b("b"))
    assert run.aborted == ["r"] and len(run.shard) == 0
    run.step(b("c"))  # late: dropped
    assert run.aborted == ["r"]


def test_fail_and_abort():
    tok = byte_tokenizer()
    aborted: list[str] = []
    shard = DetokShard(aborted.append)
    s1, s2 = EgressSink(), EgressSink()
    shard.register("a", s1, tok, [], SamplingParams().normalize(tok))
    shard.register("b", s2, tok, [], SamplingParams().normalize(tok))
    from tokenwire.messages.errors import InternalError

    shard.fail("a", InternalError("engine crashed"))
    assert isinstance(s1.drain()[-1], Error) and aborted == []
    assert shard.abort("b") and aborted == ["b"]
    assert not shard.abort("b")
    assert len(shard) == 0 and shard.live_slots == 0


# ---- streamed == non-streamed on real tokenizers -------------------------------------------------

CORPUS_NAMES = ["qwen3", "llama2", "gemma3", "minilm_bert"]


def _reference(tok, prompt, ids, stops, min_new, no_trim, skip):
    """Non-streaming: decode the whole output, find the first token at which a stop completes."""
    head = tok.decode([i for i in prompt if tok.is_known(i)], skip)
    stable = ""  # text of whole characters so far (a trailing partial one is not text yet)
    full = ""
    for k in range(1, len(ids) + 1):
        full = tok.decode(prompt + ids[:k], skip)[len(head) :]
        now = full if k == len(ids) else full.rstrip("\ufffd")
        if k > min_new and len(now) > len(stable):
            best = None
            for rank, s in enumerate(stops):
                p = now.find(s, max(0, len(stable) - len(s) + 1))
                if p >= 0 and (best is None or p + len(s) < best[0]):
                    best = (p + len(s), rank, p, s)
            if best is not None:
                cut = best[0] if no_trim else best[2]
                return now[:cut], best[3], k
        stable = max(stable, now, key=len)
    return full, None, len(ids)


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_streamed_equals_non_streamed(name):
    tok = real_tokenizer(name)
    from test_decode_exact import CORPUS

    ids_all = tok.encode(CORPUS, add_special_tokens=False)

    @settings(max_examples=examples(60), suppress_health_check=list(HealthCheck), deadline=None)
    @given(st.data())
    def run(data):
        a = data.draw(st.integers(0, len(ids_all) - 80))
        n = data.draw(st.integers(1, 60))
        prompt, ids = ids_all[max(0, a - 8) : a], ids_all[a : a + n]
        skip = data.draw(st.booleans())
        # (A prompt that ends inside a character is DecodeStream's business, tested there.)
        assume(not tok.decode(prompt, skip).endswith("\ufffd"))
        text = tok.decode(prompt + ids, skip)[len(tok.decode(prompt, skip)) :]
        # (Nor one cut inside a character: byte-fallback decodes then rewrite the whole run.)
        assume(not text.endswith("\ufffd"))
        stops = []
        for _ in range(data.draw(st.integers(0, 3))):
            if len(text) >= 2:
                i = data.draw(st.integers(0, len(text) - 2))
                stops.append(text[i : i + data.draw(st.integers(1, 6))])
        stops = [s for s in stops if s] or None
        min_new = data.draw(st.integers(0, 5))
        no_trim = data.draw(st.booleans())
        params = dict(
            stop=stops, min_new_tokens=min_new, no_stop_trim=no_trim, skip_special_tokens=skip
        )
        results = []
        for per_step in (1, len(ids)):
            sink = EgressSink(capacity=10_000)
            shard = DetokShard()
            shard.register("r", sink, tok, prompt, SamplingParams(**params).normalize(tok))
            for i in range(0, len(ids), per_step):
                last = i + per_step >= len(ids)
                fin = {"type": "length", "length": len(ids)} if last else None
                shard.on_frame(frame([("r", ids[i : i + per_step], fin)], len(prompt)))
                if "r" not in shard:
                    break
            items = sink.drain()
            assert isinstance(items[-1], Done)
            out = "".join(i.event.text for i in items)
            results.append((out, items[-1].event.finish_reason, items[-1].event.completion_tokens))
            for it in items[:-1]:
                assert isinstance(it, Frame)
        assert results[0] == results[1]
        ref_text, ref_matched, ref_count = _reference(
            tok, prompt, ids, stops or [], min_new, no_trim, skip
        )
        out, fin, count = results[0]
        assert out == ref_text
        assert fin.matched() == ref_matched if ref_matched is not None else fin.kind == "length"
        assert count == ref_count

    run()


def test_a_step_is_queued_once_for_all_its_sinks():
    """The fast step queues one shared object in every sink; each consumer still gets its own
    request's ``Frame``, also after its slot went to a newer request."""
    tok = byte_tokenizer()
    shard = DetokShard()
    sinks = {rid: EgressSink() for rid in "abc"}
    for rid in "ab":
        shard.register(rid, sinks[rid], tok, b("> "), SamplingParams(stop=["QQ"]).normalize(tok))

    def step(rows, prompts):
        header = [[r[0] for r in rows], [r[2] for r in rows], prompts, [1] * len(rows)]
        shard.on_frame(decode_batch_frame(encode_batch_frame(header, [[r[1] for r in rows]])))

    step([("a", b("x")[0], None), ("b", b("y")[0], None)], [2, 5])
    assert sinks["a"]._dq[0] is sinks["b"]._dq[0]  # one object for the whole step
    step([("a", b("z")[0], {"type": "length", "length": 2}), ("b", b("w")[0], None)], [2, 5])
    shard.register("c", sinks["c"], tok, b("> "), SamplingParams().normalize(tok))
    step([("c", b("v")[0], None), ("b", b("u")[0], None)], [9, 5])  # c has a's old slot
    got = {rid: sink.drain() for rid, sink in sinks.items()}
    assert [(i.rid, i.text, i.token_ids, i.completion_tokens) for i in got["a"]] == [
        ("a", "x", b("x"), 1),
        ("a", "z", b("z"), 2),
    ]
    assert isinstance(got["a"][-1], Done) and all(type(i) is Frame for i in got["b"])
    assert "".join(i.text for i in got["b"]) == "ywu" and got["b"][-1].completion_tokens == 3
    assert [i.prompt_tokens for i in got["b"]] == [5, 5, 5]
    assert [(i.rid, i.text, i.prompt_tokens) for i in got["c"]] == [("c", "v", 9)]


def test_many_requests_stepping_together_match_single_runs():
    """The columnar step (shared pre-checks, hold-back, exact path for a few) gives every request
    what it gets alone."""
    tok = real_tokenizer("qwen3")
    from test_decode_exact import CORPUS

    ids_all = tok.encode(CORPUS, add_special_tokens=False)
    rng = __import__("random").Random(7)

    def single(prompt, ids, params):
        sink = EgressSink(capacity=10_000)
        shard = DetokShard()
        shard.register("r", sink, tok, prompt, SamplingParams(**params).normalize(tok))
        for i, t in enumerate(ids):
            fin = {"type": "length", "length": len(ids)} if i == len(ids) - 1 else None
            shard.on_frame(frame([("r", [t], fin)], len(prompt)))
            if "r" not in shard:
                break
        items = sink.drain()
        return "".join(i.event.text for i in items), items[-1].event.finish_reason.to_json()

    corpus_text = tok.decode(ids_all)
    step_ = max(1, (len(corpus_text) - 4) // 10)
    pool = [corpus_text[i : i + 1 + i % 3] for i in range(0, len(corpus_text) - 4, step_)]
    for round_ in range(4):
        shared = round_ < 2  # then: so many different stops that each request checks its own
        reqs = []
        for k in range(40):
            a = rng.randrange(0, len(ids_all) - 120)
            prompt, ids = ids_all[a - 6 if a >= 6 else 0 : a], ids_all[a : a + rng.randint(5, 100)]
            text = tok.decode(ids)
            params: dict = {}
            if k % 4 != 0 and len(text) > 3:
                i = rng.randrange(len(text) - 2)
                own = rng.choice(pool) if shared else text[i : i + rng.randint(1, 4)]
                params["stop"] = [own, "\n\nHuman:", " the"][: 1 + k % 3]
            if k % 7 == 0:
                params["stop_regex"] = [r"\d{2}"]
            if k % 5 == 0:
                params["min_new_tokens"] = 3
            reqs.append((f"q{k}", prompt, ids, params))
        sink_of = {rid: EgressSink(capacity=10_000) for rid, *_ in reqs}
        shard = DetokShard()
        for rid, prompt, _ids, params in reqs:
            shard.register(rid, sink_of[rid], tok, prompt, SamplingParams(**params).normalize(tok))
        if shared:  # the step-wide pre-check is in use
            assert not shard._precheck().per_request
        step = 0
        while True:
            rows = []
            for rid, _prompt, ids, _params in reqs:
                if step < len(ids) and rid in shard:
                    fin = {"type": "length", "length": len(ids)} if step == len(ids) - 1 else None
                    rows.append((rid, [ids[step]], fin))
            if not rows:
                break
            shard.on_frame(frame(rows))
            step += 1
        for rid, prompt, ids, params in reqs:
            items = sink_of[rid].drain()
            got = "".join(i.event.text for i in items), items[-1].event.finish_reason.to_json()
            assert got == single(prompt, ids, params), (rid, params)
        assert len(shard) == 0 and shard.live_slots == 0


@pytest.mark.parametrize("per_step", [1, 2])
def test_cached_and_reasoning_tokens_reach_the_final_item(per_step):
    from tokenwire.messages.frames import LAYOUT_SGLANG_0_5_23

    tok = byte_tokenizer()
    run = Run(tok, SamplingParams())
    ids = b("abcd")
    for i in range(0, 4, per_step):
        last = i + per_step >= 4
        header = [["r"], [{"type": "length", "length": 4} if last else None], [2], [per_step]]
        header += [[1], [i + per_step]] + [[]] * 12 + [["v"], [0], [0], [0], [0.0]]
        run.shard.on_frame(
            decode_batch_frame(
                encode_batch_frame(header, [ids[i : i + per_step]], layout=LAYOUT_SGLANG_0_5_23)
            )
        )
    items = run.items()
    assert "".join(it.text for it in items) == "abcd"
    assert (items[-1].cached_tokens, items[-1].reasoning_tokens) == (1, 4)


@pytest.mark.parametrize("per_step", [1, 3])
@pytest.mark.parametrize(
    ("text", "pattern", "out", "matched"),
    [
        ("abc then more", r"^abc$", "abc", True),  # the output so far is exactly abc
        ("xxabc then more", r"^abc$", "xxabc then more", False),  # never at the output's start
        ("one swordfish, one word here", r"\bword\b", "one swordfish, one word", True),
        ("naïve éword word.", r"\bword\b", "naïve éword word", True),  # é is a word character
        ("Done. More text", r"[.!?]\s*$", "Done.", True),
        ("a b", r"\s+$", "a ", True),
        ("anything", "", "", True),
        ("12 ab", r"^\d+ ", "12 ", True),
        ("ab 12 ", r"^\d+ ", "ab 12 ", False),
        ("ax. axe", r"x\B", "ax. ax", True),  # the word character after the match comes later
        ("hi! .!x", r"[.!]\b", "hi! .!", True),
    ],
)
def test_stop_regex_anchors_and_boundaries(text, pattern, out, matched, per_step):
    deltas, final, _ = run_text(text, [], stop_regex=pattern, per_step=per_step)
    assert "".join(deltas) == out
    if matched:
        assert final.finish_reason == FinishReason.stop(pattern)
    else:
        assert final.finish_reason.kind == "length"


@pytest.mark.parametrize(
    ("interval", "per_step", "sent_at"),
    [
        (1, 1, list(range(1, 11))),
        (3, 1, [1, 4, 7, 10]),  # SGLang's points 1, N + 1, 2N + 1..., then the end
        (4, 1, [1, 5, 9, 10]),
        (3, 2, [2, 4, 8, 10]),  # a step of several tokens goes out if it reaches a point
        (20, 1, [1, 10]),
    ],
)
def test_stream_interval(interval, per_step, sent_at):
    tok = byte_tokenizer()
    run = Run(tok, SamplingParams(stream_interval=interval, stop=["zz"]))
    ids = b("abcdefghij")
    for i in range(0, 10, per_step):
        last = i + per_step >= 10
        run.step(ids[i : i + per_step], {"type": "length", "length": 10} if last else None)
    items = run.items()
    assert [it.completion_tokens for it in items] == sent_at
    assert "".join(it.text for it in items) == "abcdefghij"
    assert [t for it in items for t in it.token_ids] == ids
    assert isinstance(items[-1], Done) and len(run.shard) == 0


def test_stream_interval_with_a_stop_string_ends_at_once():
    tok = byte_tokenizer()
    run = Run(tok, SamplingParams(stream_interval=4, stop=["de"]))
    for c in b("abcdefgh"):
        run.step([c])
        if "r" not in run.shard:
            break
    items = run.items()
    assert [it.completion_tokens for it in items] == [1, 5]
    assert "".join(it.text for it in items) == "abc"
    assert items[-1].finish_reason == FinishReason.stop("de")
    assert run.aborted == ["r"]


def _held_reference(text: str, stops: list[str]) -> str:
    """What may be delivered of ``text`` (no stop string in it): all but its longest end that is
    a proper prefix of one of ``stops``."""
    keep = max(
        (k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])),
        default=0,
    )
    return text[: len(text) - keep]


@pytest.mark.parametrize("mode", ["small", "columnar", "each", "per_request"])
def test_batched_hold_back_matches_brute_force_after_every_step(mode, monkeypatch):
    """Many requests with their own stop strings (or none) step together: after every step, what
    each has delivered is its text so far less the longest end that may start one of its own stop
    strings, and a stop ends it where the first match ends. Candidates found in Python or with
    numpy, their ends looked up in the prefix table or run through their own automata, and each
    request checked on its own, all agree with brute force."""
    import tokenwire.shard.fast_step as shard_mod

    if mode != "small":  # the candidates found with numpy
        monkeypatch.setattr(shard_mod, "_SMALL_STEP", 0)
    if mode == "each":
        monkeypatch.setattr(shard_mod, "_MAX_SHARED_PREFIXES", 0)
    elif mode == "per_request":
        monkeypatch.setattr(shard_mod, "_MAX_SHARED_STOPS", 0)
    tok = byte_tokenizer()
    alphabet = "ab\nc"

    @settings(max_examples=examples(60), suppress_health_check=list(HealthCheck), deadline=None)
    @given(st.data())
    def run(data):
        count = data.draw(st.integers(1, 6))
        word = st.text(alphabet, min_size=1, max_size=5)
        reqs = []
        for k in range(count):
            stops = data.draw(st.lists(word, max_size=3))
            text = data.draw(st.text(alphabet, min_size=1, max_size=24))
            reqs.append((f"q{k}", stops, text))
        shard = DetokShard()
        sinks = {rid: EgressSink(capacity=10_000) for rid, _, _ in reqs}
        for rid, stops, _ in reqs:
            params = SamplingParams(stop=stops or None).normalize(tok)
            shard.register(rid, sinks[rid], tok, b("> "), params)
        got = {rid: "" for rid, _, _ in reqs}
        for t in range(max(len(text) for _, _, text in reqs)):
            rows = [
                (
                    rid,
                    b(text[t]),
                    {"type": "length", "length": len(text)} if t == len(text) - 1 else None,
                )
                for rid, _, text in reqs
                if t < len(text) and rid in shard
            ]
            if not rows:
                break
            shard.on_frame(frame(rows))
            for rid, stops, text in reqs:
                items = sinks[rid].drain()
                got[rid] += "".join(i.event.text for i in items)
                so_far = text[: t + 1]
                ends = [(so_far.find(s) + len(s), r, s) for r, s in enumerate(stops) if s in so_far]
                if ends:  # stopped: the text before the first match to complete
                    _, _, s = min(ends)
                    assert got[rid] == so_far[: so_far.find(s)], (rid, stops, text)
                    assert rid not in shard
                elif t < len(text) - 1:
                    assert got[rid] == _held_reference(so_far, stops), (rid, stops, text, t)
                elif t == len(text) - 1:
                    assert got[rid] == text and isinstance(items[-1], Done)
        assert len(shard) == 0

    run()


def test_requests_that_come_and_go_between_identical_steps_get_their_own_text():
    """A step names the same request ids as the last one, but the requests behind them were
    ended and registered again, in other slots: each gets its own text."""
    tok = byte_tokenizer()
    shard = DetokShard()
    sinks = {rid: EgressSink(capacity=100) for rid in ("a", "b")}
    for rid in ("a", "b"):
        shard.register(rid, sinks[rid], tok, b("> "), SamplingParams().normalize(tok))
    shard.on_frame(frame([("a", b("x"), None), ("b", b("y"), None)]))
    assert shard.abort("a") and shard.abort("b")
    again = {rid: EgressSink(capacity=100) for rid in ("a", "b")}
    for rid in ("a", "b"):  # (slots are reused last freed first: they swap)
        shard.register(rid, again[rid], tok, b("> "), SamplingParams().normalize(tok))
    shard.on_frame(frame([("a", b("p"), None), ("b", b("q"), None)]))
    shard.on_frame(frame([("a", b("r"), None), ("b", b("s"), None)]))
    assert "".join(i.event.text for i in again["a"].drain()) == "pr"
    assert "".join(i.event.text for i in again["b"].drain()) == "qs"


def _run_sizes(text: str, stops: list[str], sizes: list[int], min_new: int):
    """``text`` one byte token at a time, in steps of ``sizes`` tokens (cycled): the text
    delivered, the final event's finish reason and completion tokens."""
    tok = byte_tokenizer()
    run = Run(tok, SamplingParams(stop=stops, min_new_tokens=min_new))
    ids = b(text)
    i = k = 0
    while i < len(ids) and "r" in run.shard:
        n = sizes[k % len(sizes)]
        k += 1
        chunk = ids[i : i + n]
        i += n
        run.step(chunk, {"type": "length", "length": len(ids)} if i >= len(ids) else None)
    items = run.items()
    final = items[-1].event
    return "".join(it.event.text for it in items), final.finish_reason, final.completion_tokens


#: Text whose tokens are not all their own text: a first token after the prompt, characters of
#: several bytes in pieces (byte fallback, split emoji), combining marks, indentation.
MIXED_TEXT = "Hello, wörld! 日本語のテキスト 🙂👍🏽🇫🇷 e\u0301 ```py\n    x = 1\n``` end  "


@pytest.mark.parametrize("skip_special", [True, False])
def test_several_token_steps_on_real_tokenizers_give_one_token_steps_text(
    any_tokenizer, skip_special
):
    # A step of several tokens a request (merged engine steps) decodes them through the
    # request's stream, whose tables give a token's text only while it holds nothing back (not
    # on its first step, nor with a character still in pieces): what reaches the client is the
    # text of one-token steps.
    tok = any_tokenizer
    special = sorted(tok.special_ids)[:2]
    ids = [*tok.encode(MIXED_TEXT, add_special_tokens=False), *special]
    ids += tok.encode(" and after", add_special_tokens=False)

    def text_in_steps(prompt: list[int], size: int) -> str:
        run = Run(tok, SamplingParams(skip_special_tokens=skip_special), prompt=prompt)
        for i in range(0, len(ids), size):
            done = {"type": "length", "length": len(ids)} if i + size >= len(ids) else None
            run.step(ids[i : i + size], done)
        return "".join(item.event.text for item in run.items())

    # Prompts after which the first tokens' text is not their own: none (a leading space to
    # strip, for some), and one ending in the first byte of a character of three.
    lead = tok.token_to_id("<0xE6>")
    lead = tok.token_to_id("\u00e6") if lead is None else lead
    prompts = [tok.encode("> ", add_special_tokens=False), []]
    if lead is not None:
        prompts.append([*prompts[0], lead])
    for prompt in prompts:
        one = text_in_steps(prompt, 1)
        assert one.endswith(" and after") and "x = 1" in one, one
        for size in (2, 3, 7, len(ids)):
            assert text_in_steps(prompt, size) == one, (tok.name, prompt, size)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.text(alphabet="ab \n", min_size=1, max_size=40),
    stops=st.lists(st.text(alphabet="ab \n", min_size=1, max_size=4), max_size=3),
    sizes=st.lists(st.integers(1, 7), min_size=1, max_size=12),
    min_new=st.integers(0, 6),
)
def test_steps_of_several_tokens_match_one_token_steps(text, stops, sizes, min_new):
    # Steps read together reach the shard as steps of several tokens a request: what it
    # delivers, where it stops and what it counts are those of the same tokens one per step.
    assert _run_sizes(text, stops, sizes, min_new) == _run_sizes(text, stops, [1], min_new)
