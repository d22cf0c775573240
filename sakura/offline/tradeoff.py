"""The rank–precision trade-off profile (paper Fig. 8): which (r, b_A, b_B) is best for its bytes.

For each shard we score every candidate configuration on a grid (ranks × b_A × b_B) by the
importance-weighted, normalised reconstruction error of the *decoded* shard

    err_unit = Σ_j s_j ‖x̂_j − x_j‖² / Σ_j s_j ‖x_j − x̄‖²       (s = importance, mean 1, floored)
    err      = mean over the shard's units,

and keep the Pareto frontier: sorted by bytes, each entry strictly better than every cheaper one.
The runtime's allocator then picks the largest frontier entry that fits its byte budget.

Quality uses plain importance (not ω = s^q), so frontiers of packs built with different q are
comparable. Scoring is exact and cheap: with Y = √s (X − μ̂), P = Â_R √s and the dequantised B̂,

    ‖√s (Â_r B̂_r + μ̂ − X)‖² = ‖Y‖² − 2 Σ_{i<r} (PᵀY ∘ B̂)_i· + Σ_{i,k<r} (PᵀP ∘ B̂B̂ᵀ)_ik

so one pass per b_A (Gram PᵀP and PᵀY) and per b_B (B̂B̂ᵀ) scores every rank at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from sakura.formats.bitplanes import QuantizedFactors
from sakura.formats.pack import Config
from sakura.offline.lowrank import normalized_importance

DEFAULT_BITS = (2, 3, 4, 5, 6, 8)
QUALITY_METRIC = "mean over units of sum_j s_j*|xhat_j-x_j|^2 / sum_j s_j*|x_j-mean(x)|^2, s = importance (mean 1)"


def unit_errors(x: torch.Tensor, importance: torch.Tensor | None, qf: QuantizedFactors,
                ranks: Sequence[int], bits: Sequence[int]) -> np.ndarray:
    """Normalised weighted error of one cache unit for every (b_A, b_B, r): shape (len(bits), len(bits), len(ranks))."""
    xd = x.detach().float().numpy().astype(np.float64)
    n = xd.shape[0]
    sw = normalized_importance(importance, n).sqrt().numpy()
    y = sw[:, None] * (xd - qf.mean.astype(np.float64))
    energy = float((y * y).sum())
    centred = sw[:, None] * (xd - xd.mean(axis=0))
    denom = max(float((centred * centred).sum()), 1e-30)
    idx = np.asarray(ranks, dtype=np.int64) - 1  # rank r reads prefix sums at r-1; r=0 reads nothing

    b_hat = {bb: qf.b_hat(bb).astype(np.float64) for bb in bits}
    b_gram = {bb: b @ b.T for bb, b in b_hat.items()}
    out = np.empty((len(bits), len(bits), len(ranks)))
    for i, ba in enumerate(bits):
        p = qf.a_hat(ba).astype(np.float64) * sw[None, :]  # (R, n)
        gram, proj = p @ p.T, p @ y
        for k, bb in enumerate(bits):
            cross = np.concatenate([[0.0], np.cumsum((proj * b_hat[bb]).sum(axis=1))])
            quad = np.concatenate([[0.0], np.diagonal((gram * b_gram[bb]).cumsum(0).cumsum(1))])
            out[i, k] = energy - 2 * cross[idx + 1] + quad[idx + 1]
    return np.clip(out, 0.0, None) / denom


def rank_grid(rank: int, group: int) -> list[int]:
    """Candidate ranks: every multiple of the component group up to the stored rank (and the rank)."""
    return sorted({*range(group, rank + 1, group), rank} - {0})


def profile_shard(units: Sequence[tuple[torch.Tensor, torch.Tensor | None, QuantizedFactors]],
                  nbytes: Callable[[int, int, int], int], ranks: Sequence[int],
                  bits: Sequence[int] = DEFAULT_BITS) -> list[Config]:
    """Score every grid configuration of one shard. ``units`` = (original X, importance, factors) per cache unit."""
    err = np.mean([unit_errors(x, s, qf, ranks, bits) for x, s, qf in units], axis=0)
    # errors rounded as stored (4 significant digits) so the frontier stays strictly monotone in the header
    return [Config(r, ba, bb, nbytes(r, ba, bb), float(f"{err[i, k, j]:.4g}"))
            for i, ba in enumerate(bits) for k, bb in enumerate(bits) for j, r in enumerate(ranks)]


def pareto(configs: Sequence[Config]) -> list[Config]:
    """Configurations no cheaper-or-equal one beats: bytes strictly up, error strictly down."""
    out: list[Config] = []
    for c in sorted(configs, key=lambda c: (c.bytes, c.error)):
        if not out or c.error < out[-1].error:  # the first of equal-byte configs is their best one
            out.append(c)
    return out


def frontier(source: Any, shard: int) -> list[Config]:
    """The stored frontier of ``shard`` from a :class:`~sakura.formats.pack.PackReader` or ``PackInfo``,
    or one computed from a :class:`ShardInputs` (factors + originals, before a pack exists)."""
    if isinstance(source, ShardInputs):
        return pareto(profile_shard(source.units[shard], source.nbytes[shard], source.ranks, source.bits))
    info = getattr(source, "info", source)
    return info.frontier(shard)


@dataclass
class ShardInputs:
    """What is needed to profile shards before writing: per shard its cache units and its byte counter."""

    units: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor | None, QuantizedFactors]]]
    nbytes: Sequence[Callable[[int, int, int], int]]
    ranks: Sequence[int]
    bits: Sequence[int] = DEFAULT_BITS


def best_config(front: Sequence[Config], byte_budget: float) -> Config | None:
    """The best-quality frontier entry within ``byte_budget`` bytes; None if even the smallest is over."""
    best = None
    for c in front:
        if c.bytes <= byte_budget and (best is None or c.error < best.error):
            best = c
    return best


def step_errors(cache, importance, plan: Sequence[tuple[int, int, int]]) -> list[float | None]:
    """Per shard ``(step, first layer, end layer)`` of ``plan``: the metric above for its units' K/V of
    one step earlier standing in for their own (what the reuse fallback costs, before compression);
    None at step 0. Stored with the pack so the device can weigh a reuse against a wait."""
    out: list[float | None] = []
    for step, l0, l1 in plan:
        if step == 0:
            out.append(None)
            continue
        errs = []
        for layer in range(l0, l1):
            w = normalized_importance(importance.get((step, layer)), cache.num_reused).double()[:, None]
            for kind in ("k", "v"):
                x, prev = cache.unit(step, layer, kind).double(), cache.unit(step - 1, layer, kind).double()
                errs.append(float((w * (x - prev) ** 2).sum() / max(float((w * (x - x.mean(0)) ** 2).sum()), 1e-30)))
        out.append(round(float(np.mean(errs)), 5))
    return out
