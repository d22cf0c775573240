"""The reusable template KV cache as it lives in memory, the shard grouping, and the K/V pairing.

A *cache unit* is ``(step, layer, kind)`` with kind ``"k"`` or ``"v"``; its tensor is ``n × d``
(n reusable image tokens of the template, d = heads × head_dim), post-RoPE for Flux2, in the
token order of ``reuse_index`` (ascending token indices of the unmasked tokens). (A stream's
*fetch unit*, :class:`sakura.formats.FetchUnit`, is something else: what one request fetches.)

A *shard* is a group of consecutive layers at one step; shards are consumed in order
``(step 0, layers 0..g-1), (step 0, layers g..2g-1), …, (step 1, …)``. Every stored format keeps
a shard's cache units in :func:`shard_units` order, and every decoder hands its per-unit tensors
to :func:`kv_pairs` to get the ``{(step, layer): (K, V)}`` the masked run consumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    # torch is imported where tensors are made (KVCache.save / load, the formats' decoders), not here: the
    # format registry imports this module, and the template server and `sakura pack-info` only read headers
    # and bytes — torch's import (~2 s) would be most of their start-up.
    import torch

LayerKey = tuple[int, int]  # (step, layer)
CacheUnit = tuple[int, int, str]  # (step, layer, "k" | "v")
KV = dict[LayerKey, tuple["torch.Tensor", "torch.Tensor"]]  # (step, layer) -> (K, V), each (n, d)
KINDS = ("k", "v")


@dataclass
class KVCache:
    """K/V of the reusable tokens for every (step, layer). Tensors are ``(n, heads*head_dim)``."""

    num_steps: int
    num_layers: int
    heads: int
    head_dim: int
    reuse_index: torch.Tensor  # (n,) long, ascending token indices of the reusable tokens
    k: dict[LayerKey, torch.Tensor] = field(default_factory=dict)
    v: dict[LayerKey, torch.Tensor] = field(default_factory=dict)

    @property
    def num_reused(self) -> int:
        return int(self.reuse_index.numel())

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim

    def nbytes(self, bytes_per_value: int = 2) -> int:
        """Size of the cache at ``bytes_per_value`` (2 = FP16, what an uncompressed transfer sends)."""
        return 2 * self.num_steps * self.num_layers * self.num_reused * self.dim * bytes_per_value

    def get(self, step: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[(step, layer)], self.v[(step, layer)]

    def unit(self, step: int, layer: int, kind: str) -> torch.Tensor:
        """The tensor of one cache unit."""
        return (self.k if kind == "k" else self.v)[(step, layer)]

    def provider(self, dtype: torch.dtype | None = None):
        """A provider callback for masked runs serving this cache (optionally cast, e.g. to FP16 and back)."""

        def provide(step: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
            k, v = self.get(step, layer)
            if dtype is not None:
                k, v = k.to(dtype), v.to(dtype)
            return k, v

        return provide

    def to(self, dtype: torch.dtype) -> "KVCache":
        return KVCache(
            self.num_steps, self.num_layers, self.heads, self.head_dim, self.reuse_index,
            {key: t.to(dtype) for key, t in self.k.items()},
            {key: t.to(dtype) for key, t in self.v.items()},
        )

    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file  # imports torch: see the top of the module

        tensors = {"reuse_index": self.reuse_index.contiguous()}
        for (s, l), t in self.k.items():
            tensors[f"k.{s}.{l}"] = t.contiguous()
        for (s, l), t in self.v.items():
            tensors[f"v.{s}.{l}"] = t.contiguous()
        meta = {"num_steps": str(self.num_steps), "num_layers": str(self.num_layers),
                "heads": str(self.heads), "head_dim": str(self.head_dim)}
        save_file(tensors, str(path), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> "KVCache":
        from safetensors import safe_open
        from safetensors.torch import load_file  # imports torch: see the top of the module

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
        tensors = load_file(str(path))
        cache = cls(int(meta["num_steps"]), int(meta["num_layers"]), int(meta["heads"]),
                    int(meta["head_dim"]), tensors.pop("reuse_index"))
        for name, t in tensors.items():
            kind, s, l = name.split(".")
            getattr(cache, kind)[(int(s), int(l))] = t
        return cache


def shard_layers(num_layers: int, shard_size: int) -> list[tuple[int, int]]:
    """Layer ranges ``[start, end)`` of the shards of one step."""
    if shard_size < 1:
        raise ValueError("shard size must be >= 1")
    return [(a, min(a + shard_size, num_layers)) for a in range(0, num_layers, shard_size)]


def shard_plan(num_steps: int, num_layers: int, shard_size: int) -> list[tuple[int, int, int]]:
    """All shards in consumption order as ``(step, layer_start, layer_end)``."""
    return [(s, a, b) for s in range(num_steps) for a, b in shard_layers(num_layers, shard_size)]


def shard_of_layers(shards) -> dict[tuple[int, int], int]:
    """``(step, layer) -> index`` of the shard (in ``shards``, consumption order) that holds it."""
    return {(step, layer): j for j, (step, l0, l1) in enumerate(shards) for layer in range(l0, l1)}


def shard_units(step: int, layer_start: int, layer_end: int) -> list[CacheUnit]:
    """The cache units of a shard in storage order: layer-major, K then V."""
    return [(step, layer, kind) for layer in range(layer_start, layer_end) for kind in KINDS]


def kv_pairs(units: Mapping[CacheUnit, torch.Tensor]) -> KV:
    """``{(step, layer): (K, V)}`` from decoded per-cache-unit tensors (both kinds of each layer needed)."""
    by_layer: dict[LayerKey, dict[str, torch.Tensor]] = {}
    for (step, layer, kind), x in units.items():
        by_layer.setdefault((step, layer), {})[kind] = x
    try:
        return {key: (kinds["k"], kinds["v"]) for key, kinds in by_layer.items()}
    except KeyError as e:
        raise ValueError(f"a layer has no {e.args[0]!r} tensor: K and V come in pairs") from None
