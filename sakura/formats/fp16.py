"""The uncompressed FP16 cache as a stored file (the `fp16` baseline, and the reference cache).

Same container as every other format; one chunk per shard: for each cache unit of the shard in
``shard_units`` order, the (n, d) float16 values row-major. Fetch unit = shard, one level.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sakura.formats.base import KV, Level, Range, ShardEncoding
from sakura.formats.container import Blobs, StoredInfo, check_lengths, checked_plan, geometry_ints, write_container
from sakura.kvcache import KVCache, kv_pairs, shard_plan, shard_units

FORMAT = "sakura-fp16"
VERSION = 1
SUFFIX = ".fp16"

if TYPE_CHECKING:
    import torch  # imported inside the functions that make tensors, not here: see sakura.kvcache


class Fp16Info(StoredInfo):
    magic, versions = FORMAT, (VERSION,)

    def __init__(self, header: dict[str, Any], index):
        super().__init__(header, index)
        g = geometry_ints(header, ("n", "d", "num_steps", "num_layers", "shard_size"), "fp16")
        self.n, self.d = g["n"], g["d"]
        self.shards = checked_plan(header, index, g, 1, shard_plan, "fp16")
        check_lengths(index, [2 * (l1 - l0) * self.n * self.d * 2 for _, l0, l1 in self.shards], "fp16")

    def ranges(self, shard: int) -> list[Range]:
        return [self.index.span(shard)]

    @property
    def storage_bytes(self) -> int:
        return self.index.file_size


def write_fp16(path: str | Path, cache: KVCache, *, shard_size: int = 1, model_id: str = "",
               template_id: str = "") -> Fp16Info:
    import torch

    plan = shard_plan(cache.num_steps, cache.num_layers, shard_size)
    chunks = []
    for shard in plan:
        chunks.append(b"".join(cache.unit(*unit).to(torch.float16).numpy().astype("<f2").tobytes()
                               for unit in shard_units(*shard)))
    header = {"format": FORMAT, "version": VERSION, "model_id": model_id, "template_id": template_id,
              "geometry": {"n": cache.num_reused, "d": cache.dim, "num_steps": cache.num_steps,
                           "num_layers": cache.num_layers, "shard_size": shard_size},
              "shards": [list(s) for s in plan]}
    write_container(path, header, chunks)
    return Fp16Info.open(path)[1]


def decode(info: Fp16Info, shard: int, blobs: Blobs, dtype: torch.dtype | None = None) -> KV:
    """K, V (n, d) of every (step, layer) of a shard, from the bytes of its one range (``dtype``: float32 when None)."""
    import torch

    dtype = torch.float32 if dtype is None else dtype
    [data] = info.index.gather([shard], blobs)
    units = shard_units(*info.shards[shard])
    values = np.frombuffer(data, dtype="<f2").reshape(len(units), info.n, info.d)
    return kv_pairs({unit: torch.from_numpy(values[k].astype(np.float32)).to(dtype) for k, unit in enumerate(units)})


class Fp16Encoding(ShardEncoding):
    name, info_cls = "fp16", Fp16Info

    def _levels(self, shard):
        return (Level("fp16", self.info.ranges(shard)[0][1], 0.0, ()),)

    def ranges(self, fetch_unit, level):
        return self.info.ranges(fetch_unit.index)

    def _decode(self, shard, key, blobs):
        return decode(self.info, shard, blobs)

    @property
    def storage_bytes(self):
        return self.info.storage_bytes
