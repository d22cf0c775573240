"""Images in the app: PNG <-> base64 and the difference heat-map (a user's photo is checked by
:class:`device_bridge.Photo`, once)."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image


class UploadError(ValueError):
    """An upload the app cannot use; the message is one friendly line for the page."""


def png_b64(img: Image.Image | np.ndarray) -> str:
    if isinstance(img, np.ndarray):
        img = to_pil(img)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def from_b64(data: str | None) -> Image.Image | None:
    if not data:
        return None
    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")


def to_pil(arr: np.ndarray) -> Image.Image:
    a = np.asarray(arr)
    if a.dtype != np.uint8:
        a = (np.clip(a, 0.0, 1.0) * 255).round().astype(np.uint8)
    return Image.fromarray(a)


def to_float(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0


def diff_heatmap(out: Image.Image, ref: Image.Image, mask: Image.Image | None = None, gain: float = 4.0) -> Image.Image:
    """|out − ref| per pixel (mean over channels, ×``gain``) through the inferno colour map, with the
    mask outline in white: where compression changed the picture."""
    from matplotlib import colormaps

    a, b = to_float(out), to_float(ref.resize(out.size) if ref.size != out.size else ref)
    d = np.clip(np.abs(a - b).mean(axis=-1) * gain, 0.0, 1.0)
    rgb = colormaps["inferno"](d)[..., :3]
    if mask is not None:
        m = np.asarray(mask.convert("L").resize(out.size)) > 127
        edge = m & ~(np.roll(m, 1, 0) & np.roll(m, -1, 0) & np.roll(m, 1, 1) & np.roll(m, -1, 1))
        rgb[edge] = 1.0
    return to_pil(rgb.astype(np.float32))
