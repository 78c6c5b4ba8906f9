"""Media bytes decoded as vLLM 0.32's loaders decode them (``vllm.multimodal.media``), and every
way that can fail as a ``ValidationError`` (a 400) naming the field: ``data:`` URLs, images
through Pillow's format allow-list with a pixel cap checked before any pixel is decoded (a
decompression bomb never gets allocated), truncated or undecodable files, EXIF orientation
applied, then the mode conversion (RGBA onto a background colour)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
from collections.abc import Mapping
from typing import Any

from tokenwire.messages.errors import ValidationError
from tokenwire.multimodal.hashing import ImageBytes

__all__ = [
    "ALLOWED_IMAGE_FORMATS",
    "MAX_IMAGE_PIXELS",
    "MissingExtraError",
    "decode_data_url",
    "load_image",
    "require_pillow",
]

#: ``VLLM_MAX_IMAGE_PIXELS``'s default (Pillow's own decompression-bomb threshold x 2).
MAX_IMAGE_PIXELS = 178_956_970

#: The image formats Pillow may open (vLLM's allow-list).
ALLOWED_IMAGE_FORMATS = (
    "AVIF", "BLP", "BMP", "CUR", "DCX", "DDS", "DIB", "FITS", "FLI", "FTEX", "GBR", "GIF",
    "ICNS", "ICO", "IM", "IMT", "IPTC", "JPEG", "JPEG2000", "MCIDAS", "MSP", "PCD", "PCX",
    "PIXAR", "PNG", "PPM", "PSD", "QOI", "SGI", "SPIDER", "SUN", "TGA", "TIFF", "WEBP", "XBM",
    "XPM", "XVTHUMB",
)  # fmt: skip


class MissingExtraError(ValidationError):
    """A multimodal request to a server installed without ``tokenwire[multimodal]``."""

    def __init__(self, what: str, param: str = "messages") -> None:
        super().__init__(
            f'{what} needs the multimodal extra on the server: pip install "tokenwire[multimodal]"',
            param=param,
        )


def require_pillow(param: str = "messages") -> Any:
    """``PIL.Image``, or the 400 that names the extra."""
    try:
        from PIL import Image
    except ImportError:
        raise MissingExtraError("image input", param) from None
    return Image


def decode_data_url(url: str, where: str, param: str) -> tuple[str, bytes]:
    """A ``data:[<mime>][;base64],<payload>`` URL's media type and bytes (vLLM's: base64 only,
    validated strictly)."""
    head, sep, payload = url[5:].partition(",")
    if not sep:
        raise ValidationError(f"{where}: a data: URL needs a ',' before its data", param=param)
    mime, _, encoding = head.rpartition(";")
    if encoding != "base64":
        raise ValidationError(f"{where}: only base64 data: URLs are supported", param=param)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(f"{where}: the data: URL is not valid base64", param=param) from None
    return mime.lower(), data


def _rgba_background(kwargs: Mapping[str, Any]) -> tuple[int, int, int]:
    bg = kwargs.get("rgba_background_color", (255, 255, 255))
    if isinstance(bg, list):
        bg = tuple(bg)
    if not (
        isinstance(bg, tuple)
        and len(bg) == 3
        and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in bg)
    ):
        raise ValidationError(
            "media_io_kwargs.image.rgba_background_color must be three integers in 0..255",
            param="media_io_kwargs",
        )
    return bg


def load_image(
    data: bytes,
    where: str,
    param: str,
    *,
    max_pixels: int = MAX_IMAGE_PIXELS,
    io_kwargs: Mapping[str, Any] | None = None,
) -> tuple[Any, ImageBytes]:
    """An image's decoded pixels (a PIL image in the mode the model takes, RGB by default)
    and what vLLM hashes of it (the bytes as sent, and the conversion applied)."""
    Image = require_pillow(param)
    from PIL import ImageOps

    kwargs = dict(io_kwargs or {})
    mode = kwargs.get("image_mode", "RGB")
    background = _rgba_background(kwargs)
    try:
        image = Image.open(io.BytesIO(data), formats=ALLOWED_IMAGE_FORMATS)
        w, h = image.size
        if max_pixels > 0 and w * h > max_pixels:
            raise ValidationError(
                f"{where}: the image is {w}x{h} ({w * h} pixels), over the limit of "
                f"{max_pixels} pixels",
                param=param,
            )
        with contextlib.suppress(Exception):  # a malformed EXIF block: the image as stored
            image = ImageOps.exif_transpose(image)
        image.load()
        converted = _convert(image, mode, background)
    except ValidationError:
        raise
    except Image.DecompressionBombError:
        raise ValidationError(f"{where}: the image is too large to decode", param=param) from None
    except (OSError, ValueError, SyntaxError, Image.UnidentifiedImageError) as exc:
        raise ValidationError(f"{where}: cannot decode the image ({exc})", param=param) from None
    io_config = None
    if converted is not image:
        io_config = {"image_mode": mode, "rgba_background_color": background}
    return converted, ImageBytes(data, io_config)


def _convert(image: Any, mode: str | None, background: tuple[int, int, int]) -> Any:
    from PIL import Image

    if mode is None or image.mode == mode:
        return image
    if mode == "RGB" and (
        image.mode in ("RGBA", "LA", "PA") or "transparency" in getattr(image, "info", {})
    ):
        if image.mode != "RGBA":
            image = image.convert("RGBA")
        out = Image.new("RGB", image.size, background)
        out.paste(image, mask=image.split()[3])
        return out
    return image.convert(mode)
