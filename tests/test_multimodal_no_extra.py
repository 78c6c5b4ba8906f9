"""A server without ``tokenwire[multimodal]``: text requests as before, an image a 400 that
names the extra (no media workers are started)."""

from __future__ import annotations

import httpx

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.multimodal import MediaLimits
from tokenwire.multimodal.processing import synthetic_media
from tokenwire.runtime import Features
from tokenwire.tokenizer import Tokenizer

from served import MODEL, serve


def test_an_image_names_the_extra(monkeypatch):
    import tokenwire.runtime.runtime as runtime

    monkeypatch.setattr(runtime, "extra_installed", lambda: False)
    media = synthetic_media(Tokenizer.default().token_to_id, MODEL)
    features = Features(media=media, media_limits=MediaLimits(media.modalities))
    with serve(SyntheticConfig(), features=features) as served:
        assert served.runtime.media_pool is None
        part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [part]}]}
        out = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=30)
        assert out.status_code == 400
        assert 'pip install "tokenwire[multimodal]"' in out.json()["error"]["message"]
        body["messages"] = [{"role": "user", "content": "hi"}]
        assert httpx.post(f"{served.url}/v1/chat/completions", json=body).status_code == 200
