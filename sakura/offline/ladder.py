"""The ladder above a pack's allocated levels (pack version 3, :mod:`sakura.formats.ladder`), computed offline.

Per shard: rebuild its top allocated level exactly as the device does, take the FP16 values minus it (the
residual), quantise it to 8-bit planes and score the top level plus each plane count in the trade-off
profile's own metric (:mod:`sakura.offline.tradeoff`: importance-weighted, normalised error, mean over
the shard's units) — so the rungs are rows of the same profile the allocator reads. The exact rung is
the FP16 file's own chunk of the shard (error 0), referenced, not copied.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sakura.formats import allocated, chunkcodec, ladder
from sakura.formats.fp16 import Fp16Info
from sakura.formats.pack import PackReader
from sakura.offline.lowrank import normalized_importance


def rung_errors(x: np.ndarray, top: np.ndarray, planes: list[bytes], weights: list[np.ndarray]) -> list[float]:
    """The profile's error of ``top + residual[:p]`` for p = 1..len(planes): ``x``, ``top`` (U, n, d); ``weights``
    the normalised importance (n,) of each unit."""
    units, n, d = x.shape
    xd = x.astype(np.float64)
    denoms = [max(float((w[:, None] * (xu - xu.mean(axis=0)) ** 2).sum()), 1e-30) for w, xu in zip(weights, xd)]
    out = []
    for p in range(1, len(planes) + 1):
        rebuilt = top.astype(np.float64) + ladder.decode_residual(planes[:p], units, n, d)
        errs = [float((w[:, None] * (r - xu) ** 2).sum()) / den
                for w, r, xu, den in zip(weights, rebuilt, xd, denoms)]
        out.append(float(np.mean(errs)))
    return out


def add_ladder(pack_path: str | Path, fp16_path: str | Path, fp16_file_id: str,
               importance: dict[tuple[int, int], torch.Tensor], planes: int = ladder.PLANES):
    """Rewrite the v2 pack at ``pack_path`` as a v3 pack: its chunks unchanged, each shard's residual planes
    after them, and the exact rung referring to ``fp16_path``'s chunks (known to readers as ``fp16_file_id``).
    A v3 pack gets its ladder replaced (its allocated chunks kept)."""
    reader = PackReader(pack_path)
    info = reader.info
    if info.version not in (allocated.VERSION, ladder.VERSION):
        raise ValueError(f"{pack_path}: the ladder goes on a version-2 pack (or replaces a version-3 pack's), "
                         f"this one is version {info.version}")
    fp16_file, fp16 = Fp16Info.open(fp16_path)
    shards = []
    for s in range(info.num_shards):
        top = max((c for c in info.frontier(s) if not c.rung), key=lambda c: c.bytes).key
        units, rebuilt = allocated.decode_shard(info, s, *top, reader.read(s, *top))
        (off, length), = fp16.ranges(s)
        x = np.frombuffer(fp16_file.read(off, length), "<f2").reshape(len(units), fp16.n, fp16.d).astype(np.float32)
        top_np = rebuilt.numpy()
        raw = ladder.encode_residual(x - top_np, planes)
        weights = [normalized_importance(importance.get((step, layer)), fp16.n).numpy() for step, layer, _ in units]
        shards.append(ladder.LadderShard([chunkcodec.encode(c) for c in raw], rung_errors(x, top_np, raw, weights)))
    del reader, fp16_file
    return ladder.write_ladder(pack_path, pack_path, shards, fp16_path, fp16_file_id)
