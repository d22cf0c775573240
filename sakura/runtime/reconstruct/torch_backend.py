"""The reference reconstructor: :func:`sakura.formats.pack.decode_shard` (numpy bit unpacking + torch addmm)."""

from __future__ import annotations

from sakura.formats.pack import PackInfo, decode_shard
from sakura.kvcache import KV
from sakura.runtime.reconstruct.base import Reconstructor


class TorchReconstructor(Reconstructor):
    name = "torch"

    def rebuild(self, info: PackInfo, shard: int, *key_blobs, verify: bool = True) -> KV:
        return decode_shard(info, shard, *key_blobs, verify=verify)
