"""Per-group bit allocation of a shard's factors (the chunk order of a version-2 pack).

KVTC (ICLR 2026) allocates bits per principal component by its contribution to the error; we do the
same per group of G rank components, by the importance-weighted error of :mod:`tradeoff`. Components
are near-orthogonal in the weighted metric (``P = Â·√s`` ≈ UΣ, B's rows orthonormal), so the error of
a shard with component i held at ``(a_i, b_i)`` planes is, to first order in the quantisation noise,

    err ≈ (‖Y‖² + Σ_i D_i(a_i, b_i)) / denom,   D_i(a, b) = ‖p̂_i,a‖²‖b̂_i,b‖² − 2 p̂_i,aᵀ Y b̂_i,b

(D_i(0, ·) = 0: component not sent) — the exact formula of :func:`tradeoff.unit_errors` without the
cross terms ``(p̂_i·p̂_k)(b̂_i·b̂_k)``, i ≠ k, which are products of two small noise terms
(tests/test_allocated.py checks the estimate against the exact error). Summed per group and averaged
over the shard's units this gives a table ``D[g, a, b]``.

The allocation is greedy by marginal gain: starting from the mean alone, repeatedly take the step
that removes the most error per stored byte (the chunk's size *after* entropy coding) — add the next
plane of A or B of an open group, or open the next group with k planes of each factor (k = 1..3,
since one plane alone may not pay off yet). Every step appends chunks, so the sequence of states is
nested by construction: each frontier point is a prefix of the next, which is what a single-range
level and anytime shards need. The walk stops at ``stop_error`` (the pack's top quality) — chunks
after it are not stored.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from sakura.formats.allocated import ChunkRef
from sakura.formats.bitplanes import PLANES, QuantizedFactors
from sakura.offline.lowrank import normalized_importance

OPEN_PLANES = (1, 2, 3)  # planes of each factor a group may open with in one step
MAX_FRONTIER = 96  # stored frontier points per shard (thinned geometrically in bytes)


class UnitModel:
    """One cache unit prepared for scoring allocations: the weighted target ``Y = √s (X − μ̂)`` and
    the dequantised factors at every plane count (``P̂_a = Â_a √s``, ``B̂_b``), computed once."""

    def __init__(self, x: torch.Tensor, importance: torch.Tensor | None, qf: QuantizedFactors):
        xd = x.detach().float().numpy().astype(np.float64)
        sw = normalized_importance(importance, xd.shape[0]).sqrt().numpy()
        self.y = sw[:, None] * (xd - qf.mean.astype(np.float64))
        centred = sw[:, None] * (xd - xd.mean(axis=0))
        self.denom = max(float((centred * centred).sum()), 1e-30)
        self.energy = float((self.y * self.y).sum())
        self.rank = qf.rank
        self.a_hat = [qf.a_hat(a).astype(np.float64) * sw[None, :] for a in range(1, PLANES + 1)]  # (R, n)
        self.b_hat = [qf.b_hat(b).astype(np.float64) for b in range(1, PLANES + 1)]  # (R, d)

    def table(self, group: int) -> np.ndarray:
        """``D[g, a, b] / denom`` (a, b in 0..8, 0 = not sent) summed over each group's components."""
        qa = np.stack([(p * p).sum(axis=1) for p in self.a_hat])  # (8, R)
        qb = np.stack([(b * b).sum(axis=1) for b in self.b_hat])
        d = np.zeros((PLANES + 1, PLANES + 1, self.rank))
        for j, b in enumerate(self.b_hat):
            z = self.y @ b.T  # (n, R): Y b̂_i for every component
            for i, p in enumerate(self.a_hat):
                d[i + 1, j + 1] = qa[i] * qb[j] - 2 * np.einsum("rn,nr->r", p, z)
        ng = -(-self.rank // group)
        return np.stack([d[..., g * group:(g + 1) * group].sum(axis=-1) for g in range(ng)]) / self.denom

    def exact(self, bits_a: np.ndarray, bits_b: np.ndarray) -> float:
        """The exact normalised error with component i at ``(bits_a[i], bits_b[i])`` planes (0 = not sent)."""
        keep = np.flatnonzero((bits_a > 0) & (bits_b > 0))
        err = self.energy
        if len(keep):
            p = np.stack([self.a_hat[bits_a[i] - 1][i] for i in keep])
            b = np.stack([self.b_hat[bits_b[i] - 1][i] for i in keep])
            err += -2 * float(((p @ self.y) * b).sum()) + float(((p @ p.T) * (b @ b.T)).sum())
        return max(err, 0.0) / self.denom


def shard_table(models: Sequence[UnitModel], group: int) -> tuple[np.ndarray, float]:
    """The mean over a shard's units of their tables and ``energy / denom``: the estimated error of
    any allocation is ``base + Σ_g D[g, a_g, b_g]``."""
    return (np.mean([m.table(group) for m in models], axis=0),
            float(np.mean([m.energy / m.denom for m in models])))


def uniform_error(table: np.ndarray, base: float, groups: int, a: int, b: int) -> float:
    """Estimated error of v1's ``(groups·G, a, b)``."""
    return base + float(table[:groups, a, b].sum())


def greedy_order(table: np.ndarray, base: float, sizes: dict[ChunkRef, int], stop_error: float | None = None
                 ) -> tuple[list[ChunkRef], list[tuple[int, float]]]:
    """The chunk order and, after each greedy step, ``(chunks so far, estimated error)``; the walk
    ends at ``stop_error`` (None: when no step lowers the error any more)."""
    ng = table.shape[0]
    a, b = np.zeros(ng, np.int64), np.zeros(ng, np.int64)
    opened, err = 0, base
    order: list[ChunkRef] = []
    points: list[tuple[int, float]] = []
    while stop_error is None or err > stop_error:
        best = None  # (gain per byte, gain, chunks, new state of the group)
        for g in range(opened):
            for f, bits in ((0, a), (1, b)):
                if bits[g] < PLANES:
                    na, nb = (a[g] + 1, b[g]) if f == 0 else (a[g], b[g] + 1)
                    gain = table[g, a[g], b[g]] - table[g, na, nb]
                    ref = ChunkRef(f, g, int(bits[g]))
                    cand = (gain / sizes[ref], gain, [ref], (g, na, nb))
                    best = cand if best is None or cand[0] > best[0] else best
        if opened < ng:
            g = opened
            for k in OPEN_PLANES:
                refs = [ChunkRef(f, g, p) for p in range(k) for f in (0, 1)]
                gain = -table[g, k, k]
                cand = (gain / sum(sizes[r] for r in refs), gain, refs, (g, k, k))
                best = cand if best is None or cand[0] > best[0] else best
        if best is None or best[1] <= 0:
            break
        _, gain, refs, (g, na, nb) = best
        a[g], b[g] = na, nb
        opened += g == opened
        err -= gain
        order += refs
        points.append((len(order), err))
    return order, points


def thin(points: Sequence[tuple[int, float]], nbytes: Sequence[int], limit: int = MAX_FRONTIER
         ) -> list[tuple[int, float]]:
    """At most ``limit`` points, errors rounded as stored (4 significant digits) and strictly
    decreasing, spaced evenly in log bytes; the last (top) point is always kept."""
    if not points:
        return []
    lo, hi = np.log(nbytes[points[0][0]]), np.log(nbytes[points[-1][0]])
    spacing = (hi - lo) / max(limit - 1, 1)
    out: list[tuple[int, float]] = []
    last_log = -np.inf
    for i, (k, err) in enumerate(points):
        err = float(f"{max(err, 0.0):.4g}")
        top = i == len(points) - 1
        if out and err >= out[-1][1]:
            continue
        if top or np.log(nbytes[k]) >= last_log + spacing:
            out.append((k, err))
            last_log = np.log(nbytes[k])
    if out[-1][0] != points[-1][0] and float(f"{points[-1][1]:.4g}") < out[-1][1]:
        out.append((points[-1][0], float(f"{points[-1][1]:.4g}")))
    return out


def exact_error(models: Sequence[UnitModel], refs: Sequence[ChunkRef], group: int) -> float:
    """The exact tradeoff metric (:func:`tradeoff.unit_errors`, cross terms included) of the shard
    decoded from the chunks ``refs``: used where the estimate is not good enough (the stop point)."""
    bits = np.zeros((2, models[0].rank), np.int64)
    for ref in refs:
        bits[ref.factor, ref.group * group:(ref.group + 1) * group] += 1
    return float(np.mean([m.exact(bits[0], bits[1]) for m in models]))


def exact_stop(
    models: Sequence[UnitModel],
    order: Sequence[ChunkRef],
    points: Sequence[tuple[int, float]],
    target: float,
    group: int,
    guess: int,
) -> int:
    """The first greedy point (index into ``points``) whose exact error is at most ``target``,
    searched from the estimate's ``guess`` (gallop, then bisect); the last point if none is."""
    def ok(i: int) -> bool:
        return exact_error(models, order[:points[i][0]], group) <= target

    hi, step = min(guess, len(points) - 1), 1
    while not ok(hi):
        if hi == len(points) - 1:
            return hi
        hi, step = min(hi + step, len(points) - 1), step * 2
    lo, step = hi, 1
    while lo > 0:
        lo = max(hi - step, 0)
        if not ok(lo):
            break
        hi, step = lo, step * 2
    else:
        return 0
    while hi - lo > 1:  # not ok(lo), ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi
