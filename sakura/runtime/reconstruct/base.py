"""The reconstruction seam: rebuild a shard's K/V from the bytes of one pack configuration.

``Reconstructor.rebuild(info, shard, r, b_a, b_b, blobs) -> {(step, layer): (K, V)}`` with K, V
``(n, heads*head_dim)`` float32 — exactly what :func:`sakura.formats.pack.decode_shard` returns, so
backends are interchangeable. ``blobs`` maps ``(offset, length)`` → bytes as received (any blob
covering a chunk will do); chunks are CRC-checked unless ``verify=False``. A backend gets the
received planes per factor from :func:`sakura.formats.pack.shard_bytes` and pairs its rebuilt
cache units with :func:`sakura.kvcache.kv_pairs`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from sakura.formats.container import Blobs
from sakura.formats.pack import PackInfo
from sakura.kvcache import KV


class Reconstructor(ABC):
    name: str = ""

    @abstractmethod
    def rebuild(self, info: PackInfo, shard: int, r: int, b_a: int, b_b: int, blobs: Blobs, *,
                verify: bool = True) -> KV:
        """K/V of every (step, layer) of ``shard`` at configuration ``(r, b_a, b_b)``."""

    def close(self) -> None:
        """Release device resources (optional)."""
