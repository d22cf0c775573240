"""The reconstruction seam: rebuild a shard's K/V from the bytes of one pack configuration.

``Reconstructor.rebuild(info, shard, *level_key, blobs) -> {(step, layer): (K, V)}`` (a v1 pack's
key is ``r, b_a, b_b``, a v2 pack's ``k``: see :mod:`sakura.formats.allocated`) with K, V
``(n, heads*head_dim)`` float32 — exactly what :func:`sakura.formats.pack.decode_shard` returns, so
backends are interchangeable. ``blobs`` maps ``(offset, length)`` → bytes as received (any blob
covering a chunk will do); chunks are CRC-checked unless ``verify=False``. A backend gets the
received planes per factor from :func:`sakura.formats.pack.shard_bytes` and pairs its rebuilt
cache units with :func:`sakura.kvcache.kv_pairs`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from sakura.formats.pack import PackInfo
from sakura.kvcache import KV


class Reconstructor(ABC):
    name: str = ""

    @abstractmethod
    def rebuild(self, info: PackInfo, shard: int, *key_blobs, verify: bool = True) -> KV:
        """K/V of every (step, layer) of ``shard`` at a level: ``rebuild(info, shard, *level.key, blobs)``."""

    def close(self) -> None:
        """Release device resources (optional)."""
