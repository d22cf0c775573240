"""The geometry of a SAKURA pack and one stored level of a shard (shared by pack versions 1 and 2)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from sakura.formats.bitplanes import HEAD_BYTES, PLANES, plane_bytes
from sakura.kvcache import shard_plan


@dataclass(frozen=True)
class Geometry:
    num_steps: int
    num_layers: int
    heads: int
    head_dim: int
    n: int  # reusable tokens
    shard_size: int  # layers per shard
    max_rank: int  # requested
    rank: int  # stored: min(max_rank, n, d)
    group: int  # components per chunk
    planes: int = PLANES
    shared_basis: int = 0  # 1: a shard may share one token basis A among its units (pack v2; header shared_shards)

    @property
    def d(self) -> int:
        return self.heads * self.head_dim

    def max_stored_rank(self) -> int:
        """``rank`` = min(max_rank, n, columns of what is factorised: d, or every unit's d side by side)."""
        return min(self.max_rank, self.n, self.d * (2 * self.shard_size if self.shared_basis else 1))

    @property
    def num_groups(self) -> int:
        return -(-self.rank // self.group)

    def shards(self) -> list[tuple[int, int, int]]:
        return shard_plan(self.num_steps, self.num_layers, self.shard_size)

    def group_size(self, g: int) -> int:
        return min(self.group, self.rank - g * self.group)

    def chunk_lengths(self, units: int) -> list[int]:
        """Lengths of one shard's chunks, in file order (mean, A planes × groups, B planes × groups)."""
        out = [units * self.d * 2]
        for length in (self.n, self.d):
            for p in range(self.planes):
                rec = plane_bytes(length) + (HEAD_BYTES if p == 0 else 0)
                out += [self.group_size(g) * units * rec for g in range(self.num_groups)]
        return out

    def config_bytes(self, units: int, r: int, b_a: int, b_b: int) -> int:
        """Bytes on the wire for a configuration of a shard of ``units`` cache units (formula, any r)."""
        if r == 0:
            return units * self.d * 2
        a = r * units * (b_a * plane_bytes(self.n) + HEAD_BYTES)
        b = r * units * (b_b * plane_bytes(self.d) + HEAD_BYTES)
        return units * self.d * 2 + a + b


@dataclass(frozen=True)
class Config:
    """One stored configuration of a shard: ``bytes`` on the wire, ``error`` its offline quality
    proxy (see :mod:`sakura.offline.tradeoff`): one row of a frontier in the header."""

    r: int
    b_a: int
    b_b: int
    bytes: int
    error: float

    @property
    def key(self) -> tuple[int, int, int]:
        return self.r, self.b_a, self.b_b

    def to_list(self) -> list:
        return [self.r, self.b_a, self.b_b, self.bytes, self.error]

    @property
    def rung(self) -> str:
        """The ladder rung this level is above the allocated ones ("" for a low-rank level)."""
        return ""

    def rebuild_work(self, units: int, n: int, d: int) -> float:
        """Rebuild work of the level in multiply-accumulates (the ``A·B`` product of ``units`` units)."""
        return float(units * n * self.r * d)

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> "Config":
        """A header row; ValueError unless rank and bits are small non-negative integers, bytes a file-sized
        one and the error a finite number ≥ 0."""
        r, ba, bb, nbytes, err = row
        config = cls(_count(r, 1 << 20), _count(ba, 64), _count(bb, 64), _count(nbytes, 1 << 48), float(err))
        if not (math.isfinite(config.error) and config.error >= 0):
            raise ValueError(f"frontier error must be a finite number >= 0, got {config.error}")
        return config


def _count(x: Any, limit: int) -> int:
    """``x`` as an integer in [0, limit] (an integral float is accepted; bool, NaN, inf and fractions are not)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"expected an integer, got {type(x).__name__}")
    if isinstance(x, float) and not (math.isfinite(x) and x.is_integer()):
        raise ValueError(f"expected an integer, got {x!r}")
    if not 0 <= x <= limit:
        raise ValueError(f"{x} is outside [0, {limit}]")
    return int(x)
