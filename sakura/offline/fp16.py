"""The uncompressed FP16 cache as a stored file (the `fp16` baseline, and the reference cache).

Same container as every other format; one chunk per shard: for each unit of the shard in
``shard_units`` order, the (n, d) float16 values row-major.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from sakura.kvcache import KVCache, shard_plan
from sakura.offline.container import ByteSource, ContainerFile, PackFormatError, parse_header, write_container
from sakura.offline.pack import shard_units

FORMAT = "sakura-fp16"
VERSION = 1


class Fp16Info:
    def __init__(self, header: dict[str, Any], index):
        self.header, self.index = header, index
        try:
            g = header["geometry"]
            self.n, self.d = int(g["n"]), int(g["d"])
            self.shards = [tuple(s) for s in header["shards"]]
        except (KeyError, TypeError, ValueError) as e:
            raise PackFormatError(f"fp16 header is invalid: {e}") from None
        if len(index) != len(self.shards):
            raise PackFormatError("fp16 index does not match its shard list")

    @classmethod
    def from_bytes(cls, buf: bytes) -> "Fp16Info":
        return cls(*parse_header(buf, FORMAT, [VERSION]))

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def ranges(self, shard: int) -> list[tuple[int, int]]:
        return [self.index.span(shard)]

    @property
    def storage_bytes(self) -> int:
        return self.index.file_size


def write_fp16(path: str | Path, cache: KVCache, *, shard_size: int = 1, model_id: str = "",
               template_id: str = "") -> Fp16Info:
    plan = shard_plan(cache.num_steps, cache.num_layers, shard_size)
    chunks = []
    for step, l0, l1 in plan:
        parts = [(cache.k if kind == "k" else cache.v)[(s, layer)].to(torch.float16).numpy().astype("<f2").tobytes()
                 for s, layer, kind in shard_units(step, l0, l1)]
        chunks.append(b"".join(parts))
    header = {"format": FORMAT, "version": VERSION, "model_id": model_id, "template_id": template_id,
              "geometry": {"n": cache.num_reused, "d": cache.dim, "num_steps": cache.num_steps,
                           "num_layers": cache.num_layers, "shard_size": shard_size},
              "shards": [list(s) for s in plan]}
    write_container(path, header, chunks)
    return Fp16Info.from_bytes(ContainerFile(path, FORMAT, [VERSION]).header_bytes)


def decode_fp16_shard(info: Fp16Info, shard: int, blobs: Mapping[tuple[int, int], bytes],
                      dtype: torch.dtype = torch.float32) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]:
    span = info.index.span(shard)
    buf = ByteSource(blobs).get(*span)
    info.index.check(shard, buf)
    step, l0, l1 = info.shards[shard]
    units = shard_units(step, l0, l1)
    arr = np.frombuffer(buf, dtype="<f2").reshape(len(units), info.n, info.d)
    out: dict = {}
    for k, (s, layer, kind) in enumerate(units):
        out.setdefault((s, layer), {})[kind] = torch.from_numpy(arr[k].astype(np.float32)).to(dtype)
    return {key: (kv["k"], kv["v"]) for key, kv in out.items()}
