"""The user's inputs as the device takes them, and PNG encoding of what goes back to the client.

A photo is decoded once, in memory (PIL over ``BytesIO``; never written to disk), to the square the
device works from; an uploaded trace is parsed once to its samples. Either then travels as data the
agent need not parse again (raw pixels, a list of numbers).
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from device_bridge.errors import EditRejected, one_line
from sakura.catalog.images import center_square, resize_square, to_float_rgb
from sakura.net.traces import Trace, TraceError, parse_trace_text

PHOTO_SIZE = 256  # the square the device works from; the model resizes again to its reference size
MAX_PHOTO_BYTES = 20 * 1024 * 1024
MAX_PHOTO_SIDE = 4096
MIN_PHOTO_SIDE = 8
MAX_TRACE_BYTES = 4 * 1024 * 1024
MAX_TRACE_SAMPLES = 200_000
ACCEPTED_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")


@dataclass(frozen=True, eq=False)
class Photo:
    """The user's photo as the device uses it: ``PHOTO_SIZE``² RGB, uint8, centre square."""

    pixels: np.ndarray

    @classmethod
    def from_bytes(cls, raw: bytes, name: str = "the photo") -> "Photo":
        """Decode an image file's bytes in memory (EXIF-rotated, alpha over white, centre square)."""
        if not raw:
            raise EditRejected(f"{name} is empty: please upload a PNG or JPEG photo")
        if len(raw) > MAX_PHOTO_BYTES:
            raise EditRejected(f"{name} is too large ({len(raw) / 2**20:.1f} MB; the limit is "
                               f"{MAX_PHOTO_BYTES >> 20} MB): please upload a smaller image")
        try:
            im = Image.open(io.BytesIO(raw), formats=ACCEPTED_FORMATS)
        except UnidentifiedImageError:
            raise EditRejected(f"{name} is not an image we can read (PNG or JPEG expected)") from None
        except Exception as e:  # noqa: BLE001 - PIL raises many types for broken headers
            raise EditRejected(f"{name} cannot be read ({type(e).__name__})") from None
        with im:
            w, h = im.size
            if max(w, h) > MAX_PHOTO_SIDE:
                raise EditRejected(f"{name} is too large ({w}×{h} px; the limit is {MAX_PHOTO_SIDE} px per side): "
                                   "please upload a smaller image")
            if min(w, h) < MIN_PHOTO_SIDE:
                raise EditRejected(f"{name} is too small ({w}×{h} px; at least {MIN_PHOTO_SIDE} px per side)")
            try:
                im.draft("RGB", (4 * PHOTO_SIZE, 4 * PHOTO_SIZE))  # JPEG: decode at reduced size directly
                im = ImageOps.exif_transpose(im)
                im.thumbnail((4 * PHOTO_SIZE, 4 * PHOTO_SIZE))
                if im.mode not in ("RGB", "RGBA", "L", "LA"):
                    im = im.convert("RGBA" if "A" in im.mode or im.mode == "P" else "RGB")
                arr = np.asarray(im)
            except Exception as e:  # noqa: BLE001 - truncated / corrupt data
                raise EditRejected(f"{name} is damaged and cannot be decoded ({type(e).__name__})") from None
        img = resize_square(center_square(to_float_rgb(arr)), PHOTO_SIZE)
        return cls((np.clip(img, 0, 1) * 255).round().astype(np.uint8))

    @classmethod
    def from_file(cls, path: str | Path) -> "Photo":
        p = Path(path)
        try:
            size = p.stat().st_size
        except OSError:
            raise EditRejected("the upload did not arrive; please try again") from None
        if size > MAX_PHOTO_BYTES:
            raise EditRejected(f"“{p.name}” is {size / 2**20:.0f} MB; the limit is {MAX_PHOTO_BYTES >> 20} MB: "
                               "please upload a smaller photo")
        return cls.from_bytes(p.read_bytes(), f"“{p.name}”")

    def to_wire(self) -> dict:
        return {"rgb8_b64": base64.b64encode(self.pixels.tobytes()).decode("ascii"), "size": PHOTO_SIZE}

    @classmethod
    def from_wire(cls, obj: Any) -> "Photo":
        if not isinstance(obj, dict) or obj.get("size") != PHOTO_SIZE or not isinstance(obj.get("rgb8_b64"), str):
            raise EditRejected(f'photo must be {{"rgb8_b64": <{PHOTO_SIZE}×{PHOTO_SIZE}×3 bytes, base64>, '
                               f'"size": {PHOTO_SIZE}}}')
        raw = b64_field(obj["rgb8_b64"], "photo.rgb8_b64", PHOTO_SIZE * PHOTO_SIZE * 3)
        if len(raw) != PHOTO_SIZE * PHOTO_SIZE * 3:
            raise EditRejected(f"photo.rgb8_b64 must hold {PHOTO_SIZE * PHOTO_SIZE * 3} bytes, got {len(raw)}")
        return cls(np.frombuffer(raw, np.uint8).reshape(PHOTO_SIZE, PHOTO_SIZE, 3))

    def image(self) -> np.ndarray:
        """Float RGB in [0, 1], what the model takes."""
        return self.pixels.astype(np.float32) / 255.0


def b64_field(text: str, what: str, max_bytes: int) -> bytes:
    s = text.strip()
    if s.startswith("data:") and "," in s[:100]:
        s = s.split(",", 1)[1]
    if len(s) > (max_bytes * 4) // 3 + 8:  # refuse before decoding a huge string
        raise EditRejected(f"{what} is too large (at most {max_bytes / 2**20:.0f} MB)")
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise EditRejected(f"{what} is not valid base64") from None


# ------------------------------------------------------------------------------------- the trace
@dataclass(frozen=True, eq=False)
class TraceUpload:
    """A user's bandwidth trace, checked on the app side: its samples travel, its file does not."""

    name: str
    edges: tuple[float, ...]
    mbps: tuple[float, ...]

    @classmethod
    def from_text(cls, text: str, name: str = "uploaded") -> "TraceUpload":
        if len(text) > MAX_TRACE_BYTES:
            raise EditRejected(f"the trace file is larger than {MAX_TRACE_BYTES >> 20} MB")
        try:
            tr = parse_trace_text(text, name=name)
        except TraceError as e:
            raise EditRejected(f"bad network trace: {one_line(e)}") from None
        return cls.of(tr, name)

    @classmethod
    def from_file(cls, path: str | Path) -> "TraceUpload":
        p = Path(path)
        if p.stat().st_size > MAX_TRACE_BYTES:
            raise EditRejected(f"“{p.name}” is larger than {MAX_TRACE_BYTES >> 20} MB; a per-second trace of an "
                               "hour is far smaller")
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            raise EditRejected(f"“{p.name}” is not a text file") from None
        return cls.from_text(text, p.name)

    @classmethod
    def of(cls, trace: Trace, name: str) -> "TraceUpload":
        return cls(name, tuple(float(x) for x in trace.edges), tuple(float(x) for x in trace.mbps))

    def trace(self) -> Trace:
        try:
            return Trace(np.asarray(self.edges), np.asarray(self.mbps), self.name)
        except TraceError as e:
            raise EditRejected(f"bad network trace: {one_line(e)}") from None

    def summary(self) -> str:
        tr = self.trace()
        return (f"{self.name}: {tr.duration:.0f} s, median {tr.median_mbps:.1f} Mbps, "
                f"p10 {tr.percentile(10):.1f} / p90 {tr.percentile(90):.1f}")

    def to_wire(self) -> dict:
        return {"name": self.name, "edges": list(self.edges), "mbps": list(self.mbps)}

    @classmethod
    def from_wire(cls, obj: Any) -> "TraceUpload":
        ok = isinstance(obj, dict) and isinstance(obj.get("edges"), list) and isinstance(obj.get("mbps"), list)
        if not ok or len(obj["mbps"]) > MAX_TRACE_SAMPLES or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in obj["edges"] + obj["mbps"]):
            raise EditRejected(f'network.samples must be {{"name", "edges": [...], "mbps": [...]}} with at most '
                               f'{MAX_TRACE_SAMPLES} numbers')
        up = cls(
            str(obj.get("name") or "uploaded")[:80], tuple(map(float, obj["edges"])), tuple(map(float, obj["mbps"]))
        )
        up.trace()  # validates
        return up


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
