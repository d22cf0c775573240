"""Image specs: where a template image or a reference image comes from, and how it is prepared.

A spec is written in a manifest either as a string or as a table::

    "skimage:astronaut"                 # an image shipped inside an installed package
    "skimage:lfw_subset:17"             # the 17th image of skimage.data.lfw_subset() (0-99 are faces)
    "sklearn:china"  "matplotlib:grace_hopper"
    "photos/me.jpg"                     # a file, relative to the manifest's folder (PNG / JPEG / …)
    {ref = "skimage:coffee", crop = [0.1, 0.6, 0.4, 0.9], flip = true, hue = 0.25}

Preparation, in this order: load (gray → RGB, RGBA composited over white, any dtype → float32 in
[0, 1]); ``crop`` = a fractional box ``[x0, y0, x1, y1]`` of the *source* image; centre-crop to a
square; resize to the requested side (``skimage.transform.resize``, anti-aliased); ``flip``
mirrors left-right; ``hue`` rotates the hue by that fraction of the colour wheel (-1 … 1; no
effect on gray images).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CatalogError

# skimage.data images that ship inside the scikit-image wheel (the others need a download).
SKIMAGE_IMAGES = (
    "astronaut", "brick", "camera", "cat", "cell", "checkerboard", "chelsea", "clock", "coffee",
    "coins", "colorwheel", "grass", "gravel", "horse", "hubble_deep_field", "immunohistochemistry",
    "lfw_subset", "logo", "microaneurysms", "moon", "page", "retina", "rocket",
    "shepp_logan_phantom", "stereo_motorcycle", "text",
)
SKLEARN_IMAGES = ("china", "flower")
MATPLOTLIB_IMAGES = {  # name -> file in matplotlib's mpl-data/sample_data
    "grace_hopper": "grace_hopper.jpg",
    "Minduka_Present_Blue_Pack": "Minduka_Present_Blue_Pack.png",
    "logo2": "logo2.png",
}
INDEXED = {"lfw_subset": 200}  # images that are stacks: name:index is required
PACKAGES = ("skimage", "sklearn", "matplotlib")
_SPEC_KEYS = {"ref", "crop", "flip", "hue"}


def _available(package: str) -> list[str]:
    return {"skimage": list(SKIMAGE_IMAGES), "sklearn": list(SKLEARN_IMAGES),
            "matplotlib": list(MATPLOTLIB_IMAGES)}[package]


def parse_box(value: Any, what: str) -> tuple[float, float, float, float]:
    """A fractional box ``[x0, y0, x1, y1]`` with 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1."""
    try:
        box = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise CatalogError(f"{what} must be [x0, y0, x1, y1] in fractions of the image, got {value!r}")
    if len(box) != 4:
        raise CatalogError(f"{what} must be [x0, y0, x1, y1] in fractions of the image, got {value!r}")
    x0, y0, x1, y1 = box
    if not (0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1):
        raise CatalogError(f"{what} {list(box)} must satisfy 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1")
    return box  # type: ignore[return-value]


@dataclass(frozen=True)
class ImageSpec:
    """Where an image comes from (``package``/``name``/``index`` or ``path``) and how to prepare it."""

    source: str  # as written in the manifest
    package: str | None = None
    name: str | None = None
    index: int | None = None
    path: Path | None = None
    crop: tuple[float, float, float, float] | None = None
    flip: bool = False
    hue: float = 0.0

    # ---------------------------------------------------------------- parsing
    @classmethod
    def parse(cls, value: Any, base_dir: str | os.PathLike | None = None, *, what: str = "image",
              check_file: bool = True) -> "ImageSpec":
        """A spec from a manifest value (string or table); file paths resolve against ``base_dir``."""
        if isinstance(value, ImageSpec):
            return value
        extra: dict[str, Any] = {}
        if isinstance(value, dict):
            unknown = set(value) - _SPEC_KEYS
            if unknown:
                raise CatalogError(f"{what}: unknown key(s) {sorted(unknown)}; an image spec takes "
                                   f"{sorted(_SPEC_KEYS)}")
            if "ref" not in value:
                raise CatalogError(f"{what}: an image spec table needs ref = \"package:name\" or a file path")
            extra = {k: v for k, v in value.items() if k != "ref"}
            value = value["ref"]
        if not isinstance(value, str) or not value.strip():
            raise CatalogError(f"{what} must be a non-empty string such as \"skimage:astronaut\" or a "
                               f"file path, got {value!r}")
        source = value.strip()
        crop = parse_box(extra["crop"], f"{what} crop") if "crop" in extra else None
        flip = extra.get("flip", False)
        if not isinstance(flip, bool):
            raise CatalogError(f"{what} flip must be true or false, got {flip!r}")
        hue = extra.get("hue", 0.0)
        if isinstance(hue, bool) or not isinstance(hue, (int, float)) or not -1 <= hue <= 1:
            raise CatalogError(f"{what} hue must be a number in [-1, 1] (fraction of the colour wheel), "
                               f"got {hue!r}")
        common = dict(crop=crop, flip=flip, hue=float(hue))

        pkg, sep, rest = source.partition(":")
        if sep and pkg in PACKAGES:
            name, _, idx = rest.partition(":")
            if name not in _available(pkg):
                raise CatalogError(f"{what}: unknown package image '{source}'; {pkg} images available "
                                   f"offline: {', '.join(_available(pkg))}")
            index = None
            if name in INDEXED:
                if not idx.isdigit() or not 0 <= int(idx) < INDEXED[name]:
                    raise CatalogError(f"{what}: '{source}' needs an index, e.g. '{pkg}:{name}:17' "
                                       f"(0-{INDEXED[name] - 1})")
                index = int(idx)
            elif idx:
                raise CatalogError(f"{what}: '{source}' is a single image and takes no index")
            return cls(source=source, package=pkg, name=name, index=index, **common)

        path = Path(os.path.expanduser(source))
        if not path.is_absolute():
            path = Path(base_dir or ".") / path
        path = path.resolve()
        if check_file:
            _check_readable(path, what)
        return cls(source=source, path=path, **common)

    # ---------------------------------------------------------------- identity
    @property
    def key(self) -> str:
        """A canonical string: two specs with the same key give the same pixels."""
        base = f"{self.package}:{self.name}" if self.package else str(self.path)
        if self.index is not None:
            base += f":{self.index}"
        opts = []
        if self.crop:
            opts.append("crop=" + ",".join(f"{v:g}" for v in self.crop))
        if self.flip:
            opts.append("flip")
        if self.hue:
            opts.append(f"hue={self.hue:g}")
        return base + (f"[{';'.join(opts)}]" if opts else "")

    def __str__(self) -> str:
        return self.key

    # ---------------------------------------------------------------- pixels
    def load(self, resolution: int | None = 256) -> np.ndarray:
        """Prepared pixels: float32 ``(resolution, resolution, 3)`` in [0, 1] (a fresh copy).

        ``resolution=None`` keeps the side of the square crop.
        """
        return _prepared(self, resolution).copy()


def _check_readable(path: Path, what: str) -> None:
    if not path.is_file():
        raise CatalogError(f"{what}: image file not found: {path}")
    try:
        from PIL import Image

        with Image.open(path) as im:
            im.size  # header only
    except Exception as e:  # noqa: BLE001 - any decoder failure is "unreadable"
        raise CatalogError(f"{what}: cannot read image {path}: {type(e).__name__}: {e}")


@functools.lru_cache(maxsize=16)
def _package_raw(package: str, name: str) -> np.ndarray:
    """The raw array of a packaged image (cached; treat as read-only)."""
    try:
        if package == "skimage":
            import skimage.data

            arr = getattr(skimage.data, name)()
            if isinstance(arr, tuple):  # stereo_motorcycle -> (left, right, disparity)
                arr = arr[0]
        elif package == "sklearn":
            from sklearn.datasets import load_sample_image

            arr = load_sample_image(f"{name}.jpg")
        else:
            import matplotlib

            path = Path(matplotlib.get_data_path()) / "sample_data" / MATPLOTLIB_IMAGES[name]
            arr = read_image_file(path)
    except CatalogError:
        raise
    except Exception as e:  # noqa: BLE001
        raise CatalogError(f"cannot load package image '{package}:{name}': {type(e).__name__}: {e}")
    arr = np.asarray(arr)
    arr.setflags(write=False)
    return arr


def read_image_file(path: str | os.PathLike) -> np.ndarray:
    """Decode an image file to an array (uint8/uint16/float/bool, 2-D or HxWxC)."""
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as im:
            im = ImageOps.exif_transpose(im)
            if im.mode in ("P", "PA", "LA", "CMYK", "YCbCr", "LAB", "HSV", "1"):
                im = im.convert("RGBA" if "A" in im.mode or im.mode == "P" else "RGB")
            arr = np.asarray(im)
    except FileNotFoundError:
        raise CatalogError(f"image file not found: {path}")
    except Exception as e:  # noqa: BLE001
        raise CatalogError(f"cannot read image {path}: {type(e).__name__}: {e}")
    return arr


def to_float_rgb(arr: np.ndarray) -> np.ndarray:
    """Any image array → float32 HxWx3 in [0, 1] (gray → RGB, alpha composited over white)."""
    a = np.asarray(arr)
    if a.dtype == bool:
        a = a.astype(np.float32)
    elif np.issubdtype(a.dtype, np.integer):
        if a.dtype.itemsize == 1:
            top = 255.0
        elif a.dtype == np.uint16:
            top = 65535.0
        else:  # e.g. PIL mode "I" (int32): 8-bit or 16-bit data in a wide type
            top = 255.0 if a.max(initial=0) <= 255 else 65535.0
        a = a.astype(np.float32) / top
    else:
        a = np.clip(a.astype(np.float32), 0.0, 1.0)
    if a.ndim == 2:
        a = a[..., None]
    if a.ndim != 3 or a.shape[2] not in (1, 2, 3, 4):
        raise CatalogError(f"unsupported image shape {a.shape}; expected HxW, HxWx3 or HxWx4")
    if a.shape[2] in (2, 4):  # composite over white
        alpha = a[..., -1:]
        a = a[..., :-1] * alpha + (1.0 - alpha)
    if a.shape[2] == 1:
        a = np.repeat(a, 3, axis=2)
    return np.ascontiguousarray(a, dtype=np.float32)


def crop_fraction(img: np.ndarray, box: tuple[float, float, float, float]) -> np.ndarray:
    h, w = img.shape[:2]
    x0, y0, x1, y1 = box
    c0, c1 = int(round(x0 * w)), max(int(round(x1 * w)), int(round(x0 * w)) + 1)
    r0, r1 = int(round(y0 * h)), max(int(round(y1 * h)), int(round(y0 * h)) + 1)
    return img[r0:r1, c0:c1]


def center_square(img: np.ndarray) -> np.ndarray:
    h, w = img.shape[:2]
    s = min(h, w)
    r0, c0 = (h - s) // 2, (w - s) // 2
    return img[r0 : r0 + s, c0 : c0 + s]


def resize_square(img: np.ndarray, size: int) -> np.ndarray:
    from skimage.transform import resize

    if img.shape[0] == size and img.shape[1] == size:
        return img.astype(np.float32, copy=True)
    out = resize(img, (size, size, img.shape[2]), order=1, anti_aliasing=True, preserve_range=True)
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def rotate_hue(img: np.ndarray, hue: float) -> np.ndarray:
    from skimage.color import hsv2rgb, rgb2hsv

    hsv = rgb2hsv(img)
    hsv[..., 0] = (hsv[..., 0] + hue) % 1.0
    return np.clip(hsv2rgb(hsv), 0.0, 1.0).astype(np.float32)


@functools.lru_cache(maxsize=64)  # bounded: 64 × 256² × 3 × 4 B ≈ 50 MB
def _prepared(spec: ImageSpec, resolution: int | None) -> np.ndarray:
    if resolution is not None and (not isinstance(resolution, int) or resolution < 1):
        raise CatalogError(f"resolution must be a positive integer, got {resolution!r}")
    if spec.package:
        raw = _package_raw(spec.package, spec.name)
        if spec.index is not None:
            raw = raw[spec.index]
    else:
        raw = read_image_file(spec.path)
    img = to_float_rgb(raw)
    if spec.crop:
        img = crop_fraction(img, spec.crop)
    img = center_square(img)
    img = resize_square(img, resolution or img.shape[0])
    if spec.flip:
        img = img[:, ::-1]
    if spec.hue:
        img = rotate_hue(img, spec.hue)
    img = np.ascontiguousarray(img, dtype=np.float32)
    img.setflags(write=False)
    return img


def load_image_spec(spec: str | dict | ImageSpec, base_dir: str | os.PathLike | None = None,
                    resolution: int | None = 256) -> np.ndarray:
    """Load and prepare an image spec: float32 ``(resolution, resolution, 3)`` in [0, 1].

    ``spec`` is ``"package:name[:index]"``, a file path (relative to ``base_dir``), a table
    ``{ref, crop, flip, hue}`` or an :class:`ImageSpec`. Raises :class:`CatalogError`.
    """
    return ImageSpec.parse(spec, base_dir).load(resolution)
