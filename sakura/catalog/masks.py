"""Mask specs: the editable region of a template, in the coordinates of its square image.

A manifest writes a mask as one of::

    "masks/face.png"                          # a square PNG (white = editable), relative to the manifest
    {png = "masks/face.png"}                  # the same
    {box = [x0, y0, x1, y1]}                  # fractional box
    {ellipse = [cx, cy, rx, ry]}              # fractional centre and radii
    {polygon = [[x, y], [x, y], ...]}         # fractional vertices
    [{ellipse = [...]}, {box = [...]}]        # union of several shapes

Coordinates are fractions of the square template image (after ``crop`` and the centre crop), x to
the right, y down. A pixel belongs to a shape when its centre does, so a mask is the same region at
every resolution. A PNG is read as gray (or its alpha channel when it has a non-opaque one),
thresholded at half intensity, and resized to the requested resolution.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CatalogError
from .images import parse_box

SHAPES = ("png", "box", "ellipse", "polygon")


@dataclass(frozen=True)
class MaskShape:
    kind: str  # one of SHAPES
    params: tuple = ()  # box / ellipse: 4 floats; polygon: ((x, y), ...)
    path: Path | None = None  # png

    def key(self) -> str:
        if self.kind == "png":
            return f"png:{self.path}"
        return f"{self.kind}:{self.params}"


def _floats(value: Any, n: int | None, what: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise CatalogError(f"{what} must be a list of numbers, got {value!r}")
    if n is not None and len(out) != n:
        raise CatalogError(f"{what} must have {n} numbers, got {value!r}")
    return out


def _parse_shape(value: Any, base_dir: Path, what: str) -> MaskShape:
    if isinstance(value, str):
        value = {"png": value}
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in SHAPES:
        raise CatalogError(f"{what} must be a PNG path or one of {{box = [x0, y0, x1, y1]}}, "
                           f"{{ellipse = [cx, cy, rx, ry]}}, {{polygon = [[x, y], ...]}}, "
                           f"{{png = \"path\"}}; got {value!r}")
    kind, v = next(iter(value.items()))
    if kind == "png":
        if not isinstance(v, str) or not v.strip():
            raise CatalogError(f"{what}: png must be a file path, got {v!r}")
        path = Path(os.path.expanduser(v))
        path = (path if path.is_absolute() else base_dir / path).resolve()
        return MaskShape("png", path=path)
    if kind == "box":
        return MaskShape("box", parse_box(v, f"{what} box"))
    if kind == "ellipse":
        cx, cy, rx, ry = _floats(v, 4, f"{what} ellipse [cx, cy, rx, ry]")
        if rx <= 0 or ry <= 0:
            raise CatalogError(f"{what} ellipse radii must be > 0, got {list(v)}")
        return MaskShape("ellipse", (cx, cy, rx, ry))
    # polygon
    if not isinstance(v, (list, tuple)) or len(v) < 3:
        raise CatalogError(f"{what} polygon needs at least 3 [x, y] vertices, got {v!r}")
    pts = tuple(_floats(p, 2, f"{what} polygon vertex") for p in v)
    return MaskShape("polygon", pts)


@dataclass(frozen=True)
class MaskSpec:
    """A union of shapes; ``render(resolution)`` gives the bool mask."""

    shapes: tuple[MaskShape, ...]
    source: Any = None  # as written (for messages)

    @classmethod
    def parse(cls, value: Any, base_dir: str | os.PathLike | None = None, *, what: str = "mask") -> "MaskSpec":
        base = Path(base_dir or ".")
        if isinstance(value, MaskSpec):
            return value
        items = value if isinstance(value, list) else [value]
        if not items:
            raise CatalogError(f"{what} is an empty list of shapes")
        shapes = tuple(_parse_shape(v, base, what) for v in items)
        return cls(shapes=shapes, source=repr(value))

    @property
    def key(self) -> str:
        return "|".join(s.key() for s in self.shapes)

    def render(self, resolution: int = 256) -> np.ndarray:
        """Bool ``(resolution, resolution)``; True = editable. A fresh copy."""
        return _render(self, int(resolution)).copy()


def _centres(resolution: int) -> np.ndarray:
    return (np.arange(resolution, dtype=np.float64) + 0.5) / resolution


def read_mask_png(path: Path, what: str = "mask") -> np.ndarray:
    """A square PNG as a bool array at its own size (white / opaque = editable)."""
    from PIL import Image

    if not path.is_file():
        raise CatalogError(f"{what}: mask file not found: {path}")
    try:
        with Image.open(path) as im:
            im.load()
            if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
                rgba = np.asarray(im.convert("RGBA"))
                alpha = rgba[..., 3]
                arr = alpha if alpha.min() < 255 else np.asarray(im.convert("L"))
            elif im.mode in ("I;16", "I;16B", "I;16L", "I"):
                a = np.asarray(im).astype(np.float64)
                arr = (a / (65535.0 if a.max(initial=0) > 255 else 255.0) * 255.0)
            else:
                arr = np.asarray(im.convert("L"))
    except Exception as e:  # noqa: BLE001
        raise CatalogError(f"{what}: cannot read mask PNG {path}: {type(e).__name__}: {e}")
    h, w = arr.shape[:2]
    if h != w or h < 8:
        raise CatalogError(f"{what}: mask PNG {path.name} is {w}x{h}; expected a square mask (e.g. "
                           f"256x256) in the coordinates of the square template image")
    return np.asarray(arr, dtype=np.float64) >= 127.5


@functools.lru_cache(maxsize=128)
def _render(spec: MaskSpec, resolution: int) -> np.ndarray:
    if resolution < 1:
        raise CatalogError(f"mask resolution must be a positive integer, got {resolution}")
    c = _centres(resolution)
    xs, ys = np.meshgrid(c, c)  # xs[i, j] = x of column j, ys[i, j] = y of row i
    out = np.zeros((resolution, resolution), dtype=bool)
    for s in spec.shapes:
        if s.kind == "box":
            x0, y0, x1, y1 = s.params
            out |= (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)
        elif s.kind == "ellipse":
            cx, cy, rx, ry = s.params
            out |= ((xs - cx) / rx) ** 2 + ((ys - cy) / ry) ** 2 <= 1.0
        elif s.kind == "polygon":
            from matplotlib.path import Path as MplPath

            inside = MplPath(np.asarray(s.params)).contains_points(np.stack([xs.ravel(), ys.ravel()], 1))
            out |= inside.reshape(resolution, resolution)
        else:
            m = read_mask_png(s.path)
            if m.shape[0] != resolution:
                from skimage.transform import resize

                m = resize(m.astype(np.float32), (resolution, resolution), order=1,
                           anti_aliasing=m.shape[0] > resolution) >= 0.5
            out |= m
    out.setflags(write=False)
    return out


def token_mask(mask: np.ndarray, patch: int = 8) -> np.ndarray:
    """Bool ``(grid*grid,)`` from a pixel mask: a token is editable if any pixel of its patch is.

    Tokens are in row-major order over the patch grid (index = row * grid + col), the order of
    ``sakura.model``'s patchify.
    """
    m = np.asarray(mask, dtype=bool)
    h, w = m.shape
    if h % patch or w % patch:
        raise CatalogError(f"mask {w}x{h} is not a multiple of the patch size {patch}")
    return m.reshape(h // patch, patch, w // patch, patch).any(axis=(1, 3)).reshape(-1)
