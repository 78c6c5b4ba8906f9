"""``stream_interval`` end to end: SGLang's /generate streams every N tokens."""

from __future__ import annotations

import httpx
import msgspec

from tokenwire.engine.synthetic import SyntheticConfig

from test_server_e2e import serve


def test_generate_streams_every_n_tokens():
    # Steps far apart: the client takes each chunk before the next comes (chunks that wait
    # together go out as their newest one, so an engine outpacing the client sends fewer).
    with serve(SyntheticConfig(output="echo", step_time=0.02)) as srv:
        text = "one two three four five six seven eight nine ten eleven twelve"
        assert len(srv.tok.encode(text)) >= 10
        body = {
            "text": text,
            "stream": True,
            "sampling_params": {"max_new_tokens": 10, "stream_interval": 4},
        }
        with httpx.stream("POST", srv.url + "/generate", json=body) as resp:
            lines = [ln[6:] for ln in resp.read().decode().split("\n") if ln.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        bodies = [msgspec.json.decode(x) for x in lines[:-1]]
        assert [b["meta_info"]["completion_tokens"] for b in bodies] == [1, 5, 9, 10]
        assert bodies[-1]["text"] == srv.tok.decode(srv.tok.encode(text)[:10])
        every = httpx.post(
            srv.url + "/generate", json=body | {"sampling_params": {"max_new_tokens": 10}}
        )
        assert every.text.count("data: {") == 10
