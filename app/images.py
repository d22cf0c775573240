"""Images in the app: checking a user's upload, PNG <-> base64, and the difference heat-map.

Everything here stays in the app process (the "device" side of the demo): an upload is read,
checked and re-encoded as a PNG that goes to the device agent only; it is never written into
anything the template server can see.
"""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # the file on disk
MAX_PIXELS = 40_000_000  # width × height of the decoded image
MIN_SIDE = 16
WORK_SIDE = 512  # the device crops references far smaller; keep what we pass on small


class UploadError(ValueError):
    """An upload the app cannot use; the message is one friendly line for the page."""


def check_upload(path: str | os.PathLike | None) -> Image.Image:
    """Open an uploaded photo as RGB, or raise :class:`UploadError` with a message for the user.

    Rejects non-images, files over 20 MB, images over 40 megapixels (checked from the header,
    before decoding, so a decompression bomb costs nothing) and tiny images. Large photos are
    shrunk to at most 512 px on the long side.
    """
    if not path:
        raise UploadError("Please upload a photo first (PNG or JPEG).")
    p = Path(path)
    name = p.name
    try:
        size = p.stat().st_size
    except OSError:
        raise UploadError("The upload did not arrive; please try again.") from None
    if size == 0:
        raise UploadError(f"“{name}” is empty. Please upload a PNG or JPEG photo.")
    if size > MAX_UPLOAD_BYTES:
        raise UploadError(f"“{name}” is {size / 2**20:.0f} MB; the limit is {MAX_UPLOAD_BYTES // 2**20} MB. "
                          "Please upload a smaller photo.")
    try:
        with Image.open(p) as probe:
            w, h = probe.size
            fmt = probe.format
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        raise UploadError(f"“{name}” is not an image we can read. Please upload a PNG or JPEG photo.") from None
    if w * h > MAX_PIXELS:
        raise UploadError(f"“{name}” is {w}×{h} pixels ({w * h / 1e6:.0f} MP); the limit is "
                          f"{MAX_PIXELS / 1e6:.0f} MP. Please upload a smaller photo.")
    if min(w, h) < MIN_SIDE:
        raise UploadError(f"“{name}” is only {w}×{h} pixels; please upload a photo at least {MIN_SIDE} px wide.")
    try:
        with Image.open(p) as im:
            im.draft("RGB", (WORK_SIDE, WORK_SIDE))  # JPEG: decode at reduced size directly
            img = im.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError, SyntaxError):
        raise UploadError(f"“{name}” ({fmt or 'unknown format'}) is damaged and cannot be decoded.") from None
    img.thumbnail((WORK_SIDE, WORK_SIDE), Image.Resampling.LANCZOS)
    return img


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
