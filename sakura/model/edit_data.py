"""Synthetic edit tasks for training and evaluating the embedded models — no download.

Every example is a template image (256×256, float32 in [0, 1]), a pixel mask, a task and its
request (a reference image for ``fs`` / ``vton``, a text instruction for ``mb``) and the ground
truth ``target``, which equals the template outside the mask *exactly*:

* ``fs``   — an ellipse (≈ 8–15 % of the image); a face (``lfw_subset``, tinted) or a portrait crop is
  resized to the mask's bounding box, colour-harmonised toward the ring around the mask and
  feathered in.
* ``vton`` — a box or torso-like polygon (≈ 20–32 %); a garment-like patch (a texture crop or a
  procedural stripe / check / solid cloth) pasted the same way.
* ``mb``   — an object-like blob (≈ 12–25 %); a text instruction applied inside the mask (recolour,
  brighter, darker, blur, sharpen, stripes, dots, invert, grayscale, more saturated, keep).

The ``keep`` prompt (and for fs/vton the template's own bounding-box crop as reference) leaves
the template unchanged: that is the conditioning a template cache is captured with.

Images come from packages (skimage.data, sklearn, matplotlib) with heavy augmentation (random
crop and scale, flip, colour jitter). Some source images and lfw faces are held out for
evaluation (``split="heldout"``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from sakura.model.pixels import mask_bbox, place_in_bbox, resize_bilinear

RES = 256
TASKS = ("fs", "vton", "mb")
MASK_RANGES = {"fs": (0.08, 0.15), "vton": (0.20, 0.32), "mb": (0.12, 0.25)}

# (name, weight); gray sources are turned to RGB (and often tinted by the colour jitter)
# grace_hopper is the demo's showcase face and a catalog template: it is held out of training, so the
# face swap the demo shows is one the model never saw (as are its fs / vton templates).
TRAIN_SOURCES = ("astronaut", "coffee", "chelsea", "immunohistochemistry", "hubble_deep_field",
                 "stereo_motorcycle", "camera", "china", "brick", "grass", "gravel",
                 "coins", "retina", "clock", "moon", "colorwheel")
HELDOUT_SOURCES = ("rocket", "flower")
TEXTURE_SOURCES = ("brick", "grass", "gravel", "coffee", "chelsea", "china", "immunohistochemistry",
                   "hubble_deep_field", "colorwheel", "retina")
HELDOUT_TEXTURES = ("rocket", "flower")
FACES_TRAIN = range(0, 85)  # lfw_subset faces 0..99; 85..99 held out
FACES_HELDOUT = range(85, 100)
# rough face / upper-body boxes (fractions x0, y0, x1, y1) in portrait sources, used as fs references
PORTRAIT_FACES = {"astronaut": (0.33, 0.05, 0.62, 0.45)}
CONTENT_REF_PROB = 0.35  # fs references that are crops of any training image: transfer at full resolution

COLORS = {"red": (0.85, 0.1, 0.1), "green": (0.1, 0.7, 0.15), "blue": (0.1, 0.2, 0.85),
          "yellow": (0.95, 0.85, 0.1), "purple": (0.55, 0.15, 0.7), "orange": (0.95, 0.5, 0.05),
          "pink": (0.95, 0.45, 0.7), "cyan": (0.1, 0.8, 0.85), "white": (0.95, 0.95, 0.95),
          "black": (0.05, 0.05, 0.05)}
MB_OPS = ("color", "brighter", "darker", "blur", "sharpen", "stripes", "dots", "invert", "grayscale",
          "saturate", "keep")
EDIT_OPS = MB_OPS[:-1]  # the ops that change the image ("keep" is the capture conditioning)
_PHRASES = {
    "brighter": ("make it brighter", "brighten it", "brighter", "lighten the object"),
    "darker": ("make it darker", "darken it", "darker", "make the object dark"),
    "blur": ("blur it", "make it blurry", "blur the object", "soften it"),
    "sharpen": ("sharpen it", "make it sharper", "sharpen the details", "sharper"),
    "stripes": ("add stripes", "make it striped", "stripes", "add striped pattern"),
    "dots": ("add dots", "add polka dots", "dotted", "add spots"),
    "invert": ("invert colors", "invert it", "negative", "invert the colours"),
    "grayscale": ("make it grayscale", "grayscale", "remove the color", "black and white"),
    "saturate": ("more saturated", "make it vivid", "boost the colors", "saturate it"),
    "keep": ("keep",),
}
_COLOR_PHRASES = ("make it {c}", "turn it {c}", "paint it {c}", "{c}", "change the color to {c}")
REF_PROMPTS = ("", "", "swap", "swap the face", "try on", "wear this", "replace it", "put this on")


@dataclass
class EditExample:
    template: np.ndarray  # (R, R, 3) float32 [0, 1]
    mask: np.ndarray  # (R, R) bool
    task: str
    prompt: str
    reference: np.ndarray | None  # (h, w, 3) float32 [0, 1] for fs / vton
    target: np.ndarray  # (R, R, 3) float32, == template outside the mask
    op: str = ""  # mb op / "paste" / "keep" (for reports)


# ------------------------------------------------------------------------------- image sources
def _to_rgb(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == bool:
        a = a.astype(np.float32)
    elif a.dtype == np.uint8:
        a = a.astype(np.float32) / 255.0
    else:
        a = a.astype(np.float32)
        if a.max() > 1.0:
            a = a / 255.0
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=2)
    if a.shape[2] == 4:
        a = a[..., :3] * a[..., 3:] + (1 - a[..., 3:])
    return np.ascontiguousarray(a[..., :3])


@functools.lru_cache(maxsize=None)
def source_image(name: str) -> np.ndarray:
    """A package-shipped image as float32 RGB in [0, 1]."""
    if name in ("china", "flower"):
        from sklearn.datasets import load_sample_image

        return _to_rgb(load_sample_image(f"{name}.jpg"))
    if name == "grace_hopper":
        import matplotlib.cbook as cbook
        from PIL import Image

        with cbook.get_sample_data("grace_hopper.jpg") as f:
            return _to_rgb(np.asarray(Image.open(f).convert("RGB")))
    import skimage.data as data

    if name == "stereo_motorcycle":
        return _to_rgb(data.stereo_motorcycle()[0])
    return _to_rgb(getattr(data, name)())


@functools.lru_cache(maxsize=None)
def lfw_faces() -> np.ndarray:
    import skimage.data as data

    return data.lfw_subset()[:100].astype(np.float32)  # (100, 25, 25) gray faces


resize = resize_bilinear


def luminance(img: np.ndarray) -> np.ndarray:
    return img @ np.array([0.299, 0.587, 0.114], dtype=np.float32)


def color_jitter(img: np.ndarray, rng: np.random.Generator, strength: float = 1.0) -> np.ndarray:
    """Brightness, contrast, saturation, hue rotation (YIQ) and, for gray images, a random tint."""
    img = img.astype(np.float32)
    if np.allclose(img[..., 0], img[..., 1], atol=1e-3) and rng.random() < 0.7:
        tint = rng.uniform(0.5, 1.0, 3).astype(np.float32)
        img = img * tint / tint.max()
    s = strength
    img = img * rng.uniform(1 - 0.25 * s, 1 + 0.25 * s)
    m = img.mean()
    img = (img - m) * rng.uniform(1 - 0.3 * s, 1 + 0.3 * s) + m
    L = luminance(img)[..., None]
    img = L + (img - L) * rng.uniform(1 - 0.4 * s, 1 + 0.4 * s)
    a = rng.uniform(-0.25, 0.25) * s  # hue rotation angle (radians) in the IQ plane
    yiq = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]], np.float32)
    rot = np.array([[1, 0, 0], [0, math.cos(a), -math.sin(a)], [0, math.sin(a), math.cos(a)]], np.float32)
    mat = np.linalg.inv(yiq) @ rot @ yiq
    img = img @ mat.T.astype(np.float32)
    return np.clip(img, 0, 1).astype(np.float32)


def random_crop(img: np.ndarray, rng: np.random.Generator, out_h: int, out_w: int,
                scale: tuple[float, float] = (0.35, 1.0), flip: bool = True) -> np.ndarray:
    """A random crop of relative side ``scale`` of the short side (aspect out_h:out_w), resized."""
    H, W = img.shape[:2]
    side = rng.uniform(*scale) * min(H, W)
    ch = int(max(8, min(H, side * min(1.0, out_h / out_w))))
    cw = int(max(8, min(W, side * min(1.0, out_w / out_h))))
    y = rng.integers(0, H - ch + 1)
    x = rng.integers(0, W - cw + 1)
    crop = img[y : y + ch, x : x + cw]
    if flip and rng.random() < 0.5:
        crop = crop[:, ::-1]
    return resize(crop, out_h, out_w)


# ------------------------------------------------------------------------------- masks
def _polygon_mask(pts_yx: np.ndarray, res: int = RES) -> np.ndarray:
    from skimage.draw import polygon

    m = np.zeros((res, res), dtype=bool)
    rr, cc = polygon(pts_yx[:, 0], pts_yx[:, 1], shape=m.shape)
    m[rr, cc] = True
    return m


def _shoelace(p: np.ndarray) -> float:
    y, x = p[:, 0], p[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))


def _shape(task: str, rng: np.random.Generator) -> np.ndarray:
    """A unit-ish polygon (y, x) centred at 0 for the task's mask kind."""
    th = np.linspace(0, 2 * np.pi, 72, endpoint=False)
    if task == "fs":  # a face: upright ellipse, slightly rotated
        b = rng.uniform(1.1, 1.45)
        pts = np.stack([b * np.sin(th), np.cos(th)], 1)
        ang = rng.uniform(-0.17, 0.17)
    elif task == "vton":
        w, h = 1.0, rng.uniform(0.9, 1.35)
        if rng.random() < 0.5:  # torso: neck, shoulders, waist
            neck, shoulder, waist = rng.uniform(0.3, 0.5), rng.uniform(0.12, 0.25), rng.uniform(0.75, 0.95)
            pts = np.array([[-h / 2, -neck / 2], [-h / 2 + shoulder * h, -w / 2], [h / 2, -waist / 2],
                            [h / 2, waist / 2], [-h / 2 + shoulder * h, w / 2], [-h / 2, neck / 2]])
        else:  # a (slightly rounded) box
            r = rng.uniform(0.0, 0.15)
            pts = np.array([[-h / 2, -w / 2 + r], [-h / 2 + r, -w / 2], [h / 2 - r, -w / 2], [h / 2, -w / 2 + r],
                            [h / 2, w / 2 - r], [h / 2 - r, w / 2], [-h / 2 + r, w / 2], [-h / 2, w / 2 - r]])
        ang = rng.uniform(-0.08, 0.08)
    else:  # mb: an object-like blob r(θ) = 1 + Σ a_k cos(kθ + φ_k)
        r = np.ones_like(th)
        for k in (2, 3, 4, 5):
            r += rng.uniform(0, 0.18 / (k - 1) ** 0.5) * np.cos(k * th + rng.uniform(0, 2 * np.pi))
        pts = np.stack([r * np.sin(th) * rng.uniform(0.75, 1.3), r * np.cos(th)], 1)
        ang = rng.uniform(-np.pi, np.pi)
    c, s = math.cos(ang), math.sin(ang)
    return pts @ np.array([[c, s], [-s, c]])


def make_mask(task: str, rng: np.random.Generator, region: tuple[int, int, int, int] | None = None,
              res: int = RES) -> np.ndarray:
    """A bool (res, res) mask of the task's kind whose area is inside ``MASK_RANGES[task]`` of the
    image; if ``region`` = (y0, x0, y1, x1) is given, the mask lies inside it (as far as it fits)."""
    lo, hi = MASK_RANGES[task]
    span = hi - lo
    frac = rng.uniform(lo + 0.08 * span, hi - 0.08 * span)  # margin for rasterisation error
    pts = _shape(task, rng)
    pts = pts * math.sqrt(frac * res * res / _shoelace(pts))
    y0, x0, y1, x1 = region if region is not None else (0, 0, res, res)
    pad = 4
    ext_lo, ext_hi = pts.min(0), pts.max(0)
    cy_lo, cy_hi = y0 + pad - ext_lo[0], y1 - pad - ext_hi[0]
    cx_lo, cx_hi = x0 + pad - ext_lo[1], x1 - pad - ext_hi[1]
    cy = rng.uniform(cy_lo, cy_hi) if cy_hi > cy_lo else (cy_lo + cy_hi) / 2
    cx = rng.uniform(cx_lo, cx_hi) if cx_hi > cx_lo else (cx_lo + cx_hi) / 2
    cy = float(np.clip(cy, -ext_lo[0], res - 1 - ext_hi[0]))
    cx = float(np.clip(cx, -ext_lo[1], res - 1 - ext_hi[1]))
    return _polygon_mask(pts + np.array([cy, cx]), res)


# ------------------------------------------------------------------------------- edits
bbox = mask_bbox


BAND = 6.0  # px inside the mask over which an edit blends into what surrounds it


def blend_into_context(edited: np.ndarray, template: np.ndarray, mask: np.ndarray, band: float = BAND) -> np.ndarray:
    """``edited`` inside the mask, blended over ``band`` px at its edge toward the nearest template
    pixel *outside* the mask (a soft edge that continues the surroundings), the template outside. The
    edge then depends on the exact pixels around the mask — for the model, on the reusable tokens."""
    dist, idx = ndimage.distance_transform_edt(mask, return_indices=True)
    outside_nearest = template[idx[0], idx[1]]
    a = np.clip((dist - 0.5) / band, 0, 1)[..., None].astype(np.float32)
    out = edited * a + outside_nearest * (1 - a)
    return np.where(mask[..., None], out, template).astype(np.float32)


def paste_harmonized(template: np.ndarray, mask: np.ndarray, ref: np.ndarray, alpha: float = 0.6,
                     ring: float = 12.0, band: float = BAND) -> np.ndarray:
    """The reference resized to the mask's bounding box, its per-channel mean/std moved a fraction
    ``alpha`` toward the ring around the mask, blended into the surroundings over ``band`` px."""
    canvas = place_in_bbox(template, mask, ref)
    outside = ndimage.distance_transform_edt(~mask)
    ring_px = (outside > 0) & (outside <= ring)
    src = canvas[mask]
    if ring_px.sum() >= 8:
        tm, ts = template[ring_px].mean(0), template[ring_px].std(0) + 1e-3
        sm, ss = src.mean(0), src.std(0) + 1e-3
        m2, s2 = sm + alpha * (tm - sm), ss + alpha * (ts - ss)
        canvas[mask] = np.clip((src - sm) / ss * s2 + m2, 0, 1)
    return blend_into_context(canvas, template, mask, band)


def apply_op(img: np.ndarray, op: str, color: str | None = None, rng: np.random.Generator | None = None) -> np.ndarray:
    """The instruction's effect on the whole image (the caller keeps it inside the mask)."""
    if op == "keep":
        return img
    L = luminance(img)[..., None]
    if op == "color":
        c = np.array(COLORS[color], np.float32)
        return np.clip(0.2 * img + 0.8 * c * (0.45 + 0.9 * L), 0, 1)
    if op == "brighter":
        return np.clip(img * 1.1 + 0.22, 0, 1)
    if op == "darker":
        return img * 0.5
    if op == "blur":
        return ndimage.gaussian_filter(img, sigma=(4, 4, 0))
    if op == "sharpen":
        return np.clip(img + 1.5 * (img - ndimage.gaussian_filter(img, sigma=(2, 2, 0))), 0, 1)
    if op == "stripes":
        y = np.arange(img.shape[0])[:, None, None]
        return np.where((y // 8) % 2 == 0, img, img * 0.3 + 0.05).astype(np.float32)
    if op == "dots":
        yy, xx = np.mgrid[0 : img.shape[0], 0 : img.shape[1]]
        dot = (((yy % 14) - 7) ** 2 + ((xx % 14) - 7) ** 2 <= 16)[..., None]
        return np.where(dot, 0.8 + 0.2 * img, img).astype(np.float32)
    if op == "invert":
        return 1 - img
    if op == "grayscale":
        return np.repeat(L, 3, axis=2)
    if op == "saturate":
        return np.clip(L + (img - L) * 2.2, 0, 1)
    raise ValueError(f"unknown mb op {op!r}")


def mb_prompt(op: str, rng: np.random.Generator, color: str | None = None) -> str:
    if op == "color":
        return str(rng.choice(_COLOR_PHRASES)).format(c=color)
    return str(rng.choice(_PHRASES[op]))


# ------------------------------------------------------------------------------- the synthesizer
class EditSynth:
    """Draws random edit examples from the ``train`` or ``heldout`` images."""

    def __init__(self, split: str = "train", res: int = RES, mb_op_weights: dict[str, float] | None = None):
        if split not in ("train", "heldout"):
            raise ValueError("split is train or heldout")
        self.split, self.res = split, res
        unknown = set(mb_op_weights or {}) - set(EDIT_OPS)
        if unknown:
            raise ValueError(f"unknown mb ops {sorted(unknown)}; ops are {', '.join(EDIT_OPS)}")
        # relative weight of each edit op (keep is drawn separately, with keep_prob): uniform by default
        w = np.array([(mb_op_weights or {}).get(o, 1.0) for o in EDIT_OPS], dtype=np.float64)
        self.mb_op_p = w / w.sum() if mb_op_weights else None
        self.sources = TRAIN_SOURCES if split == "train" else HELDOUT_SOURCES
        self.textures = TEXTURE_SOURCES if split == "train" else HELDOUT_TEXTURES
        self.faces = FACES_TRAIN if split == "train" else FACES_HELDOUT

    def template(self, rng: np.random.Generator) -> np.ndarray:
        img = source_image(str(rng.choice(self.sources)))
        return color_jitter(random_crop(img, rng, self.res, self.res), rng)

    def face(self, rng: np.random.Generator) -> np.ndarray:
        """A face-swap reference. Training mixes faces with crops of every training image, because the
        swap is a transfer: lfw faces are 25×25, and only high-resolution content teaches detail."""
        u = rng.random() if self.split == "train" else 1.0
        if u < CONTENT_REF_PROB:
            h = int(rng.integers(64, 129))
            img = source_image(str(rng.choice(self.sources)))
            return color_jitter(random_crop(img, rng, h, int(h * rng.uniform(0.7, 1.0)), scale=(0.15, 0.6)), rng, 0.6)
        if u < CONTENT_REF_PROB + 0.2:
            name = str(rng.choice(list(PORTRAIT_FACES)))
            img = source_image(name)
            H, W = img.shape[:2]
            fx0, fy0, fx1, fy1 = PORTRAIT_FACES[name]
            j = rng.uniform(-0.04, 0.04, 4)
            crop = img[int((fy0 + j[1]) * H) : int((fy1 + j[3]) * H), int((fx0 + j[0]) * W) : int((fx1 + j[2]) * W)]
            if rng.random() < 0.5:
                crop = crop[:, ::-1]
            return color_jitter(resize(crop, 128, 112), rng, 0.6)
        g = lfw_faces()[int(rng.choice(list(self.faces)))]
        tint = np.array([rng.uniform(0.85, 1.0), rng.uniform(0.6, 0.8), rng.uniform(0.45, 0.7)], np.float32)
        rgb = g[..., None] * tint * rng.uniform(0.9, 1.2)
        if rng.random() < 0.5:
            rgb = rgb[:, ::-1]
        return color_jitter(resize(np.clip(rgb, 0, 1).astype(np.float32), 64, 64), rng, 0.5)

    def garment(self, rng: np.random.Generator) -> np.ndarray:
        h, w = 64, int(rng.integers(44, 64))
        k = rng.random()
        if k < 0.5:
            img = source_image(str(rng.choice(self.textures)))
            return color_jitter(random_crop(img, rng, h, w, scale=(0.1, 0.5)), rng)
        base = rng.uniform(0.05, 0.95, 3).astype(np.float32)
        other = rng.uniform(0.05, 0.95, 3).astype(np.float32)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        period = rng.uniform(5, 16)
        if k < 0.7:  # stripes (any orientation)
            a = rng.uniform(0, np.pi)
            sel = (np.sin((yy * math.cos(a) + xx * math.sin(a)) * 2 * np.pi / period) > 0)[..., None]
        elif k < 0.85:  # checks
            sel = (((yy // period) + (xx // period)) % 2 == 0)[..., None]
        else:  # plain cloth
            sel = np.zeros((h, w, 1), bool)
        cloth = np.where(sel, other, base) * (1 + 0.08 * rng.standard_normal((h, w, 1))).astype(np.float32)
        shade = 0.8 + 0.2 * np.cos(xx / w * np.pi - np.pi / 2)[..., None]  # round body shading
        return np.clip(cloth * shade, 0, 1).astype(np.float32)

    def sample(self, rng: np.random.Generator, task: str | None = None,
               region: tuple[int, int, int, int] | None = None, keep_prob: float = 0.06,
               mb_op: str | None = None) -> EditExample:
        task = task or str(rng.choice(TASKS))
        tpl = self.template(rng)
        mask = make_mask(task, rng, region, self.res)
        if task in ("fs", "vton"):
            if rng.random() < keep_prob:  # the capture conditioning: own crop + "keep"
                y0, x0, y1, x1 = bbox(mask)
                return EditExample(tpl, mask, task, "keep", tpl[y0:y1, x0:x1].copy(), tpl.copy(), "keep")
            ref = self.face(rng) if task == "fs" else self.garment(rng)
            target = paste_harmonized(tpl, mask, ref, alpha=0.6)
            return EditExample(tpl, mask, task, str(rng.choice(REF_PROMPTS)), ref, target, "paste")
        if mb_op is None:
            mb_op = "keep" if rng.random() < keep_prob else str(rng.choice(EDIT_OPS, p=self.mb_op_p))
        color = str(rng.choice(list(COLORS))) if mb_op == "color" else None
        edited = apply_op(tpl, mb_op, color, rng)
        target = tpl.copy() if mb_op == "keep" else blend_into_context(edited, tpl, mask)
        return EditExample(tpl, mask, "mb", mb_prompt(mb_op, rng, color), None, target,
                           mb_op if color is None else f"color:{color}")


def heldout_examples(n_per_task: int = 4, seed: int = 12345) -> list[EditExample]:
    """A fixed evaluation set from held-out images, faces and textures (no 'keep')."""
    synth = EditSynth("heldout")
    out = []
    for ti, task in enumerate(TASKS):
        for i in range(n_per_task):
            rng = np.random.default_rng([seed, ti, i])
            op = None
            if task == "mb":
                op = EDIT_OPS[i % len(EDIT_OPS)]
            out.append(synth.sample(rng, task, keep_prob=0.0, mb_op=op))
    return out
