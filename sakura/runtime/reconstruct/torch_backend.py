"""The reference reconstructor: :func:`sakura.offline.pack.decode_shard` (numpy bit unpacking + torch addmm)."""

from __future__ import annotations

from sakura.offline.pack import PackInfo, decode_shard
from sakura.runtime.reconstruct.base import Blobs, KVShard, Reconstructor


class TorchReconstructor(Reconstructor):
    name = "torch"

    def rebuild(self, info: PackInfo, shard: int, r: int, b_a: int, b_b: int, blobs: Blobs, *,
                verify: bool = True) -> KVShard:
        return decode_shard(info, shard, r, b_a, b_b, blobs, verify=verify)
