"""Regenerate the PNG masks of the embedded catalog (run from the repository root):

    .venv/bin/python templates_catalog/masks/make_masks.py

mb-sd-motorcycle.png: the motorcycle's body (red tank, side covers, fenders, seat) in the cropped
256×256 template frame: red pixels (HSV), their largest connected component, closed and filled,
united with a hand-placed polygon for the black seat, dilated by 3 px.
"""

from pathlib import Path

import numpy as np
from matplotlib.path import Path as MplPath
from PIL import Image
from scipy import ndimage as ndi
from skimage.color import rgb2hsv
from skimage.morphology import closing, dilation, disk

from sakura.catalog import load_image_spec

HERE = Path(__file__).resolve().parent
R = 256
MOTO = {"ref": "skimage:stereo_motorcycle", "crop": [0.176, 0.05, 0.716, 0.85]}  # = catalog.toml
SEAT = [(0.03, 0.36), (0.10, 0.33), (0.30, 0.36), (0.45, 0.39), (0.56, 0.42), (0.50, 0.50),
        (0.35, 0.55), (0.10, 0.50), (0.03, 0.45)]


def motorcycle() -> np.ndarray:
    img = load_image_spec(MOTO, resolution=R)
    h, s, v = np.moveaxis(rgb2hsv(img), -1, 0)
    red = ((h < 0.04) | (h > 0.94)) & (s > 0.45) & (v > 0.2)
    lab, n = ndi.label(closing(red, disk(3)))
    sizes = ndi.sum(np.ones_like(lab), lab, range(1, n + 1))
    body = lab == 1 + int(np.argmax(sizes))
    c = (np.arange(R) + 0.5) / R
    xs, ys = np.meshgrid(c, c)
    seat = MplPath(np.array(SEAT)).contains_points(np.stack([xs.ravel(), ys.ravel()], 1)).reshape(R, R)
    m = ndi.binary_fill_holes(closing(body | seat, disk(6)))
    return dilation(m, disk(3))


if __name__ == "__main__":
    m = motorcycle()
    Image.fromarray((m * 255).astype(np.uint8)).save(HERE / "mb-sd-motorcycle.png", optimize=True)
    print(f"mb-sd-motorcycle.png: {m.mean():.1%}")
