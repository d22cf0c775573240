"""The reconstruction seam: rebuild a shard's K/V from the bytes of one pack configuration.

``Reconstructor.rebuild(info, shard, r, b_a, b_b, blobs) -> {(step, layer): (K, V)}`` with K, V
``(n, heads*head_dim)`` float32 — exactly what :func:`sakura.offline.pack.decode_shard` returns, so
backends are interchangeable. ``blobs`` maps ``(offset, length)`` → bytes as received (any blob
covering a chunk will do); chunks are CRC-checked unless ``verify=False``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch

from sakura.offline.container import ByteSource
from sakura.offline.pack import HEAD_BYTES, PackInfo
from sakura.offline.quant import plane_bytes

Blobs = Mapping[tuple[int, int], bytes]
KVShard = dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]


class Reconstructor(ABC):
    name: str = ""

    @abstractmethod
    def rebuild(self, info: PackInfo, shard: int, r: int, b_a: int, b_b: int, blobs: Blobs, *,
                verify: bool = True) -> KVShard:
        """K/V of every (step, layer) of ``shard`` at configuration ``(r, b_a, b_b)``."""

    def close(self) -> None:
        """Release device resources (optional)."""


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


@dataclass
class ShardBytes:
    units: list  # [(step, layer, kind)] in storage order (layer-major, K then V)
    n: int
    d: int
    r: int
    means: np.ndarray  # (U, d) float32
    a: FactorBytes | None
    b: FactorBytes | None

    def scales(self, f: FactorBytes) -> np.ndarray:
        """(r, U) float32 scales of a factor (read from plane 0)."""
        nu = len(self.units)
        recs = np.frombuffer(f.raw, np.uint8, count=self.r * nu * (HEAD_BYTES + f.pb)).reshape(self.r, nu, -1)
        return np.ascontiguousarray(recs[..., :4]).view("<f4")[..., 0]


def shard_bytes(info: PackInfo, shard: int, r: int, b_a: int, b_b: int, blobs: Blobs, *,
                verify: bool = True) -> ShardBytes:
    """Gather (and CRC-check) the chunks of a configuration into per-factor contiguous strings."""
    geo, src = info.geometry, ByteSource(blobs)
    data = []
    for i in info.chunks(shard, r, b_a, b_b):
        buf = src.get(*info.index.span(i))
        if verify:
            info.index.check(i, buf)
        data.append(buf)
    units = info.units(shard)
    means = np.frombuffer(data[0], dtype="<f2").reshape(len(units), geo.d).astype(np.float32)
    if r == 0:
        return ShardBytes(units, geo.n, geo.d, 0, means, None, None)
    groups = -(-r // geo.group)
    pos, factors = 1, []
    for length, bits in ((geo.n, b_a), (geo.d, b_b)):
        parts = data[pos:pos + bits * groups]
        pos += bits * groups
        factors.append(FactorBytes(b"".join(parts), bits, length))
    return ShardBytes(units, geo.n, geo.d, r, means, factors[0], factors[1])


def assemble(units, kv: torch.Tensor) -> KVShard:
    """(U, n, d) in unit order → {(step, layer): (K, V)}."""
    out: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    for i, (step, layer, kind) in enumerate(units):
        out.setdefault((step, layer), {})[kind] = kv[i]
    return {key: (x["k"], x["v"]) for key, x in out.items()}
