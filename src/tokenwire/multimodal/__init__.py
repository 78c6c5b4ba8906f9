"""Images (and the parts for audio and video) in requests, sans I/O: each API's media parts
read into ``MediaItem`` values, ``--limit-mm-per-prompt``, media decoded with every failure a
400, the model family's processing (placeholders, expansion of the prompt's ids, processed
tensors), vLLM's content hashes, and ``EngineCoreRequest.mm_features`` in vLLM's wire layout.
Fetching URLs and the process pool that runs all of this off the event loop are the runtime's
(``tokenwire.runtime.media``). Pillow, transformers and blake3 come with the optional extra
``tokenwire[multimodal]`` and are imported only when used."""

from tokenwire.multimodal.hashing import HASH_ALGORITHMS, ImageBytes, mm_hash
from tokenwire.multimodal.layout import Field, MMFeature, wire_features
from tokenwire.multimodal.limits import MediaLimits, parse_limit_mm_per_prompt
from tokenwire.multimodal.parts import MODALITIES, MediaItem
from tokenwire.multimodal.processing import ModelMedia, Processed, expand_placeholders

__all__ = [
    "HASH_ALGORITHMS",
    "MODALITIES",
    "Field",
    "ImageBytes",
    "MMFeature",
    "MediaItem",
    "MediaLimits",
    "ModelMedia",
    "Processed",
    "expand_placeholders",
    "mm_hash",
    "parse_limit_mm_per_prompt",
    "wire_features",
]
