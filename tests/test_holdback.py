"""HoldBack: the held text is exactly the longest suffix that is a proper prefix of a stop string,
however the text arrives; and long stop strings cost linear state, not quadratic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire import SamplingParams, ValidationError
from tokenwire.messages.sampling import DEFAULT_MAX_STOP_STR_LEN
from tokenwire.shard.holdback import HoldBack, prefix_function

from conftest import examples
from test_shard import run_text


def brute_held(text: str, stops: list[str]) -> str:
    best = ""
    for s in stops:
        for k in range(len(s) - 1, 0, -1):
            if text.endswith(s[:k]):
                if k > len(best):
                    best = s[:k]
                break
    return best


def test_prefix_function():
    assert prefix_function("abab") == (0, 0, 1, 2)
    assert prefix_function("aaaa") == (0, 1, 2, 3)
    assert prefix_function("abcab") == (0, 0, 0, 1, 2)


small_text = st.text(alphabet="ab c", max_size=40)


@settings(max_examples=examples(400))
@given(
    stops=st.lists(st.text(alphabet="ab c", min_size=1, max_size=8), min_size=1, max_size=4),
    chunks=st.lists(small_text, max_size=12),
)
def test_held_text_matches_brute_force_over_any_chunking(stops, chunks):
    hb = HoldBack(stops)
    seen = ""
    delivered = ""
    for chunk in chunks:
        seen += chunk
        delivered += hb.push(hb.held + chunk)
        assert hb.held == brute_held(seen, stops)
        assert delivered + hb.held == seen
    assert delivered + hb.release() == seen
    assert hb.held == "" and hb.push("") == ""


def test_long_periodic_stop_string():
    stop = "a" * 1000 + "b"
    hb = HoldBack([stop])
    out = hb.push("a" * 5000)
    assert hb.held == "a" * 1000 and out == "a" * 4000
    out = hb.push(hb.held + "a")
    assert out == "a" and hb.held == "a" * 1000
    assert hb.push(hb.held + "c") == "a" * 1000 + "c" and hb.held == ""


def test_state_is_linear_in_the_stop_length():
    stop = "ab" * (DEFAULT_MAX_STOP_STR_LEN // 2)
    hb = HoldBack([stop])
    assert sum(len(pi) for pi in hb._pis) == len(stop)


def test_the_shard_stops_on_a_long_stop_string_and_never_leaks_its_start():
    stop = "x" * 600 + "!"
    text = "hello " + "x" * 900 + "! after"
    deltas, final, _ = run_text(text, [stop], per_step=7)
    assert "".join(deltas) == "hello " + "x" * 300
    assert final.finish_reason.matched() == stop
    deltas, final, _ = run_text("hello " + "x" * 900 + " no", [stop], per_step=5)
    assert "".join(deltas) == "hello " + "x" * 900 + " no"


def test_stop_strings_longer_than_the_limit_are_refused_naming_the_field():
    SamplingParams(stop=["é" * (DEFAULT_MAX_STOP_STR_LEN // 2)]).normalize(_tok())
    with pytest.raises(ValidationError) as err:
        SamplingParams(stop=["é" * (DEFAULT_MAX_STOP_STR_LEN // 2 + 1)]).normalize(_tok())
    assert err.value.param == "stop" and "bytes" in str(err.value)
    with pytest.raises(ValidationError):
        SamplingParams(stop="abcdef").normalize(_tok(), max_stop_str_len=5)
    SamplingParams(stop="abcde").normalize(_tok(), max_stop_str_len=5)


def _tok():
    from helpers import byte_tokenizer

    return byte_tokenizer()


def test_a_huge_stop_string_is_a_400_and_the_server_lives_on():
    import httpx

    from tokenwire.engine.synthetic import SyntheticConfig
    from tokenwire.server.config import RequestLimits

    from test_server_e2e import MODEL, serve

    with serve(SyntheticConfig(output="echo"), limits=RequestLimits(max_stop_str_len=64)) as srv:
        for path, body in (
            ("/v1/completions", {"model": MODEL, "prompt": "hi", "stop": ["x" * 1_000_000]}),
            ("/generate", {"text": "hi", "sampling_params": {"stop": "y" * 65}}),
        ):
            resp = httpx.post(srv.url + path, json=body, timeout=30)
            assert resp.status_code == 400
            assert resp.json()["error"]["param"] == "stop"
        resp = httpx.post(
            srv.url + "/v1/completions",
            json={"model": MODEL, "prompt": "hello there", "stop": ["z" * 64], "max_tokens": 3},
        )
        assert resp.status_code == 200
        assert httpx.get(srv.url + "/health").status_code == 200
