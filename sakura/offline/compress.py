"""What SAKURA's pack stores, computed offline: cache + importance → per shard, the quantised
low-rank factors of its cache units and its rank–precision frontier.

The math lives here (weighted low-rank in :mod:`lowrank`, the frontier in :mod:`tradeoff`); the
layout and the bytes live in :mod:`sakura.formats.pack`, whose :func:`write_pack` serialises the
:class:`~sakura.formats.pack.PackSource` built here.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from sakura.formats.bitplanes import QuantizedFactors, quantize
from sakura.formats.pack import DEFAULT_GROUP, Config, Geometry, PackInfo, PackSource, write_pack
from sakura.kvcache import KVCache, shard_units
from sakura.offline.lowrank import SMALL_UNIT, Factors, normalized_importance, single_threaded, weighted_lowrank
from sakura.offline.tradeoff import DEFAULT_BITS, QUALITY_METRIC, pareto, profile_shard, rank_grid

Importance = Mapping[tuple[int, int], torch.Tensor]  # (step, layer) -> (n,) token importance


def quantize_factors(f: Factors, importance=None) -> QuantizedFactors:
    """Quantise A and B independently. ``importance`` (n,) weighs A's dead-zone choice the way the
    quality metric weighs rows (B's channels are unweighted); it is not stored."""
    w = normalized_importance(importance, f.a.shape[0]).numpy() if importance is not None else None
    a = quantize(f.a.T.numpy(), w)
    b = quantize(f.b.numpy())
    return QuantizedFactors(*a, *b, f.mean.numpy().astype(np.float16))


def compress_cache(cache: KVCache, importance: Importance | None, *, q: float = 0.5, max_rank: int = 64,
                   shard_size: int = 1, tradeoff: Mapping[int, Sequence[Config]] | bool | None = None,
                   group: int = DEFAULT_GROUP, bits: Sequence[int] = DEFAULT_BITS,
                   progress: Callable[[int, int], None] | None = None) -> PackSource:
    """Factorise and quantise every cache unit, shard by shard, and profile each shard's frontier.

    ``importance[(step, layer)]`` is the (n,) token importance for both K and V of that layer
    (missing → uniform). ``tradeoff``: None profiles the frontier here (weighted error on a rank ×
    ``bits`` grid); a mapping ``shard → configs`` stores a frontier computed elsewhere (e.g. from
    image PSNR); False stores none. The shards are computed lazily, as the writer consumes them;
    ``progress(done, total)`` is called after each.
    """
    importance = importance or {}
    n, d = cache.num_reused, cache.dim
    geo = Geometry(cache.num_steps, cache.num_layers, cache.heads, cache.head_dim, n, shard_size, max_rank,
                   min(max_rank, n, d), group)
    if geo.rank < 1:
        raise ValueError("nothing to store: rank would be 0")
    ranks = rank_grid(geo.rank, group)
    table = None
    if tradeoff is not False:
        table = {"metric": QUALITY_METRIC if tradeoff is None else "external", "bits": list(bits), "ranks": ranks}

    def shards() -> Iterator[tuple[list[QuantizedFactors], list[Config]]]:
        plan = geo.shards()
        with single_threaded(n * d <= SMALL_UNIT):
            for i, shard in enumerate(plan):
                units = []
                for step, layer, kind in shard_units(*shard):
                    x, layer_importance = cache.unit(step, layer, kind), importance.get((step, layer))
                    factors = weighted_lowrank(x, layer_importance, q=q, max_rank=max_rank)
                    units.append((x, layer_importance, quantize_factors(factors, layer_importance)))
                if tradeoff is None:
                    front = pareto(profile_shard(units, functools.partial(geo.config_bytes, len(units)), ranks, bits))
                else:
                    front = list(tradeoff.get(i, [])) if isinstance(tradeoff, Mapping) else []
                yield [qf for _, _, qf in units], front
                if progress:
                    progress(i + 1, len(plan))

    dtype = str(next(iter(cache.k.values())).dtype).removeprefix("torch.")
    return PackSource(geo, shards(), cache.reuse_index, dtype, {"q": q, "importance": bool(importance)}, table)


def pack_cache(path: str | Path, cache: KVCache, importance: Importance | None, *, model_id: str = "",
               template_id: str = "", **options) -> PackInfo:
    """Compress ``cache`` (options as :func:`compress_cache`) and write it as a pack; returns its header."""
    return write_pack(path, compress_cache(cache, importance, **options), model_id=model_id, template_id=template_id)
