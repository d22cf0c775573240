"""Importance-weighted low-rank factorisation of one cache unit (paper §4.2.1–4.2.2).

For a unit ``X`` (n tokens × d channels) and token importance ``s`` (n,):

    μ = mean_j X_j                      (row mean, a d-vector)
    ω_j = max(s_j / mean(s), floor)^q   (q = 0 ⇒ ω ≡ 1 ⇒ plain SVD)
    U Σ Vᵀ = svd(diag(√ω) (X − μ))
    A = diag(1/√ω) U Σ,  B = Vᵀ         so  X̂ = A[:, :r] B[:r] + μ

Minimising ‖diag(√ω)(X − μ − A_r B_r)‖_F makes the leading components spend their rank on the rows
that masked queries attend to. Components come out ordered by weighted singular value, so every
rank prefix is the best weighted rank-r approximation. The weights shape A and B but are never
stored: the device rebuilds every unit with the same dense ``A @ B + μ``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from threadpoolctl import threadpool_limits

# Zero-importance tokens get this fraction of the mean importance: keeps 1/√ω finite (those rows are
# still reconstructed, just with little say in which directions the rank is spent on).
IMPORTANCE_FLOOR = 1e-3
# Above this many rows *and* columns even the Gram eigendecomposition costs seconds per unit; the
# randomized range finder (with power iterations) gets the leading components to float32 noise.
EXACT_SVD_MAX = 1536
SMALL_UNIT = 1 << 22  # n·d up to this runs single-threaded (see single_threaded)


@contextmanager
def single_threaded(enabled: bool = True) -> Iterator[None]:
    """Run small dense linear algebra on one thread (torch and BLAS), restoring the settings after.

    For small units (n·d up to SMALL_UNIT) intra-op threads buy little, and on a shared,
    oversubscribed CPU their barriers spin: eigh of a 256² Gram took 0.25 s on 2 threads vs 13 ms
    on 1. ``enabled=False`` leaves threading alone (big units do gain from threads).
    """
    if not enabled:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Factors:
    """Low-rank factors of one unit: ``X̂ = A[:, :r] @ B[:r] + mean``. All float32."""

    a: torch.Tensor  # (n, R) coefficients, 1/√ω folded in
    b: torch.Tensor  # (R, d) shared basis, unit-norm rows
    mean: torch.Tensor  # (d,)
    sv: torch.Tensor  # (R,) weighted singular values, descending

    @property
    def rank(self) -> int:
        return int(self.b.shape[0])

    def reconstruct(self, r: int | None = None) -> torch.Tensor:
        r = self.rank if r is None else r
        return self.a[:, :r] @ self.b[:r] + self.mean


def normalized_importance(importance: torch.Tensor | None, n: int) -> torch.Tensor:
    """Importance scaled to mean 1 and floored (uniform when missing or all zero), float64."""
    if importance is None:
        return torch.ones(n, dtype=torch.float64)
    s = importance.detach().to(torch.float64).flatten().clamp_min(0)
    if s.numel() != n:
        raise ValueError(f"importance has {s.numel()} entries, unit has {n} rows")
    m = s.mean()
    if not torch.isfinite(m) or m <= 0:
        return torch.ones(n, dtype=torch.float64)
    return (s / m).clamp_min(IMPORTANCE_FLOOR)


def row_weights(importance: torch.Tensor | None, n: int, q: float) -> torch.Tensor:
    """ω_j = (s_j / mean s)^q with the zero-importance floor; float64, shape (n,)."""
    return normalized_importance(importance, n) ** q


def weighted_lowrank(x: torch.Tensor, importance: torch.Tensor | None = None, *, q: float = 0.5,
                     max_rank: int = 64, method: str = "auto") -> Factors:
    """Factorise one unit ``x`` (n, d) in float64 (fp16 caches with outlier rows need the headroom).

    ``method``: ``"gram"`` — eigenvectors of the d × d Gram matrix YᵀY (exact leading components,
    several times cheaper than a full SVD when n > d; falls back to svd when n < d); ``"svd"`` —
    full SVD; ``"randomized"`` — randomized range finder for very large units; ``"auto"`` = gram,
    or randomized above EXACT_SVD_MAX.
    """
    if x.ndim != 2:
        raise ValueError(f"expected an (n, d) unit, got shape {tuple(x.shape)}")
    n, d = x.shape
    xd = x.detach().float().to(torch.float64)  # via float32: torch's direct fp16→fp64 cast is slow on CPU
    mean = xd.mean(dim=0)
    sw = row_weights(importance, n, q).sqrt()
    y = sw[:, None] * (xd - mean)
    r = min(max_rank, n, d)
    if method == "auto":
        method = "gram" if min(n, d) <= EXACT_SVD_MAX else "randomized"
    if method == "gram" and d > n:
        method = "svd"  # wide unit (big mask): the full SVD is cheap, and UᵀY/σ would lose orthogonality
    with single_threaded(n * d <= SMALL_UNIT):
        if method == "svd":
            _, s, vh = torch.linalg.svd(y, full_matrices=False)
            basis = vh[:r]
        elif method == "randomized":
            _, s, v = torch.svd_lowrank(y, q=min(r + 32, n, d), niter=6)
            basis = v[:, :r].T
        elif method == "gram":  # right singular vectors = eigenvectors of YᵀY (d × d), descending
            evals, evecs = torch.linalg.eigh(y.T @ y)
            basis = evecs.flip(1)[:, :r].T
            s = evals.flip(0).clamp_min(0).sqrt()
        else:
            raise ValueError(f"unknown method {method!r}")
    # A is the least-squares coefficient of each weighted row on the orthonormal basis, with 1/√ω
    # folded back in: no division by tiny singular values, so the tail components stay finite.
    a = (y @ basis.T) / sw[:, None]
    return Factors(a.float(), basis.float().contiguous(), mean.float(), s[:r].float())


def mean_importance(importances: list[torch.Tensor | None], n: int) -> torch.Tensor:
    """The units' normalised importances averaged: the row weights of their shared token basis."""
    return torch.stack([normalized_importance(imp, n) for imp in importances]).mean(dim=0)


def shared_lowrank(xs: list[torch.Tensor], importances: list[torch.Tensor | None], *, q: float = 0.5,
                   max_rank: int = 64, method: str = "auto") -> list[Factors]:
    """One token basis for several units of the same tokens (a shard's K and V of each layer):
    :func:`weighted_lowrank` of ``[X_1 | … | X_U]`` with the units' mean importance, split back into
    per-unit factors that share ``a`` (and ``sv``). The units' K/V are strongly correlated along the
    tokens, so one ``A`` of rank r' < U·r serves all: A (n values per component) is most of the bytes."""
    s = mean_importance(importances, xs[0].shape[0])
    # The units enter at their own energy (K carries 4–7× V's here), so the basis leans to K. Scaling
    # each to unit energy (what the per-unit relative metric averages) saved 1–5 % of bytes at equal
    # metric but cost 1.0–4.7 dB of top masked PSNR on 4 templates (K's precision matters more).
    joint = weighted_lowrank(torch.cat([x.detach().float() for x in xs], dim=1), s, q=q, max_rank=max_rank,
                             method=method)
    cols = torch.cumsum(torch.tensor([0] + [x.shape[1] for x in xs]), 0).tolist()
    return [Factors(joint.a, joint.b[:, c0:c1].contiguous(), joint.mean[c0:c1].contiguous(), joint.sv)
            for c0, c1 in zip(cols, cols[1:])]
