"""Image quality metrics. Every compression comparison is against the FP16-cache output."""

from __future__ import annotations

import numpy as np
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

PSNR_CAP = 100.0  # identical images: report a finite number so means stay meaningful


def psnr(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None = None) -> float:
    """PSNR in dB of float images in [0, 1]; with ``mask`` (HxW bool), only the masked pixels."""
    if mask is not None:
        a, b = a[mask], b[mask]
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    if mse == 0:
        return PSNR_CAP
    return min(PSNR_CAP, float(peak_signal_noise_ratio(a, b, data_range=1.0)))


def ssim(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None = None) -> float:
    """SSIM over the whole image; with ``mask``, the mean of the SSIM map inside the mask."""
    if mask is None:
        return float(structural_similarity(a, b, channel_axis=-1, data_range=1.0))
    _, smap = structural_similarity(a, b, channel_axis=-1, data_range=1.0, full=True)
    return float(smap.mean(axis=-1)[mask].mean())


def quality(out: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    return {"psnr": psnr(out, ref), "ssim": ssim(out, ref),
            "psnr_masked": psnr(out, ref, mask), "ssim_masked": ssim(out, ref, mask)}
