"""Progressive (bit-plane) scalar quantisation of low-rank factor components (paper §4.2.3).

Each rank component (a column of A, a row of B — passed here as the rows of a ``(R, L)`` matrix) has
one max-abs scale ``s`` and 8-bit unsigned codes over the nested cells of ``[-s, s]``:

    k = clamp(floor((x / s + 1) · 2^7), 0, 255)          (offset binary)

Cell ``k`` of width ``2s/256`` sits inside cell ``k >> 1`` of width ``2s/128`` and so on, so the top
``b`` bits of ``k`` name the ``b``-bit cell that contains ``x``. Reading only the first ``b`` bit
planes (MSB first) therefore gives a valid ``b``-bit quantisation with the *same* scale, and we
reconstruct at the centre of that cell, not its floor, which halves the worst-case error:

    x̂_b = s · ((k_b + ½) · 2^(1−b) − 1),   |x − x̂_b| ≤ s / 2^b.

Planes are packed with ``np.packbits`` (MSB-first within each byte), one byte row per component.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sakura.offline.lowrank import Factors

PLANES = 8  # bits of a full code; every stored factor has this many planes


def quantize(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``m`` (R, L) → (codes uint8 (R, L), scales float32 (R,)). A zero row gets scale 0."""
    m = np.asarray(m, dtype=np.float64)
    scales = np.abs(m).max(axis=1).astype(np.float32)
    s = scales.astype(np.float64)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(s > 0, m / np.where(s > 0, s, 1.0), 0.0)
    codes = np.clip(np.floor((u + 1.0) * (1 << (PLANES - 1))), 0, (1 << PLANES) - 1)
    return codes.astype(np.uint8), scales


def truncate(codes: np.ndarray, bits: int) -> np.ndarray:
    """The ``bits``-bit prefix of full codes (what a client holding ``bits`` planes knows)."""
    return codes >> (PLANES - bits)


def dequantize(prefix: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """Centre of the ``bits``-bit cell: ``prefix`` (r, L) in [0, 2^bits), ``scales`` (r,) → float32."""
    if not 1 <= bits <= PLANES:
        raise ValueError(f"bits must be in 1..{PLANES}, got {bits}")
    step = 2.0 ** (1 - bits)
    u = (prefix.astype(np.float32) + 0.5) * np.float32(step) - 1.0
    return (u * np.asarray(scales, dtype=np.float32)[:, None]).astype(np.float32)


def to_planes(codes: np.ndarray) -> np.ndarray:
    """(..., L) uint8 codes → (PLANES, ..., ceil(L/8)) packed bit planes, plane 0 = MSB."""
    bits = np.unpackbits(codes[..., None], axis=-1)  # (..., L, 8), MSB first
    bits = np.moveaxis(bits, -1, 0)  # (8, ..., L)
    return np.packbits(bits, axis=-1)


def from_planes(planes: np.ndarray, length: int) -> np.ndarray:
    """(b, ..., ceil(L/8)) packed planes (MSB first) → (..., L) uint8 ``b``-bit prefixes."""
    bits = np.unpackbits(planes, axis=-1, count=length)  # (b, ..., L)
    out = np.zeros(bits.shape[1:], dtype=np.uint8)
    for plane in bits:
        out = (out << 1) | plane
    return out


def plane_bytes(length: int) -> int:
    """Bytes of one packed plane of one component of ``length`` values."""
    return (length + 7) // 8


@dataclass
class QuantizedFactors:
    """One unit's factors as stored: full 8-bit codes per component (component-major) + scales."""

    a_codes: np.ndarray  # (R, n) uint8, row j = column j of A
    a_scales: np.ndarray  # (R,) float32
    b_codes: np.ndarray  # (R, d) uint8
    b_scales: np.ndarray  # (R,) float32
    mean: np.ndarray  # (d,) float16, sent with every configuration

    @property
    def rank(self) -> int:
        return int(self.a_codes.shape[0])

    def dequantize(self, r: int, bits_a: int, bits_b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(A (n, r), B (r, d), mean (d,)) as float32, exactly what a client holding the prefix rebuilds."""
        a = dequantize(truncate(self.a_codes[:r], bits_a), self.a_scales[:r], bits_a).T
        b = dequantize(truncate(self.b_codes[:r], bits_b), self.b_scales[:r], bits_b)
        return np.ascontiguousarray(a), b, self.mean.astype(np.float32)


def quantize_factors(f: Factors) -> QuantizedFactors:
    a_codes, a_scales = quantize(f.a.T.numpy())
    b_codes, b_scales = quantize(f.b.numpy())
    return QuantizedFactors(a_codes, a_scales, b_codes, b_scales, f.mean.numpy().astype(np.float16))
