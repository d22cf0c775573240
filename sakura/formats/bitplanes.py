"""Progressive (bit-plane) scalar quantisation of low-rank factor components (paper §4.2.3).

Each rank component (a column of A, a row of B — passed here as the rows of a ``(R, L)`` matrix) has
one max-abs scale ``s`` and 8-bit unsigned codes over the nested cells of ``[-s, s]``:

    k = clamp(floor((x / s + 1) · 2^7), 0, 255)          (offset binary)

Cell ``k`` of width ``2s/256`` sits inside cell ``k >> 1`` of width ``2s/128`` and so on, so the top
``b`` bits of ``k`` name the ``b``-bit cell that contains ``x``. Reading only the first ``b`` bit
planes (MSB first) therefore gives a valid ``b``-bit quantisation with the *same* scale, and we
reconstruct at the centre of that cell, not its floor, which halves the worst-case error:

    x̂_b = s · ((k_b + ½) · 2^(1−b) − 1),   |x − x̂_b| ≤ s / 2^b.

Dead zone. Importance-weighted factorisation makes some components *spiky*: a few important,
outlier rows set the max-abs scale and everything else sits near zero. At low ``b`` the centre
rule puts those small values at ±s/2^b, which costs more than the component is worth (adding it
would *raise* the error). So each component also stores one ``zero`` byte: if bit ``b−1`` is set,
a ``b``-bit prefix reconstructs the two cells touching zero at 0 — the centre of their union
(−Δ, Δ), i.e. a dead-zone quantiser — instead of ±Δ/2. The bit is chosen offline per (component,
b) by whichever gives the lower (row-weighted) squared error; the codes and cells are unchanged.

Planes are packed with ``np.packbits`` (MSB-first within each byte), one byte row per component.
Stored, a factor of a shard is ``PLANES`` plane arrays of records ``(R, U, …)`` (component-major,
then cache unit): plane 0's records start with the component's head (f32 scale, u8 dead-zone
bits). :func:`plane_records` writes them; :class:`FactorBytes` reads a received prefix of them.
This is the part of the pack format the device decodes with, so it imports nothing offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

PLANES = 8  # bits of a full code; every stored factor has this many planes
HEAD_BYTES = 5  # per (component, cache unit, factor) in plane 0: float32 scale + u8 dead-zone bits


def dequantize(prefix: np.ndarray, scales: np.ndarray, bits: int, zero: np.ndarray | None = None) -> np.ndarray:
    """Reconstruct ``bits``-bit prefixes (r, L) with ``scales`` (r,) and dead-zone bytes ``zero`` (r,)."""
    if not 1 <= bits <= PLANES:
        raise ValueError(f"bits must be in 1..{PLANES}, got {bits}")
    step = np.float32(2.0 ** (1 - bits))
    u = (prefix.astype(np.float32) + np.float32(0.5)) * step - np.float32(1.0)
    if zero is not None:
        half = 1 << (bits - 1)
        dead = ((np.asarray(zero) >> (bits - 1)) & 1).astype(bool)[:, None]
        u = np.where(dead & ((prefix == half) | (prefix == half - 1)), np.float32(0.0), u)
    return (u * np.asarray(scales, dtype=np.float32)[:, None]).astype(np.float32)


def quantize(m: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``m`` (R, L) → codes uint8 (R, L), scales float32 (R,), dead-zone bytes uint8 (R,).

    ``weights`` (L,) weigh the squared error used to pick the dead-zone bits (None = uniform).
    A zero row gets scale 0 (reconstructs to exactly 0).
    """
    m = np.asarray(m, dtype=np.float64)
    scales = np.abs(m).max(axis=1).astype(np.float32)
    s = scales.astype(np.float64)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(s > 0, m / np.where(s > 0, s, 1.0), 0.0)
    codes = np.clip(np.floor((u + 1.0) * (1 << (PLANES - 1))), 0, (1 << PLANES) - 1).astype(np.uint8)
    w = np.ones(m.shape[1]) if weights is None else np.asarray(weights, dtype=np.float64)
    zero = np.zeros(len(scales), dtype=np.uint8)
    all_dead = np.full(len(scales), 0xFF, dtype=np.uint8)
    for b in range(1, PLANES + 1):
        p = truncate(codes, b)
        centre = ((dequantize(p, scales, b) - m) ** 2 @ w)
        dead = ((dequantize(p, scales, b, all_dead) - m) ** 2 @ w)
        zero |= (dead < centre).astype(np.uint8) << (b - 1)
    return codes, scales, zero


def truncate(codes: np.ndarray, bits: int) -> np.ndarray:
    """The ``bits``-bit prefix of full codes (what a client holding ``bits`` planes knows)."""
    return codes >> (PLANES - bits)


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
    """One unit's factors as stored: full 8-bit codes per component (component-major), scales, dead-zone bytes."""

    a_codes: np.ndarray  # (R, n) uint8, row j = column j of A
    a_scales: np.ndarray  # (R,) float32
    a_zero: np.ndarray  # (R,) uint8
    b_codes: np.ndarray  # (R, d) uint8
    b_scales: np.ndarray  # (R,) float32
    b_zero: np.ndarray  # (R,) uint8
    mean: np.ndarray  # (d,) float16, sent with every configuration

    @property
    def rank(self) -> int:
        return int(self.a_codes.shape[0])

    def a_hat(self, bits: int, r: int | None = None) -> np.ndarray:
        """Dequantised A prefix, component-major (r, n)."""
        r = self.rank if r is None else r
        return dequantize(truncate(self.a_codes[:r], bits), self.a_scales[:r], bits, self.a_zero[:r])

    def b_hat(self, bits: int, r: int | None = None) -> np.ndarray:
        r = self.rank if r is None else r
        return dequantize(truncate(self.b_codes[:r], bits), self.b_scales[:r], bits, self.b_zero[:r])

    def dequantize(self, r: int, bits_a: int, bits_b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(A (n, r), B (r, d), mean (d,)) as float32, exactly what a client holding the prefix rebuilds."""
        return np.ascontiguousarray(self.a_hat(bits_a, r).T), self.b_hat(bits_b, r), self.mean.astype(np.float32)



def plane_records(codes: Sequence[np.ndarray], scales: Sequence[np.ndarray], zero: Sequence[np.ndarray]
                  ) -> list[np.ndarray]:
    """One factor of a shard's cache units (codes (R, L), scales (R,), zero (R,) per unit) as
    ``PLANES`` arrays of records, plane 0 first: ``(R, U, HEAD_BYTES + ⌈L/8⌉)`` then ``(R, U, ⌈L/8⌉)``."""
    planes = to_planes(np.stack(codes, axis=1))  # (8, R, U, ⌈L/8⌉): component-major, then unit
    head = np.concatenate([np.stack(scales, axis=1).astype("<f4")[..., None].view(np.uint8),
                           np.stack(zero, axis=1)[..., None]], axis=-1)  # (R, U, 5)
    return [np.concatenate([head, planes[0]], axis=-1)] + list(planes[1:])


@dataclass
class FactorBytes:
    """One factor's received bit planes for a shard, as one contiguous byte string.

    Layout: plane 0 as ``(r, U, 5 + pb)`` records (little-endian f32 scale, u8 dead-zone bits, then
    ``pb`` bytes of MSB-first packed bits), then planes ``1 .. bits-1`` as ``(r, U, pb)``. ``length`` values per
    component (n for A, d for B), ``pb = ⌈length/8⌉``."""

    raw: bytes
    bits: int
    length: int

    @property
    def pb(self) -> int:
        return plane_bytes(self.length)

    def dequantize(self, r: int, units: int) -> np.ndarray:
        """The first ``r`` components of every cache unit, float32 ``(U, r, length)``."""
        raw = np.frombuffer(self.raw, dtype=np.uint8)
        first = r * units * (HEAD_BYTES + self.pb)
        records = raw[:first].reshape(r, units, HEAD_BYTES + self.pb)
        scales = np.ascontiguousarray(records[..., :4]).view("<f4")[..., 0]  # (r, U)
        zero = records[..., 4]  # (r, U)
        rest = raw[first:].reshape(self.bits - 1, r, units, self.pb)
        planes = np.concatenate([records[None, ..., HEAD_BYTES:], rest])
        codes = from_planes(planes, self.length)  # (r, U, L)
        return np.stack([dequantize(codes[:, k], scales[:, k], self.bits, zero[:, k]) for k in range(units)])
