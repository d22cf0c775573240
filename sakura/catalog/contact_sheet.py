"""A contact sheet of a catalog: every template with its mask, token mask and requests.

    python -m sakura.catalog.contact_sheet docs/catalog.png [--catalog PATH]

Per template one row: the image with the mask tinted and outlined; the token view (tokens the
device recomputes are bright, reused tokens dimmed, on the 32×32 patch grid); the five profiling
requests (top) and the evaluation requests (bottom) — reference thumbnails for fs / vton,
instructions for mb.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from .errors import CatalogError
from .manifest import NATIVE_RESOLUTION, PATCH, Catalog, Template, load_catalog

TILE = NATIVE_RESOLUTION
THUMB = 60
GAP = 8
CAPTION = 22
PANEL_W = 8 * (THUMB + 4)


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # very old Pillow without FreeType sizes
        return ImageFont.load_default()


def _u8(img: np.ndarray) -> np.ndarray:
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def mask_overlay(img: np.ndarray, mask: np.ndarray, color=(1.0, 0.15, 0.2), alpha: float = 0.45) -> np.ndarray:
    """The image with the mask tinted and its boundary drawn (float32 HxWx3)."""
    from skimage.segmentation import find_boundaries

    out = img.copy()
    out[mask] = (1 - alpha) * out[mask] + alpha * np.asarray(color, dtype=np.float32)
    edge = find_boundaries(mask, mode="inner")
    out[edge] = color
    return out


def token_view(img: np.ndarray, tmask: np.ndarray, grid: int, patch: int = PATCH) -> np.ndarray:
    """Recomputed tokens at full brightness, reused tokens dimmed, patch grid lines drawn."""
    t = tmask.reshape(grid, grid)
    pix = np.repeat(np.repeat(t, patch, 0), patch, 1)
    out = img * np.where(pix[..., None], 1.0, 0.3).astype(np.float32)
    out[::patch, :, :] *= 0.6
    out[:, ::patch, :] *= 0.6
    return out


def _row(t: Template) -> "Image.Image":  # noqa: F821
    from PIL import Image, ImageDraw

    img = t.image()
    mask = t.mask()
    grid = NATIVE_RESOLUTION // PATCH
    tiles = [mask_overlay(img, mask), token_view(img, t.token_mask(grid), grid)]
    w = 2 * TILE + 3 * GAP + PANEL_W
    h = CAPTION + TILE
    row = Image.new("RGB", (w, h), (255, 255, 255))
    d = ImageDraw.Draw(row)
    d.text((GAP, 3), f"{t.id}  ·  {t.task}  ·  {t.model}  ·  mask {t.mask_ratio:.1%}  ·  tokens "
                     f"{t.token_ratio:.1%} ({int(t.token_mask().sum())}/{grid * grid})",
           fill=(0, 0, 0), font=_font(14))
    for i, tile in enumerate(tiles):
        row.paste(Image.fromarray(_u8(tile)), (GAP + i * (TILE + GAP), CAPTION))
    x0 = 2 * TILE + 3 * GAP
    small = _font(12)
    for j, (label, reqs) in enumerate((("profile", t.profile_requests), ("eval", t.eval_requests))):
        y = CAPTION + j * (TILE // 2)
        d.text((x0, y), f"{label} ({len(reqs)})", fill=(90, 90, 90), font=small)
        if t.task == "mb":
            for k, r in enumerate(reqs[:8]):
                d.text((x0 + 8, y + 16 + 13 * k), f"“{r.prompt}”", fill=(0, 0, 0), font=small)
        else:
            for k, r in enumerate(reqs[:8]):
                row.paste(Image.fromarray(_u8(r.reference_image(THUMB))), (x0 + k * (THUMB + 4), y + 18))
    return row


def contact_sheet(catalog: Catalog) -> "Image.Image":  # noqa: F821
    from PIL import Image

    rows = [_row(t) for t in catalog.templates]
    sheet = Image.new("RGB", (rows[0].width, sum(r.height + GAP for r in rows) + GAP), (255, 255, 255))
    y = GAP
    for r in rows:
        sheet.paste(r, (0, y))
        y += r.height + GAP
    return sheet


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sakura.catalog.contact_sheet", description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="output PNG")
    ap.add_argument("--catalog", type=Path, default=None, help="manifest (default: the embedded catalog)")
    ap.add_argument("--full-color", action="store_true",
                    help="keep 24-bit colour (default: a 256-colour palette, ~3x smaller)")
    args = ap.parse_args(argv)
    try:
        cat = load_catalog(args.catalog)
        sheet = contact_sheet(cat)
    except CatalogError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not args.full_color:
        from PIL import Image

        sheet = sheet.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    sheet.save(args.out, optimize=True)
    print(f"wrote {args.out} ({len(cat)} templates, {sheet.width}x{sheet.height})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
