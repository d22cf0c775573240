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


def blank_masked(x0: torch.Tensor, mask_px: torch.Tensor) -> torch.Tensor:
    """Template tokens (..., N, p·p·3) with the masked pixels set to 0 (mid-gray in [-1, 1]);
    ``mask_px`` is the patchified pixel mask (..., N, p·p)."""
    keep = (1 - mask_px).unsqueeze(-1)
    return (x0.unflatten(-1, (-1, 3)) * keep).flatten(-2)


def resize_image(img: np.ndarray, size: int) -> np.ndarray:
    from skimage.transform import resize

    if img.shape[:2] == (size, size):
        return img.astype(np.float32)
    return resize(img, (size, size), anti_aliasing=True).astype(np.float32)


def mask_bbox_crop(img: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The template's own content of the masked region: the conditioning used to capture a cache."""
    ys, xs = np.nonzero(mask)
    return img[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
