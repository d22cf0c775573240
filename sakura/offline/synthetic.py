"""A synthetic template cache with the structure of real DiT K/V, for tests and benchmarks without a model.

Structure, per unit (step, layer, K|V), on a ``grid × grid`` latent with a masked box removed:
- a spatially smooth low-rank part (random low-frequency fields × a unit-specific basis with a
  decaying spectrum), drifting slowly over denoising steps;
- a per-channel offset (K/V channels carry biases) and white noise;
- a few *heavy* tokens with outlier magnitude in directions of their own — hard for a shared
  low-rank basis — which are also the tokens masked queries attend to most (high importance).
Importance is heavy-tailed (log-normal) with those tokens boosted. Tensors are FP16.
"""

from __future__ import annotations

import math

import torch

from sakura.kvcache import KVCache
from sakura.offline.lowrank import single_threaded


def synthetic_cache(num_steps: int = 4, num_layers: int = 8, heads: int = 4, head_dim: int = 64, grid: int = 32,
                    mask_box: int = 11, rank: int = 24, heavy: int = 24, heavy_scale: float = 3.0,
                    noise: float = 0.05, seed: int = 0) -> tuple[KVCache, dict[tuple[int, int], torch.Tensor]]:
    """Returns ``(cache, importance)``; the default geometry has n = 32² − 11² = 903 tokens, d = 256."""
    with single_threaded():  # many small matmuls: threads only spin on a busy CPU
        return _synthetic(num_steps, num_layers, heads, head_dim, grid, mask_box, rank, heavy, heavy_scale, noise,
                          seed)


def _synthetic(num_steps, num_layers, heads, head_dim, grid, mask_box, rank, heavy, heavy_scale, noise, seed):
    g = torch.Generator().manual_seed(seed)
    d = heads * head_dim
    yy, xx = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    lo = (grid - mask_box) // 2
    masked = (yy >= lo) & (yy < lo + mask_box) & (xx >= lo) & (xx < lo + mask_box)
    reuse_index = torch.nonzero(~masked.flatten()).flatten()
    pos = torch.stack([yy.flatten(), xx.flatten()], 1)[reuse_index].double() / grid  # (n, 2)
    n = reuse_index.numel()

    def fields(k: int) -> torch.Tensor:  # k smooth random fields over the reusable tokens, (n, k)
        freq = torch.randn(k, 2, generator=g, dtype=torch.float64) * 3.0
        phase = torch.rand(k, generator=g, dtype=torch.float64) * 2 * math.pi
        return torch.cos(2 * math.pi * pos @ freq.T + phase)

    base, drift = fields(rank), fields(rank)
    heavy_rows = torch.randperm(n, generator=g)[:heavy]
    spectrum = torch.exp(-torch.arange(rank, dtype=torch.float64) / (rank / 4))
    importance: dict[tuple[int, int], torch.Tensor] = {}
    cache = KVCache(num_steps, num_layers, heads, head_dim, reuse_index)
    for s in range(num_steps):
        t = s / max(num_steps - 1, 1)
        f = base + 0.3 * t * drift
        for layer in range(num_layers):
            for kind in ("k", "v"):
                basis = torch.randn(rank, d, generator=g, dtype=torch.float64) / math.sqrt(d)
                x = (f * spectrum) @ basis * math.sqrt(d / rank) * 2
                x += torch.randn(d, generator=g, dtype=torch.float64) * (1.0 if kind == "k" else 0.3)
                x += noise * torch.randn(n, d, generator=g, dtype=torch.float64)
                outl = torch.randn(heavy, d, generator=g, dtype=torch.float64)
                x[heavy_rows] += heavy_scale * outl / outl.norm(dim=1, keepdim=True) * x.std() * math.sqrt(d)
                getattr(cache, kind)[(s, layer)] = x.to(torch.float16)
            imp = torch.exp(1.5 * torch.randn(n, generator=g, dtype=torch.float64))
            imp[heavy_rows] *= 60.0
            importance[(s, layer)] = (imp / imp.mean()).float()
    return cache, importance
