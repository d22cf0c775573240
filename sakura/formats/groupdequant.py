"""Dequantisation of a v2 pack's received plane chunks, every component at its own group's plane count:
planes unpacked 8 values per table lookup, then each code looked up in a per-(unit, component) value
table — :func:`sakura.formats.bitplanes.dequantize`, bit for bit."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sakura.formats import chunkcodec
from sakura.formats.bitplanes import HEAD_BYTES, plane_bytes
from sakura.formats.packgeometry import Geometry

# byte v → 8 bytes (memory order = MSB first), each 0 or 1: one table lookup unpacks 8 values of a plane
_SPREAD = np.array([int.from_bytes(bytes((v >> (7 - j)) & 1 for j in range(8)), "little") for v in range(256)], "<u8")


def group_codes(planes: dict[int, list[bytes]], groups: Sequence[int], geo: Geometry, length: int, units: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One factor's received groups (each its planes' raw bytes, MSB first, magnitude form below the
    sign) → ``(codes (U, r, length) uint8, nbits (r,), scales (r, U) f32, zero (r, U) u8)``: each
    component's ``nbits``-bit prefix. Planes are unpacked 8 values per table lookup, batched across groups."""
    pb = plane_bytes(length)
    sizes = [geo.group_size(g) for g in groups]
    rec0 = np.concatenate([np.frombuffer(planes[g][0], np.uint8).reshape(s, units, HEAD_BYTES + pb)
                           for g, s in zip(groups, sizes)])  # (r, U, 5 + pb)
    scales = np.ascontiguousarray(rec0[..., :4]).view("<f4")[..., 0]
    sign = rec0[..., HEAD_BYTES:]
    nbits = np.repeat([len(planes[g]) for g in groups], sizes)
    acc = _SPREAD[sign]  # (r, U, pb) uint64: 8 codes per word, one byte each
    for p in range(1, int(nbits.max())):
        chosen = [i for i, g in enumerate(groups) if len(planes[g]) > p]
        stored = np.frombuffer(b"".join(planes[groups[i]][p] for i in chosen), np.uint8).reshape(-1, units, pb)
        if len(chosen) == len(groups):
            acc <<= np.uint64(1)
            acc |= _SPREAD[chunkcodec.from_magnitude(stored, sign)]
        else:
            rows = np.flatnonzero(nbits > p)
            acc[rows] = (acc[rows] << np.uint64(1)) | _SPREAD[chunkcodec.from_magnitude(stored, sign[rows])]
    codes = np.ascontiguousarray(acc.transpose(1, 0, 2)).view(np.uint8).reshape(units, len(nbits), 8 * pb)
    return codes[..., :length], nbits, scales, rec0[..., 4]


def value_tables(nbits: np.ndarray, scales: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """``(U, r, 2^max bits)`` float32: the value of every code of every (unit, component) — the arithmetic
    of :func:`bitplanes.dequantize` (centre of the cell, or 0 in the dead zone), entry by entry."""
    size = 1 << int(nbits.max())
    k = np.arange(size, dtype=np.float32)
    step = np.float32(2.0) ** (1 - nbits).astype(np.float32)
    u = (k[None, :] + np.float32(0.5)) * step[:, None] - np.float32(1.0)  # (r, T)
    half = (1 << (nbits - 1))[:, None]
    near = (np.arange(size)[None, :] == half) | (np.arange(size)[None, :] == half - 1)  # (r, T)
    dead = ((zero >> (nbits - 1)[:, None].astype(np.uint8)) & 1).astype(bool).T  # (U, r)
    table = u[None] * scales.T[..., None]  # (U, r, T)
    table[dead[..., None] & near[None]] = np.float32(0.0)
    return table


def dequantize_groups(planes: dict[int, list[bytes]], groups: Sequence[int], geo: Geometry, length: int,
                      units: int) -> np.ndarray:
    """One factor's received groups → float32 ``(U, r, length)``: :func:`bitplanes.dequantize`, bit for
    bit, with each component at its own group's plane count (codes looked up in :func:`value_tables`)."""
    if not groups:
        return np.zeros((units, 0, length), np.float32)
    codes, nbits, scales, zero = group_codes(planes, groups, geo, length, units)
    table = value_tables(nbits, scales, zero)
    rows = (np.arange(units * len(nbits), dtype=np.intp) * table.shape[-1]).reshape(units, -1, 1)
    return np.take(table.reshape(-1), codes + rows)
