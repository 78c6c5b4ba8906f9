"""Media items in a request, as the peers accept them: each API's parts read into ``MediaItem``
values (a modality, a source URL, the field it came from), checked for shape only. Fetching,
decoding and processing are later steps (``tokenwire.multimodal.media`` and the runtime's pool).

The sources are URLs: ``http(s)://``, ``data:`` and ``file://``; base64 payloads (Anthropic's
``image`` blocks, ``input_audio``, SGLang's bare base64 strings) become ``data:`` URLs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tokenwire.messages.errors import ValidationError

__all__ = [
    "MEDIA_PART_TYPES",
    "MODALITIES",
    "MediaItem",
    "anthropic_image",
    "chat_media_part",
    "generate_media",
    "responses_media_part",
]

#: The modalities tokenwire knows (vLLM's names).
MODALITIES = ("image", "audio", "video")

#: Chat content part types that carry media (vLLM's, plus the Responses API's).
MEDIA_PART_TYPES = frozenset(
    {
        "image_url",
        "input_image",
        "input_file",
        "input_audio",
        "audio_url",
        "video_url",
        "image_embeds",
        "audio_embeds",
        "video_embeds",
        "image_pil",
    }
)

_B64 = re.compile(r"[A-Za-z0-9+/=\s_-]+")


@dataclass(frozen=True)
class MediaItem:
    """One image, audio clip or video of a request: where to get it (``url``), the field it
    came from (for error messages), and the client's ``uuid`` for it, if any (vLLM's: it
    replaces the content hash as the cache key)."""

    modality: str
    url: str
    field: str
    uuid: str | None = None


def _url(value: Any, where: str, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError(f"{where} must be a non-empty string (a URL)", param=param)
    return value


def _uuid(part: dict, where: str, param: str) -> str | None:
    uuid = part.get("uuid")
    if uuid is None:
        return None
    if not isinstance(uuid, str) or not uuid:
        raise ValidationError(f"{where}.uuid must be a non-empty string", param=param)
    return uuid


def chat_media_part(part: dict, where: str, param: str = "messages") -> MediaItem:
    """A chat (or Responses) content part of a media type as a ``MediaItem``; the embeddings
    types (``image_embeds`` ...) are refused by name, as vLLM refuses them unless
    ``--enable-mm-embeds``, which tokenwire does not offer."""
    kind = part.get("type")
    uuid = _uuid(part, where, param)
    if kind == "image_url":
        inner = part.get("image_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
        return MediaItem("image", _url(url, f"{where}.image_url.url", param), where, uuid)
    if kind in ("input_image", "input_file"):
        return responses_media_part(part, where, param)
    if kind == "audio_url":
        inner = part.get("audio_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
        return MediaItem("audio", _url(url, f"{where}.audio_url.url", param), where, uuid)
    if kind == "video_url":
        inner = part.get("video_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
        return MediaItem("video", _url(url, f"{where}.video_url.url", param), where, uuid)
    if kind == "input_audio":
        inner = part.get("input_audio")
        if not isinstance(inner, dict):
            raise ValidationError(
                f"{where}.input_audio must be an object with data and format", param=param
            )
        data, fmt = inner.get("data"), inner.get("format")
        if not isinstance(data, str) or not data:
            raise ValidationError(f"{where}.input_audio.data must be base64 text", param=param)
        if not isinstance(fmt, str) or not re.fullmatch(r"[A-Za-z0-9]{1,16}", fmt):
            raise ValidationError(
                f"{where}.input_audio.format must name the audio format (wav, mp3...)",
                param=param,
            )
        return MediaItem("audio", f"data:audio/{fmt.lower()};base64,{data}", where, uuid)
    if kind in ("image_embeds", "audio_embeds", "video_embeds"):
        raise ValidationError(
            f"{where} of type {kind!r}: precomputed embeddings are not accepted by this "
            "server (send the media itself)",
            param=param,
        )
    raise ValidationError(f"{where} of type {kind!r} is not supported", param=param)


def responses_media_part(part: dict, where: str, param: str = "input") -> MediaItem:
    """A Responses ``input_image`` (``image_url``: a URL or a ``data:`` URL; ``file_id`` is
    refused, there is no Files API) or an ``input_file`` that is an image (``file_data`` as a
    ``data:image/...`` URL, or an image ``file_url``)."""
    kind = part.get("type")
    uuid = _uuid(part, where, param)
    if kind == "input_image":
        if part.get("file_id") is not None and part.get("image_url") is None:
            raise ValidationError(
                f"{where}.file_id is not supported (no Files API): send image_url", param=param
            )
        url = part.get("image_url")
        if isinstance(url, dict):  # (some clients send the chat shape)
            url = url.get("url")
        return MediaItem("image", _url(url, f"{where}.image_url", param), where, uuid)
    # input_file
    data, url = part.get("file_data"), part.get("file_url")
    source = data if data is not None else url
    if not isinstance(source, str) or not source:
        raise ValidationError(
            f"{where}: an input_file needs file_data (a data: URL) or file_url", param=param
        )
    if data is not None and not data.startswith("data:"):
        filename = part.get("filename")
        mime = _mime_of(filename) if isinstance(filename, str) else None
        if mime is None:
            raise ValidationError(
                f"{where}.file_data must be a data: URL (or base64 with an image filename)",
                param=param,
            )
        source = f"data:{mime};base64,{data}"
    if source.startswith("data:") and not source[5:].lower().startswith("image/"):
        raise ValidationError(
            f"{where}: only image files are accepted as input_file here", param=param
        )
    return MediaItem("image", source, where, uuid)


_IMAGE_SUFFIXES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
    "bmp": "image/bmp",
}


def _mime_of(filename: str) -> str | None:
    return _IMAGE_SUFFIXES.get(filename.rsplit(".", 1)[-1].lower()) if "." in filename else None


def anthropic_image(block: dict, where: str, param: str = "messages") -> MediaItem:
    """A Messages API ``image`` block: ``source`` of type ``base64`` (``media_type`` and
    ``data``) or ``url``."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise ValidationError(f"{where}.source must be an object", param=param)
    kind = source.get("type")
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not media_type.startswith("image/"):
            raise ValidationError(
                f"{where}.source.media_type must be an image type (image/png, ...)", param=param
            )
        if not isinstance(data, str) or not data:
            raise ValidationError(f"{where}.source.data must be base64 text", param=param)
        return MediaItem("image", f"data:{media_type};base64,{data}", where)
    if kind == "url":
        return MediaItem("image", _url(source.get("url"), f"{where}.source.url", param), where)
    raise ValidationError(
        f"{where}.source.type must be 'base64' or 'url', got {kind!r}", param=param
    )


def _generate_source(value: Any, modality: str, where: str) -> str:
    if isinstance(value, dict):  # {"url": ...}, as some SGLang clients send
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise ValidationError(f"{where} must be a URL or base64 text", param=where.split("[")[0])
    if re.match(r"(?i)(https?|data|file):", value):
        return value
    if value.startswith("/"):
        return "file://" + value
    if _B64.fullmatch(value[:4096]):
        return f"data:{modality}/unknown;base64,{value}"
    raise ValidationError(f"{where} must be a URL or base64 text", param=where.split("[")[0])


def generate_media(body: dict) -> list[list[MediaItem]] | None:
    """SGLang ``/generate``'s ``image_data``, ``audio_data`` and ``video_data``: one item, a list
    (one prompt), or a list of lists (a batch, one list per prompt). None when there is none;
    else one list of items per prompt (a single list when the input is not a batch)."""
    per_prompt: list[list[MediaItem]] | None = None
    for modality in MODALITIES:
        name = f"{modality}_data"
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, list):
            value = [value]
        if value and all(isinstance(v, list) for v in value):
            batches = value
        else:
            batches = [value]
        if per_prompt is None:
            per_prompt = [[] for _ in batches]
        if len(batches) != len(per_prompt):
            raise ValidationError(
                f"{name} has {len(batches)} lists, the other media fields {len(per_prompt)}",
                param=name,
            )
        for p, items in enumerate(batches):
            for k, item in enumerate(items):
                where = f"{name}[{p}][{k}]" if len(batches) > 1 else f"{name}[{k}]"
                if item is None:
                    continue
                per_prompt[p].append(
                    MediaItem(modality, _generate_source(item, modality, where), where)
                )
    return per_prompt
