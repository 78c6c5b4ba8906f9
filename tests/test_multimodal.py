"""Multimodal inputs without an engine: each API's media parts, the limits, media decoding and
fetching with every bad input a 400, and vLLM's own frontend as the reference for the prompt
ids, the mm hashes, the processed tensors and the ``mm_features`` wire layout."""

from __future__ import annotations

import http.server
import struct
import threading
import time
import zlib

import msgspec
import numpy as np
import pytest

from mm_helpers import data_url, needs_extra, png, vllm_env, vllm_reference
from tokenwire.messages.errors import ValidationError
from tokenwire.multimodal import MediaItem, MediaLimits, parse_limit_mm_per_prompt
from tokenwire.multimodal.hashing import ImageBytes, mm_hash
from tokenwire.multimodal.layout import MMFeature, wire_features
from tokenwire.multimodal.media import decode_data_url, load_image
from tokenwire.multimodal.parts import (
    anthropic_image,
    chat_media_part,
    generate_media,
    responses_media_part,
)
from tokenwire.multimodal.processing import (
    expand_placeholders,
    model_media,
    process_image,
    synthetic_media,
)
from tokenwire.runtime.media_fetch import FetchRules, fetch_media
from tokenwire.tokenizer import Tokenizer

pytestmark = needs_extra

IMAGE_PAD, VISION_START, VISION_END = 151655, 151652, 151653


# ---- parts ---------------------------------------------------------------------------------------


def test_chat_parts_as_the_peers_send_them():
    assert chat_media_part({"type": "image_url", "image_url": {"url": "https://x/a.png"}}, "m") == (
        MediaItem("image", "https://x/a.png", "m")
    )
    audio = chat_media_part(
        {"type": "input_audio", "input_audio": {"data": "QUJD", "format": "wav"}}, "m"
    )
    assert audio.modality == "audio" and audio.url == "data:audio/wav;base64,QUJD"
    assert (
        chat_media_part({"type": "video_url", "video_url": {"url": "https://v"}}, "m").modality
        == "video"
    )
    with pytest.raises(ValidationError, match=r"image_embeds.*embeddings are not accepted"):
        chat_media_part({"type": "image_embeds", "image_embeds": "x"}, "m")
    with pytest.raises(ValidationError, match=r"m\.image_url\.url must be"):
        chat_media_part({"type": "image_url", "image_url": {}}, "m")


def test_responses_and_messages_parts():
    url = data_url(b"x")
    assert responses_media_part({"type": "input_image", "image_url": url}, "i").url == url
    f = responses_media_part({"type": "input_file", "file_data": "QUJD", "filename": "a.png"}, "i")
    assert f.url == "data:image/png;base64,QUJD"
    with pytest.raises(ValidationError, match="only image files"):
        responses_media_part(
            {"type": "input_file", "file_data": "data:application/pdf;base64,QQ=="}, "i"
        )
    with pytest.raises(ValidationError, match="file_id is not supported"):
        responses_media_part({"type": "input_image", "file_id": "file-1"}, "i")
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"},
    }
    assert anthropic_image(block, "b").url == "data:image/png;base64,QUJD"
    assert anthropic_image({"source": {"type": "url", "url": "https://x"}}, "b").url == "https://x"
    with pytest.raises(ValidationError, match="media_type must be an image type"):
        anthropic_image(
            {"source": {"type": "base64", "media_type": "text/plain", "data": "QQ"}}, "b"
        )


def test_generate_media_forms():
    assert generate_media({"text": "x"}) is None
    one = generate_media({"image_data": "https://x/a.png"})
    assert one == [[MediaItem("image", "https://x/a.png", "image_data[0]")]]
    batch = generate_media({"image_data": [["QUJD"], ["/tmp/a.png"]]})
    assert [i.url for items in batch for i in items] == [
        "data:image/unknown;base64,QUJD",
        "file:///tmp/a.png",
    ]
    with pytest.raises(ValidationError):
        generate_media({"image_data": [12]})


def test_limits():
    assert parse_limit_mm_per_prompt('{"image": 2, "video": {"count": 0}}') == {
        "image": 2,
        "video": 0,
    }
    for bad in ('{"smell": 1}', '{"image": -1}', "[1]"):
        with pytest.raises(ValueError):
            parse_limit_mm_per_prompt(bad)
    limits = MediaLimits(frozenset({"image"}), {"image": 1})
    item = MediaItem("image", "u", "messages[0].content[0]")
    limits.check([item])
    with pytest.raises(ValidationError, match="at most 1 image"):
        limits.check([item, item])
    with pytest.raises(ValidationError, match="does not accept audio"):
        limits.check([MediaItem("audio", "u", "f")])
    with pytest.raises(ValidationError, match="a text-only model does not accept image"):
        MediaLimits(frozenset()).check([item])


# ---- decoding ------------------------------------------------------------------------------------


def test_bad_images_are_400s():
    good = png(40, 30)
    image, hashed = load_image(good, "f", "p")
    assert image.size == (40, 30) and image.mode == "RGB" and hashed.io_config is None
    rgba, hashed = load_image(png(8, 8, mode="RGBA"), "f", "p")
    assert rgba.mode == "RGB" and hashed.io_config == {
        "image_mode": "RGB",
        "rgba_background_color": (255, 255, 255),
    }
    for data, why in (
        (good[: len(good) // 2], "cannot decode"),  # truncated
        (b"not an image at all", "cannot decode"),
        (b"%PDF-1.4 \x00\x01", "cannot decode"),
    ):
        with pytest.raises(ValidationError, match=why):
            load_image(data, "messages[0].content[0]", "messages")


def _bomb(width: int, height: int) -> bytes:
    """A PNG header claiming ``width`` x ``height`` with a few hundred bytes of deflate: a
    decompression bomb (a zip bomb inside the image)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (1 + width // 8) * 64, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def test_decompression_bomb_is_refused_before_decoding():
    bomb = _bomb(12000, 12000)  # 144 M pixels in a few hundred bytes
    assert len(bomb) < 2000
    with pytest.raises(ValidationError, match=r"12000x12000 .* over the limit of 10000000"):
        load_image(bomb, "f", "p", max_pixels=10_000_000)
    with pytest.raises(ValidationError, match="too large to decode"):  # (Pillow's own guard)
        load_image(_bomb(60000, 60000), "f", "p")


def test_data_urls():
    assert decode_data_url("data:image/png;base64,QUJD", "f", "p") == ("image/png", b"ABC")
    for bad in ("data:image/png;base64,@@@", "data:image/png,QUJD", "data:nocomma"):
        with pytest.raises(ValidationError):
            decode_data_url(bad, "f", "p")


# ---- fetching ------------------------------------------------------------------------------------


class _Media(http.server.BaseHTTPRequestHandler):
    image = b""

    def do_GET(self):
        if self.path == "/a.png":
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.image)))
            self.end_headers()
            self.wfile.write(self.image)
        elif self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.path.split("to=", 1)[1])
            self.end_headers()
        elif self.path == "/slow":
            self.send_response(200)
            self.end_headers()
            for _ in range(40):
                self.wfile.write(b"x" * 10)
                self.wfile.flush()
                time.sleep(0.1)
        elif self.path == "/huge":
            self.send_response(200)
            self.end_headers()
            for _ in range(64):
                self.wfile.write(b"x" * 65536)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def media_server():
    _Media.image = png(20, 20)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Media)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_loopback_and_private_urls_are_refused(media_server):
    rules = FetchRules()
    for url in (
        f"http://{media_server}/a.png",
        "http://169.254.169.254/latest/meta-data/",  # link-local (cloud metadata)
        "http://10.0.0.1/a.png",
        "http://[::1]/a.png",
        "http://0.0.0.0/a.png",
    ):
        with pytest.raises(ValidationError, match="private, loopback or link-local"):
            fetch_media(url, "image", rules, "f", "p")


def test_allowed_host_by_name_and_redirects(media_server):
    port = media_server.split(":")[1]
    rules = FetchRules(allowed_media_domains=("127.0.0.1",))
    assert fetch_media(f"http://{media_server}/a.png", "image", rules, "f", "p") == _Media.image
    # a redirect to a host the rules do not allow is refused (checked at every hop)
    to = f"http://localhost:{port}/a.png"
    with pytest.raises(ValidationError, match="not one of --allowed-media-domains"):
        fetch_media(f"http://{media_server}/redirect?to={to}", "image", rules, "f", "p")
    # and without named hosts, a public URL redirecting to loopback is refused the same way
    with pytest.raises(ValidationError, match="private, loopback"):
        fetch_media(to, "image", FetchRules(), "f", "p")
    with pytest.raises(ValidationError, match="not followed"):
        fetch_media(
            f"http://{media_server}/redirect?to={to}",
            "image",
            FetchRules(allowed_media_domains=("127.0.0.1",), allow_redirects=False),
            "f",
            "p",
        )
    with pytest.raises(ValidationError, match="HTTP 404"):
        fetch_media(f"http://{media_server}/missing", "image", rules, "f", "p")


def test_slow_and_huge_downloads(media_server):
    slow = FetchRules(allowed_media_domains=("127.0.0.1",), timeouts=(("image", 0.5),))
    t0 = time.monotonic()
    with pytest.raises(ValidationError, match=r"took longer than 0\.5 s"):
        fetch_media(f"http://{media_server}/slow", "image", slow, "f", "p")
    assert time.monotonic() - t0 < 3
    small = FetchRules(allowed_media_domains=("127.0.0.1",), max_bytes=100_000)
    with pytest.raises(ValidationError, match="over 100000 bytes"):
        fetch_media(f"http://{media_server}/huge", "image", small, "f", "p")
    with pytest.raises(ValidationError, match="over 2 bytes"):
        fetch_media(data_url(b"abc"), "image", FetchRules(max_bytes=2), "f", "p")


def test_local_files(tmp_path):
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "a.png").write_bytes(b"abc")
    (tmp_path / "secret").write_bytes(b"no")
    url = f"file://{tmp_path}/ok/a.png"
    with pytest.raises(ValidationError, match="--allowed-local-media-path"):
        fetch_media(url, "image", FetchRules(), "f", "p")
    rules = FetchRules(allowed_local_media_path=str(tmp_path / "ok"))
    assert fetch_media(url, "image", rules, "f", "p") == b"abc"
    with pytest.raises(ValidationError, match="not under"):
        fetch_media(f"file://{tmp_path}/ok/../secret", "image", rules, "f", "p")
    with pytest.raises(ValidationError, match="must be http"):
        fetch_media("ftp://x/a.png", "image", rules, "f", "p")


# ---- placeholders, synthetic counts --------------------------------------------------------------


def test_expansion_matches_items_to_placeholders():
    ids, places = expand_placeholders(
        [1, IMAGE_PAD, 2, IMAGE_PAD, 3], [("image", 2), ("image", 3)], {"image": IMAGE_PAD}
    )
    assert ids == [1, IMAGE_PAD, IMAGE_PAD, 2, IMAGE_PAD, IMAGE_PAD, IMAGE_PAD, 3]
    assert places == [(1, 2), (4, 3)]
    with pytest.raises(ValidationError, match="1 image placeholder"):
        expand_placeholders([IMAGE_PAD], [("image", 2), ("image", 2)], {"image": IMAGE_PAD})


def test_synthetic_counts_as_qwen2_vl():
    tok = Tokenizer.default()
    media = synthetic_media(tok.token_to_id, "m")
    assert media is not None and media.pad_ids["image"] == IMAGE_PAD
    image, _ = load_image(png(150, 100), "f", "p")
    assert process_image(media, image).num_tokens == 20  # (112x140 -> 4x5 merged patches)


# ---- vLLM as the reference -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    env = vllm_env()
    if env is None:
        pytest.skip("needs the vLLM CPU environment with its tiny VLM (scripts/vllm_cpu_env.py)")
    folder = tmp_path_factory.mktemp("images")
    images = {
        "exact.png": png(140, 112, seed=1),  # (multiples of 28: no resize)
        "resized.png": png(150, 100, seed=2),
        "rgba.png": png(56, 84, seed=3, mode="RGBA"),
    }
    for name, data in images.items():
        (folder / name).write_bytes(data)
    urls = [
        data_url(images["exact.png"]),
        f"file://{folder}/resized.png",
        f"file://{folder}/rgba.png",
    ]
    prompt = [151644, 872, 198]
    for _ in urls:
        prompt += [VISION_START, IMAGE_PAD, VISION_END, 198]
    prompt += [151645]
    spec = {"model": env["vlm"], "prompt_ids": prompt, "images": urls, "limit": {"image": 4}}
    return env, spec, images, vllm_reference(env, spec)


def _tokenwire_side(env, spec, images):
    tok = Tokenizer.from_pretrained(env["vlm"])
    media = model_media(env["vlm"], env["vlm"], tok.token_to_id)
    assert media is not None and media.device_normalize
    items, results = [], []
    for name in ("exact.png", "resized.png", "rgba.png"):
        image, hashed = load_image(images[name], "f", "p")
        processed = process_image(media, image)
        items.append(("image", processed.num_tokens))
        results.append((mm_hash("blake3", model_id=media.model_id, image=hashed), processed))
    ids, places = expand_placeholders(spec["prompt_ids"], items, media.pad_ids)
    feats = [MMFeature("image", h, off, n, p.fields) for (h, p), (off, n) in zip(results, places)]
    aux: list = [b""]
    main = msgspec.msgpack.encode(wire_features(feats, aux))
    return ids, feats, main, aux


def test_same_ids_hashes_and_layout_as_vllm(reference):
    env, spec, images, ref = reference
    ids, feats, main, aux = _tokenwire_side(env, spec, images)
    assert ids == ref["prompt_ids"]
    assert [f.mm_hash for f in feats] == [f["mm_hash"] for f in ref["features"]]
    assert [(f.offset, f.length) for f in feats] == [
        (f["offset"], f["length"]) for f in ref["features"]
    ]
    # the same msgpack values (the order of an item's keys follows the processor's output)
    theirs = msgspec.msgpack.decode(bytes.fromhex(ref["frames"][0]))
    assert msgspec.msgpack.decode(main) == theirs
    assert len(aux) == len(ref["frames"])
    # the pixels: exact where no resize is needed; a resized image within one level (Pillow's
    # resampling here, torchvision's in vLLM's environment)
    exact = np.frombuffer(bytes(aux[1]), np.uint8)
    assert np.array_equal(exact, np.frombuffer(bytes.fromhex(ref["frames"][1]), np.uint8))
    for k in (2, 3):
        mine = np.frombuffer(bytes(aux[k]), np.uint8).astype(int)
        vllm = np.frombuffer(bytes.fromhex(ref["frames"][k]), np.uint8).astype(int)
        assert mine.shape == vllm.shape and np.abs(mine - vllm).max() <= 1


def test_hash_changes_with_what_vllm_hashes():
    a = mm_hash("blake3", model_id="m", image=ImageBytes(b"abc"))
    assert a == mm_hash("blake3", model_id="m", image=ImageBytes(b"abc"))
    assert a != mm_hash("blake3", model_id="n", image=ImageBytes(b"abc"))
    assert a != mm_hash("blake3", model_id="m", image=ImageBytes(b"abd"))
    assert a != mm_hash("blake3", model_id="m", image=ImageBytes(b"abc", {"image_mode": "RGB"}))
    assert a != mm_hash("sha256", model_id="m", image=ImageBytes(b"abc"))


def test_wire_layout_side_buffers():
    big = np.zeros((20, 30), np.uint8)
    small = np.array([1, 2, 3], np.int64)
    from tokenwire.multimodal.layout import Field

    feats = [
        MMFeature(
            "image",
            "h1",
            3,
            5,
            {"pixel_values": Field(big, "flat"), "g": Field(small, "batched", True)},
        ),
        MMFeature(
            "image",
            "h2",
            9,
            2,
            {"pixel_values": Field(big[:12], "flat"), "g": Field(small, "batched", True)},
        ),
    ]
    aux: list = [b""]
    out = msgspec.msgpack.decode(msgspec.msgpack.encode(wire_features(feats, aux)))
    assert len(aux) == 3 and bytes(aux[2]) == big[:12].tobytes()
    first = out[0]["data"]["pixel_values"]
    assert first["data"] == ["uint8", [20, 30], 1]
    assert first["field"] == [
        "flat",
        {"keep_on_cpu": False, "slices": [[[0, 20, None]], [[20, 32, None]]], "dim": 0},
    ]
    assert out[1]["data"]["g"]["data"][2].code == 3  # inline (under 256 bytes)
    assert out[1]["mm_position"] == {"offset": 9, "length": 2, "is_embed": None}


def test_engine_core_request_carries_the_features():
    from tokenwire.engine import EngineRequest
    from tokenwire.engine.vllm import protocol as wire
    from tokenwire.messages.sampling import SamplingParams
    from tokenwire.multimodal.layout import Field

    pixels = np.arange(600, dtype=np.uint8).reshape(20, 30)
    feature = MMFeature("image", "abc", 4, 5, {"pixel_values": Field(pixels, "flat")})
    req = EngineRequest("r1", [1, 2, 3, 4, 9, 9, 9, 9, 9], SamplingParams(), mm_features=(feature,))
    with pytest.raises(ValueError, match="aux"):
        wire.encode_add(req, {})
    aux: list = [b""]
    payload = wire.encode_add(req, {}, aux=aux)
    msg = msgspec.msgpack.decode(payload)
    assert msg[0] == "r1" and msg[2][0]["identifier"] == "abc"
    assert msg[2][0]["data"]["pixel_values"]["data"] == ["uint8", [20, 30], 1]
    assert bytes(aux[1]) == pixels.tobytes()
    text = wire.encode_add(EngineRequest("r2", [1], SamplingParams()), {}, aux=[b""])
    assert msgspec.msgpack.decode(text)[2] is None


def test_messages_shaped_for_each_template_format():
    from tokenwire.chat.messages import normalize_messages
    from tokenwire.chat.templates import shape_messages

    mark = "<|vision_start|><|image_pad|><|vision_end|>"
    part = {"type": "image_url", "image_url": {"url": "https://x/a.png"}}
    content = [{"type": "text", "text": "one"}, part, {"type": "text", "text": "two"}, part]
    media: list = []
    msgs = normalize_messages([{"role": "user", "content": content}], media=media)
    assert [m.modality for m in media] == ["image", "image"]
    assert msgs[0]["content"][1] == {"type": "image"}
    string = [dict(m) for m in msgs]
    shape_messages(string, "string", None, {"image": mark})
    # (vLLM: the items' placeholders first, then the text parts joined by newlines)
    assert string[0]["content"] == f"{mark}\n{mark}\none\ntwo"
    openai = [dict(m) for m in msgs]
    shape_messages(openai, "openai", None, {"image": mark})
    assert [p["type"] for p in openai[0]["content"]] == ["text", "image", "text", "image"]
    # a placeholder the text already has stays where it is
    own = normalize_messages([{"role": "user", "content": [part, f"see {mark} here"]}], media=[])
    shape_messages(own, "string", None, {"image": mark})
    assert own[0]["content"] == f"see {mark} here"
    with pytest.raises(ValidationError, match="more"):
        two = normalize_messages([{"role": "user", "content": [part, f"{mark}{mark}"]}], media=[])
        shape_messages(two, "string", None, {"image": mark})
    with pytest.raises(ValidationError, match="text-only"):
        normalize_messages([{"role": "user", "content": [part]}])


def test_vllm_frontend_takes_vllms_media_flags(tmp_path, monkeypatch):
    import json

    from tokenwire.entrypoints.options import media as options
    from tokenwire.entrypoints.vllm_frontend import settings_from_args

    (tmp_path / "config.json").write_text(
        json.dumps(
            {"model_type": "qwen2_5_vl", "image_token_id": IMAGE_PAD, "video_token_id": 151656}
        )
    )
    raw = {
        "model": str(tmp_path),
        "limit_mm_per_prompt": {"image": 3},
        "allowed_local_media_path": str(tmp_path),
        "media_io_kwargs": {"image": {"image_mode": "RGB"}},
        "mm_processor_cache_gb": 1,
    }
    settings = settings_from_args(json.dumps(raw))
    monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", "1")
    found, limits = options.media_features(settings["media"], Tokenizer.default())
    assert found is not None and found.family == "qwen2_vl" and limits.limit("image") == 3
    assert not found.device_normalize  # (vLLM turns device normalization off for this seam)
    opts = options.media_options(settings["media"])
    assert opts.rules.allowed_local_media_path == str(tmp_path) and opts.cache_gb == 1
    assert opts.media_io_kwargs == {"image": {"image_mode": "RGB"}}
