"""What a model does with an image, as vLLM 0.32's frontend does it for that model family:
the placeholder text the chat template gets, the placeholder token the prompt's ids expand
(one copy per feature token), and the processed tensors from the model folder's own Hugging
Face image processor, with the fields vLLM's model declares for them.

Families: ``qwen2_vl`` (Qwen2-VL and Qwen2.5-VL: ``<|image_pad|>`` expanded to
``grid_t * grid_h * grid_w / merge_size**2`` tokens, ``pixel_values`` a flat field and
``image_grid_thw`` a batched one; with ``mm_device_do_normalize`` the pixels travel as raw
``uint8`` and the engine normalizes them), and ``synthetic`` (tokenwire's embedded engine on a
Qwen-VL vocabulary: the same token counts from the image's size, no tensors)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenwire.messages.errors import ValidationError
from tokenwire.multimodal.layout import Field

__all__ = [
    "ModelMedia",
    "Processed",
    "model_media",
    "expand_placeholders",
    "process_image",
    "smart_resize",
    "synthetic_media",
]

_QWEN_VL_TYPES = {"qwen2_vl", "qwen2_5_vl"}
_VISION_START, _IMAGE_PAD, _VIDEO_PAD, _VISION_END = (
    "<|vision_start|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|vision_end|>",
)


@dataclass(frozen=True)
class ModelMedia:
    """The multimodal side of a served model: its family, the modalities it takes, the text
    a media item puts in a string-format chat prompt (``placeholders``), the token its ids
    expand (``pad_ids``), the model id vLLM hashes with, and the processor folder."""

    family: str
    modalities: frozenset[str]
    placeholders: Mapping[str, str]
    pad_ids: Mapping[str, int]
    model_id: str
    model_dir: str | None = None
    device_normalize: bool = False
    #: The image processor's own settings (``preprocessor_config.json``).
    image_config: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Processed:
    """One processed item: its feature-token count and tensors (None: counted only)."""

    num_tokens: int
    fields: dict[str, Field] | None = None

    @property
    def nbytes(self) -> int:
        return sum(f.data.nbytes for f in (self.fields or {}).values()) + 64


def model_media(
    model_dir: str | None,
    model_id: str,
    token_id: Callable[[str], int | None],
    *,
    device_normalize: bool | None = None,
) -> ModelMedia | None:
    """The ``ModelMedia`` of the model in ``model_dir`` (its ``config.json`` names the family),
    None for a text-only model or one whose family tokenwire does not process.
    ``device_normalize`` is vLLM's ``mm_device_do_normalize`` (None: vLLM's default, on for
    the Qwen-VL family unless ``VLLM_USE_RUST_FRONTEND`` is set)."""
    if not model_dir or not os.path.isfile(os.path.join(model_dir, "config.json")):
        return None
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if config.get("model_type") not in _QWEN_VL_TYPES:
        return None
    image_id = config.get("image_token_id", token_id(_IMAGE_PAD))
    video_id = config.get("video_token_id", token_id(_VIDEO_PAD))
    if image_id is None or video_id is None:
        return None
    pre = os.path.join(model_dir, "preprocessor_config.json")
    image_config: dict[str, Any] = {}
    if os.path.isfile(pre):
        with open(pre, encoding="utf-8") as f:
            image_config = json.load(f)
    if device_normalize is None:
        device_normalize = os.environ.get("VLLM_USE_RUST_FRONTEND", "0").lower() not in (
            "1",
            "true",
        )
    return ModelMedia(
        family="qwen2_vl",
        # (video needs transformers' video processor, which needs torchvision: not offered)
        modalities=frozenset({"image"}),
        placeholders={
            "image": _VISION_START + _IMAGE_PAD + _VISION_END,
            "video": _VISION_START + _VIDEO_PAD + _VISION_END,
        },
        pad_ids={"image": int(image_id), "video": int(video_id)},
        model_id=model_id,
        model_dir=model_dir,
        device_normalize=device_normalize,
        image_config=image_config,
    )


def synthetic_media(token_id: Callable[[str], int | None], model_id: str) -> ModelMedia | None:
    """The embedded engine's media side when the tokenizer has Qwen-VL's vision tokens (the
    bundled Qwen3 one has): images counted as Qwen2-VL counts them, no tensors."""
    image_id = token_id(_IMAGE_PAD)
    if image_id is None or token_id(_VISION_START) is None or token_id(_VISION_END) is None:
        return None
    return ModelMedia(
        family="synthetic",
        modalities=frozenset({"image"}),
        placeholders={"image": _VISION_START + _IMAGE_PAD + _VISION_END},
        pad_ids={"image": image_id},
        model_id=model_id,
    )


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
    max_pixels: int = 28 * 28 * 1280,
) -> tuple[int, int]:  # fmt: skip
    """Qwen2-VL's resize: both sides multiples of ``factor``, the area within the bounds, the
    aspect ratio kept as far as that allows."""
    if max(height, width) / max(1, min(height, width)) > 200:
        raise ValidationError(
            f"the image's aspect ratio is over 200 ({width}x{height})", param="messages"
        )
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


_PROCESSORS: dict[tuple[str, str], Any] = {}


def _image_processor(media: ModelMedia, kwargs: Mapping[str, Any]) -> Any:
    key = (media.model_dir or "", json.dumps(dict(kwargs), sort_keys=True, default=str))
    proc = _PROCESSORS.get(key)
    if proc is None:
        try:
            from transformers import AutoImageProcessor
        except ImportError:
            from tokenwire.multimodal.media import MissingExtraError

            raise MissingExtraError("image input") from None
        proc = AutoImageProcessor.from_pretrained(media.model_dir, **dict(kwargs))
        _PROCESSORS[key] = proc
    return proc


def process_image(
    media: ModelMedia, image: Any, mm_processor_kwargs: Mapping[str, Any] | None = None
) -> Processed:
    """One decoded image (a PIL image) processed for ``media``'s model."""
    kwargs = dict(mm_processor_kwargs or {})
    if media.family == "synthetic":
        h, w = smart_resize(image.height, image.width)
        return Processed((h // 28) * (w // 28))
    if media.device_normalize:
        kwargs["do_normalize"] = False
        kwargs["do_rescale"] = False
    load_kwargs = {k: v for k, v in kwargs.items() if k == "backend"}
    call_kwargs = {k: v for k, v in kwargs.items() if k != "backend"}
    proc = _image_processor(media, load_kwargs)
    try:
        out = proc(images=[image], return_tensors="np", **call_kwargs)
    except (ValueError, TypeError) as exc:
        raise ValidationError(
            f"the image processor refused the image or its options ({exc})",
            param="mm_processor_kwargs",
        ) from None
    pixels = np.asarray(out["pixel_values"])
    if media.device_normalize and pixels.dtype != np.uint8:
        # (raw pixels, as vLLM sends them with device-side normalization: exact in uint8)
        pixels = np.rint(pixels).astype(np.uint8)
    grid = np.asarray(out["image_grid_thw"], dtype=np.int64)[0]
    merge = int(getattr(proc, "merge_size", media.image_config.get("merge_size", 2)))
    num = int(np.prod(grid)) // (merge * merge)
    return Processed(
        num,
        {
            "pixel_values": Field(pixels, "flat"),
            "image_grid_thw": Field(grid, "batched", keep_on_cpu=True),
        },
    )


def expand_placeholders(
    prompt_ids: Sequence[int],
    items: Sequence[tuple[str, int]],
    pad_ids: Mapping[str, int],
    param: str = "messages",
) -> tuple[list[int], list[tuple[int, int]]]:
    """``prompt_ids`` with each item's placeholder token repeated ``count`` times, the items
    (``(modality, count)``, in prompt order per modality) matched to the placeholders in order
    (vLLM's prompt replacement); each item's ``(offset, length)`` in the new ids. A prompt
    whose placeholders do not match its items in number is a 400."""
    pending: dict[str, list[int]] = {}
    for k, (modality, _) in enumerate(items):
        pending.setdefault(modality, []).append(k)
    want = {pad: m for m, pad in pad_ids.items() if m in pending}
    found = {m: 0 for m in pending}
    for t in prompt_ids:
        m = want.get(t)
        if m is not None:
            found[m] += 1
    for m, ks in pending.items():
        if found[m] != len(ks):
            raise ValidationError(
                f"the prompt has {found[m]} {m} placeholder(s) for {len(ks)} {m} item(s)",
                param=param,
            )
    out: list[int] = []
    places: list[tuple[int, int]] = [(0, 0)] * len(items)
    cursor = {m: 0 for m in pending}
    for t in prompt_ids:
        m = want.get(t)
        if m is None:
            out.append(t)
            continue
        k = pending[m][cursor[m]]
        cursor[m] += 1
        count = items[k][1]
        places[k] = (len(out), count)
        out.extend([t] * count)
    return out, places
