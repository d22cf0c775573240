"""What SAKURA's pack stores, computed offline: cache + importance → per shard, the quantised
low-rank factors of its cache units and its rank–precision frontier.

The math lives here (weighted low-rank in :mod:`lowrank`, the frontier in :mod:`tradeoff`); the
layout and the bytes live in :mod:`sakura.formats.pack`, whose :func:`write_pack` serialises the
:class:`~sakura.formats.pack.PackSource` built here.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from sakura.formats.allocated import MEAN_U8, AllocatedShard, ChunkRef, decode_means, encode_chunks, encode_means
from sakura.formats.bitplanes import PLANES, QuantizedFactors, quantize
from sakura.formats.pack import DEFAULT_GROUP, Config, Geometry, PackInfo, PackSource, write_pack
from sakura.kvcache import KVCache, shard_units
from sakura.offline.allocate import UnitModel, exact_error, exact_stop, greedy_order, shard_table, thin, uniform_error
from sakura.offline.lowrank import (
    SMALL_UNIT,
    Factors,
    mean_importance,
    normalized_importance,
    shared_lowrank,
    single_threaded,
    weighted_lowrank,
)
from sakura.offline.tradeoff import DEFAULT_BITS, QUALITY_METRIC, pareto, profile_shard, rank_grid, step_errors

TOLERANCE = 0.01  # an allocated pack stops within 1 % (0.04 dB) of the reference configuration's error
# A shared-basis shard stops at this share of v1's top error instead (by default; an ``auto`` build tries
# deeper shares, or one basis per unit, while its top's masked PSNR is below v1's: builder.TOP_CANDIDATES).
# At equal weighted error its masked PSNR fell 0.3–5.8 dB short of v1's top (24 edits on fs and mb-sd
# templates) with per-unit errors like v1's — likely because the units' residuals share one token
# subspace, so the same tokens are off in K and V of both layers, which a per-unit metric does not see
# (not verified). At half the error it is −1.6…+3.5 dB (mean +1.2) for 20–26 % more stored bytes:
# docs/results/issue18/shared_basis/top_psnr_targets.txt
SHARED_TOP_SHARE = 0.5
ALLOCATION_METRIC = (
    "estimate of the tradeoff metric (cross terms between components dropped): see sakura.offline.allocate"
)
Importance = Mapping[tuple[int, int], torch.Tensor]  # (step, layer) -> (n,) token importance


def quantize_factors(f: Factors, importance=None, a: tuple | None = None) -> QuantizedFactors:
    """Quantise A and B independently. ``importance`` (n,) weighs A's dead-zone choice the way the
    quality metric weighs rows (B's channels are unweighted); it is not stored. ``a``: A already
    quantised (a shared token basis: one A for several units)."""
    w = normalized_importance(importance, f.a.shape[0]).numpy() if importance is not None else None
    a = a or quantize(f.a.T.numpy(), w)
    b = quantize(f.b.numpy())
    return QuantizedFactors(*a, *b, f.mean.numpy().astype(np.float16))


def quantize_shared(factors: Sequence[Factors], importances: Sequence) -> list[QuantizedFactors]:
    """Units that share one ``A`` (:func:`shared_lowrank`): A quantised once (dead zones weighed by the
    units' mean importance), each unit's B with its own per-component scales."""
    a = quantize(factors[0].a.T.numpy(), mean_importance(importances, factors[0].a.shape[0]).numpy())
    return [quantize_factors(f, a=a) for f in factors]


def compress_cache(cache: KVCache, importance: Importance | None, *, q: float = 0.5, max_rank: int = 64,
                   shard_size: int = 1, tradeoff: Mapping[int, Sequence[Config]] | bool | None = None,
                   group: int = DEFAULT_GROUP, bits: Sequence[int] = DEFAULT_BITS,
                   progress: Callable[[int, int], None] | None = None, layout: str = "uniform",
                   reference_rank: int | None = None, tolerance: float = TOLERANCE,
                   shared_basis: bool = False, top_share: float = SHARED_TOP_SHARE) -> PackSource:
    """Factorise and quantise every cache unit, shard by shard, and profile each shard's frontier.

    ``importance[(step, layer)]`` is the (n,) token importance for both K and V of that layer
    (missing → uniform). ``tradeoff``: None profiles the frontier here (weighted error on a rank ×
    ``bits`` grid); a mapping ``shard → configs`` stores a frontier computed elsewhere (e.g. from
    image PSNR); False stores none. The shards are computed lazily, as the writer consumes them;
    ``progress(done, total)`` is called after each.

    ``layout="allocated"`` writes a version-2 pack (:mod:`sakura.formats.allocated`): chunks in greedy
    per-group bit-allocation order (:mod:`sakura.offline.allocate`), entropy-coded where it pays, stored
    up to the estimated error of v1's top configuration ``(reference_rank, 8, 8)`` (default: the stored
    rank) times ``1 + tolerance``; its frontier is the allocation's path (``bits`` unused).
    ``shared_basis`` (allocated only): each shard's units share one token basis A
    (:func:`~sakura.offline.lowrank.shared_lowrank`) and stops at ``top_share`` of the error of v1's
    separate per-unit factors (a shard that cannot get there keeps one basis per unit).
    """
    if layout not in ("uniform", "allocated"):
        raise ValueError(f"layout must be 'uniform' or 'allocated', got {layout!r}")
    if layout == "allocated" and isinstance(tradeoff, Mapping):
        raise ValueError("an allocated pack's frontier is its allocation path: external frontiers are v1 only")
    if shared_basis and layout != "allocated":
        raise ValueError("a shared token basis is a version-2 (allocated) layout")
    importance = importance or {}
    n, d = cache.num_reused, cache.dim
    geo = Geometry(cache.num_steps, cache.num_layers, cache.heads, cache.head_dim, n, shard_size, max_rank, 0,
                   group, shared_basis=int(shared_basis))
    geo = dataclasses.replace(geo, rank=geo.max_stored_rank())
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
                cells = [(cache.unit(step, layer, kind), importance.get((step, layer)))
                         for step, layer, kind in shard_units(*shard)]
                if layout == "allocated" and shared_basis:
                    yield shared_or_separate(cells, geo, q, max_rank, reference_rank, tolerance, tradeoff is not False,
                                             top_share)
                else:
                    units = separate_units(cells, q, max_rank)
                    factors = [qf for _, _, qf in units]
                    if layout == "allocated":
                        yield allocated_shard(units, geo, reference_rank, tolerance, tradeoff is not False)
                    elif tradeoff is None:
                        cost = functools.partial(geo.config_bytes, len(units))
                        yield factors, pareto(profile_shard(units, cost, ranks, bits))
                    else:
                        yield factors, list(tradeoff.get(i, [])) if isinstance(tradeoff, Mapping) else []
                if progress:
                    progress(i + 1, len(plan))

    dtype = str(next(iter(cache.k.values())).dtype).removeprefix("torch.")
    build = {"q": q, "importance": bool(importance), "step_error": step_errors(cache, importance, geo.shards())}
    if layout == "allocated":
        table = None if tradeoff is False else {"metric": ALLOCATION_METRIC}
        build.update(reference_rank=min(reference_rank or geo.rank, geo.rank), tolerance=tolerance)
        if shared_basis:
            build["top_share"] = top_share
    return PackSource(geo, shards(), cache.reuse_index, dtype, build, table, version=2 if layout == "allocated" else 1)


def separate_units(cells, q: float, max_rank: int) -> list[tuple]:
    """``(x, importance, quantised factors)`` per ``(x, importance)`` cell, one token basis each."""
    return [(x, imp, quantize_factors(weighted_lowrank(x, imp, q=q, max_rank=max_rank), imp)) for x, imp in cells]


def reference_target(cells, geo: Geometry, reference_rank: int | None, q: float) -> float:
    """The exact error of v1's top ``(reference_rank, 8, 8)`` for a shard's ``(x, importance)`` cells:
    separate per-unit factors, as v1 stores them."""
    rank = min(reference_rank or geo.rank, geo.n, geo.d)
    models = [UnitModel(*unit) for unit in separate_units(cells, q, rank)]
    groups = -(-rank // geo.group)
    refs = [ChunkRef(f, g, p) for g in range(groups) for f in (0, 1) for p in range(PLANES)]
    return exact_error(models, refs, geo.group)


def shared_or_separate(cells, geo: Geometry, q: float, max_rank: int, reference_rank: int | None, tolerance: float,
                       with_frontier: bool, top_share: float = SHARED_TOP_SHARE) -> AllocatedShard:
    """A shard whose units share one token basis, stopping at ``top_share`` of v1's top error;
    unless that basis cannot get there (units with little token structure in common): then one basis
    per unit, stopping at v1's top error as without sharing."""
    imps = [imp for _, imp in cells]
    target = reference_target(cells, geo, reference_rank, q) * (1 + tolerance)
    factors = shared_lowrank([x for x, _ in cells], imps, q=q, max_rank=max_rank)
    units = [(*cell, qf) for cell, qf in zip(cells, quantize_shared(factors, imps))]
    shared_target = target * top_share
    shard = allocated_shard(units, geo, reference_rank, tolerance, with_frontier, shared=True, target=shared_target)
    if shard.extra["top_error"] <= shared_target:
        return shard
    return allocated_shard(separate_units(cells, q, max_rank), geo, reference_rank, tolerance, with_frontier,
                           target=target)


def allocated_shard(units, geo: Geometry, reference_rank: int | None, tolerance: float, with_frontier: bool,
                    shared: bool = False, target: float | None = None) -> AllocatedShard:
    """One shard of a v2 pack: its chunks in greedy allocation order, up to the reference quality
    (``target``: that quality's error, given; None: v1's ``(reference_rank, 8, 8)``, a prefix of these
    per-unit factors). ``extra["top_error"]`` is the exact error of the top level."""
    # The allocation scores each unit against the mean it will be rebuilt with: the stored 8-bit one.
    mean = encode_means(np.stack([qf.mean for _, _, qf in units]))
    decoded = decode_means(mean, MEAN_U8, len(units), geo.d)
    factors = [dataclasses.replace(qf, mean=m) for (_, _, qf), m in zip(units, decoded)]
    stored = encode_chunks(factors, geo, shared)
    models = [UnitModel(x, imp, qf) for (x, imp, _), qf in zip(units, factors)]
    table, base = shard_table(models, geo.group)
    order, points = greedy_order(table, base, {ref: len(b) for ref, (b, _) in stored.items()})
    # The estimate picks where to look; the exact error of the reference decides where to stop.
    if target is None:
        groups = -(-min(reference_rank or geo.rank, geo.rank) // geo.group)
        reference = [ChunkRef(f, g, p) for g in range(groups) for f in (0, 1) for p in range(PLANES)]
        target = exact_error(models, reference, geo.group) * (1 + tolerance)
        estimate = uniform_error(table, base, groups, PLANES, PLANES)
    else:
        estimate = target
    guess = next((i for i, (_, e) in enumerate(points) if e <= estimate), len(points) - 1)
    top = exact_stop(models, order, points, target, geo.group, guess)
    k_top = points[top][0]
    top_error = exact_error(models, order[:k_top], geo.group)
    order, points = order[:k_top], [p for p in points[:top] if p[1] > top_error] + [(k_top, top_error)]
    nbytes = np.cumsum([len(mean)] + [len(stored[ref][0]) for ref in order])
    front = thin(points, nbytes) if with_frontier else []
    return AllocatedShard(factors, mean, shared, [(ref, *stored[ref]) for ref in order], front,
                          extra={"top_error": top_error})


def pack_cache(path: str | Path, cache: KVCache, importance: Importance | None, *, model_id: str = "",
               template_id: str = "", **options) -> PackInfo:
    """Compress ``cache`` (options as :func:`compress_cache`) and write it as a pack; returns its header."""
    return write_pack(path, compress_cache(cache, importance, **options), model_id=model_id, template_id=template_id)
