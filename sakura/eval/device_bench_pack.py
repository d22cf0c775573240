"""The pack ``sakura bench-device`` measures: a given one, or one built now from the template's captured
cache (or seeded random K/V of its geometry: rebuild times do not depend on the values)."""

from __future__ import annotations

import time
from pathlib import Path

from sakura.formats.pack import PackReader
from sakura.kvcache import KVCache


def open_pack(pack: str | Path | None, tpl, model, req, tmp: Path, *, max_rank: int, shard_size: int,
               importance: bool, random_cache: bool, layout: str = "uniform", basis: str = "shard",
               rebuild_rank: int | None = None):
    """A reader of the given pack, or of a real pack built into ``tmp`` now (v1, or v2 with the builder's
    ``pack_options``, decoded rank capped at ``rebuild_rank``); and its report entry."""
    import torch

    if pack:
        return PackReader(pack), {"path": str(pack), "built": False}
    from sakura.offline.builder import (  # torch: sakura --help stays light
        capture_request,
        pack_options,
        profile_importance,
    )
    from sakura.offline.compress import pack_cache  # torch: sakura --help stays light

    t0 = time.perf_counter()
    if random_cache:  # times do not depend on the values: skip the capture run
        cache, imp = random_cache_of(model, req), None
    else:
        cache = model.capture(capture_request(tpl, model)).to(torch.float16)
        imp = profile_importance(model, tpl, cache) if importance else None
    path = tmp / f"{tpl.id}.pack"
    options = pack_options(max_rank, layout, basis, rebuild_rank=rebuild_rank)
    # v1: no frontier (every config is its own level); v2: its frontier is what level_for reads
    pack_cache(path, cache, imp, shard_size=shard_size, model_id=model.model_id, template_id=tpl.id,
               **options, **({"tradeoff": False} if layout == "uniform" else {}))
    return PackReader(path), {"built": True, "build_s": round(time.perf_counter() - t0, 2),
                              "importance": bool(imp), "random_cache": random_cache, "layout": layout,
                              **({"basis": basis} if layout == "allocated" else {}), "options": options}


def random_cache_of(model, req):
    """Seeded FP16 K/V of the template's geometry (for timing only)."""
    import torch

    reuse = torch.nonzero(~model.token_mask(req.mask)).flatten()
    cache = KVCache(model.num_steps, model.num_layers, model.heads, model.head_dim, reuse)
    g = torch.Generator().manual_seed(0)
    for s in range(model.num_steps):
        for layer in range(model.num_layers):
            cache.k[(s, layer)] = torch.randn(len(reuse), cache.dim, generator=g).half()
            cache.v[(s, layer)] = torch.randn(len(reuse), cache.dim, generator=g).half()
    return cache
