"""The user's photo in memory, and PNG encoding of what goes back to the client.

Nothing here touches the disk: photos are decoded from bytes with PIL over ``BytesIO`` and images
are encoded the same way.
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np

MAX_PHOTO_BYTES = 20 * 1024 * 1024  # raw bytes of the uploaded file
MB = 1024 * 1024
MAX_PHOTO_SIDE = 4096  # pixels, either side
MIN_PHOTO_SIDE = 8
ACCEPTED_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")


class PhotoError(ValueError):
    """The uploaded photo cannot be used; the message is one friendly line."""


def b64decode_field(text: object, what: str, max_bytes: int = MAX_PHOTO_BYTES) -> bytes:
    """Decode a base64 string (a ``data:...;base64,`` prefix is allowed)."""
    if not isinstance(text, str):
        raise PhotoError(f"{what} must be a base64 string")
    s = text.strip()
    if s.startswith("data:") and "," in s[:100]:
        s = s.split(",", 1)[1]
    # base64 is 4/3 of the raw size: refuse before decoding a huge string.
    if len(s) > (max_bytes * 4) // 3 + 8:
        raise PhotoError(f"the photo is too large ({len(s) * 3 / 4 / MB:.1f} MB; the limit is "
                         f"{max_bytes / MB:.0f} MB): please upload a smaller image")
    try:
        raw = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise PhotoError(f"{what} is not valid base64") from None
    if not raw:
        raise PhotoError(f"{what} is empty")
    if len(raw) > max_bytes:
        raise PhotoError(f"the photo is too large ({len(raw) / MB:.1f} MB; the limit is "
                         f"{max_bytes / MB:.0f} MB): please upload a smaller image")
    return raw


def decode_photo(raw: bytes, size: int) -> np.ndarray:
    """PNG/JPEG/... bytes → float32 ``(size, size, 3)`` in [0, 1]: EXIF-rotated, alpha over white,
    centre square, resized. Friendly :class:`PhotoError` for anything unusable."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    from sakura.catalog.images import center_square, resize_square, to_float_rgb

    try:
        im = Image.open(io.BytesIO(raw), formats=ACCEPTED_FORMATS)
    except UnidentifiedImageError:
        raise PhotoError("the uploaded file is not an image we can read (PNG or JPEG expected)") from None
    except Exception as e:  # noqa: BLE001 - PIL raises many types for broken headers
        raise PhotoError(f"the uploaded image cannot be read ({type(e).__name__})") from None
    with im:
        w, h = im.size
        if max(w, h) > MAX_PHOTO_SIDE:
            raise PhotoError(f"the image is too large ({w}×{h} px; the limit is {MAX_PHOTO_SIDE} px per side): "
                             f"please upload a smaller image")
        if min(w, h) < MIN_PHOTO_SIDE:
            raise PhotoError(f"the image is too small ({w}×{h} px; at least {MIN_PHOTO_SIDE} px per side)")
        try:
            im = ImageOps.exif_transpose(im)
            im.thumbnail((4 * size, 4 * size))  # cheap first reduction; the final resize is antialiased
            if im.mode not in ("RGB", "RGBA", "L", "LA"):
                im = im.convert("RGBA" if "A" in im.mode or im.mode == "P" else "RGB")
            arr = np.asarray(im)
        except Exception as e:  # noqa: BLE001 - truncated / corrupt data
            raise PhotoError(f"the uploaded image is damaged and cannot be decoded ({type(e).__name__})") from None
    img = to_float_rgb(arr)
    return resize_square(center_square(img), size)


def png_bytes(img: np.ndarray) -> bytes:
    """float [0, 1] HxWx3 image, or bool / uint8 HxW mask → PNG bytes."""
    from PIL import Image

    a = np.asarray(img)
    if a.dtype == bool:
        a = a.astype(np.uint8) * 255
    elif a.dtype != np.uint8:
        a = (np.clip(a, 0, 1) * 255).round().astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def png_b64(img: np.ndarray) -> str:
    return base64.b64encode(png_bytes(img)).decode("ascii")


def mask_overlay(img: np.ndarray, mask: np.ndarray, color=(1.0, 0.25, 0.35), alpha: float = 0.45) -> np.ndarray:
    """The template with its editable region tinted (gallery thumbnails)."""
    out = np.array(img, dtype=np.float32, copy=True)
    m = mask.astype(bool)
    out[m] = (1 - alpha) * out[m] + alpha * np.asarray(color, dtype=np.float32)
    return out
