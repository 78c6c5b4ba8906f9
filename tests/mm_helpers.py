"""Images and servers for the multimodal tests."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

try:  # the multimodal extra
    import blake3  # noqa: F401
    import transformers  # noqa: F401
    from PIL import Image
except ImportError:  # pragma: no cover - a machine without the extra
    Image = None

#: Skips the module without ``tokenwire[multimodal]`` (CI installs it: strict there).
needs_extra = pytest.mark.skipif(
    Image is None, reason='needs the multimodal extra: pip install -e ".[multimodal]"'
)


def png(width: int, height: int, seed: int = 0, mode: str = "RGB") -> bytes:
    """A PNG of seeded random pixels."""
    import numpy as np

    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    shape = (height, width, channels) if channels > 1 else (height, width)
    pixels = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, mode).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def vllm_env() -> dict[str, str] | None:
    """The vLLM CPU environment's paths (None when it is not built)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "vllm_cpu_env.py"), "--check"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        return None
    paths = json.loads(out.stdout)
    return paths if "vlm" in paths else None


def vllm_reference(env: dict[str, str], spec: dict) -> dict:
    """vLLM's own multimodal frontend on ``spec`` (``tests/vllm_mm_reference.py``)."""
    run_env = {**os.environ, "PYTHONPATH": env["mm_pythonpath"]}
    out = subprocess.run(
        [env["python"], str(ROOT / "tests" / "vllm_mm_reference.py")],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env=run_env,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"vLLM's reference failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
