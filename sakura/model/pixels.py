"""Pixels ↔ tokens for the pixel-space embedded models, and the image crops a request is made of."""

from __future__ import annotations

import numpy as np
import torch


def patchify(img: torch.Tensor, p: int) -> torch.Tensor:
    """(H, W, C) → (H/p · W/p, p·p·C), row-major over the token grid."""
    h, w, c = img.shape
    return img.reshape(h // p, p, w // p, p, c).permute(0, 2, 1, 3, 4).reshape((h // p) * (w // p), p * p * c)


def unpatchify(tokens: torch.Tensor, p: int, h: int, w: int, c: int = 3) -> torch.Tensor:
    return tokens.reshape(h // p, w // p, p, p, c).permute(0, 2, 1, 3, 4).reshape(h, w, c)


def template_condition(x0: torch.Tensor, mask_px: torch.Tensor, blank: bool, patch_context: bool) -> torch.Tensor:
    """What the model sees of the template, (..., N, p·p·3). ``blank``: the pixels under the mask are
    hidden (fill-style). Without ``patch_context`` a masked token (one with any masked pixel) also
    hides the pixels of its patch that lie outside the mask: the context then reaches the masked
    tokens only through attention, i.e. from the reusable tokens' K/V."""
    keep = 1 - mask_px if blank else torch.ones_like(mask_px)
    if not patch_context:
        masked_token = (mask_px.amax(-1, keepdim=True) > 0).to(mask_px.dtype)
        keep = keep * (1 - masked_token * (1 - mask_px))
    return (x0.unflatten(-1, (-1, 3)) * keep.unsqueeze(-1)).flatten(-2)


def resize_bilinear(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """(H, W, C) float image → (h, w, C), bilinear, antialiased when shrinking, clipped to [0, 1]."""
    import torch.nn.functional as F

    t = torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32)).permute(2, 0, 1)[None]
    aa = h < img.shape[0] or w < img.shape[1]
    out = F.interpolate(t, size=(h, w), mode="bilinear", align_corners=False, antialias=aa)
    return out[0].permute(1, 2, 0).clamp(0, 1).numpy()


def mask_bbox(mask: np.ndarray) -> tuple[int, int, int, int]:
    """(y0, x0, y1, x1) of a non-empty bool mask."""
    ys, xs = np.nonzero(mask)
    return int(ys.min()), int(xs.min()), int(ys.max()) + 1, int(xs.max()) + 1


def place_in_bbox(canvas: np.ndarray, mask: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """A copy of ``canvas`` with ``ref`` resized onto the mask's bounding box: where a face or
    garment goes, as a face-swap or try-on pipeline aligns its reference before generating."""
    y0, x0, y1, x1 = mask_bbox(mask)
    out = np.array(canvas, dtype=np.float32, copy=True)
    out[y0:y1, x0:x1] = resize_bilinear(ref, y1 - y0, x1 - x0)
    return out


def resize_image(img: np.ndarray, size: int) -> np.ndarray:
    from skimage.transform import resize

    if img.shape[:2] == (size, size):
        return img.astype(np.float32)
    return resize(img, (size, size), anti_aliasing=True).astype(np.float32)


def mask_bbox_crop(img: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The template's own content of the masked region: the conditioning used to capture a cache."""
    y0, x0, y1, x1 = mask_bbox(mask)
    return img[y0:y1, x0:x1]
