"""What a system streams, independent of how bytes travel (LMCache-style: one plug-in per codec).

A stream is a list of *fetch units* in consumption order. Each has *levels* (ways to send it,
sorted by bytes), byte ranges per level inside one stored file, and a decoder that turns the
received bytes into K/V for the cache units it completes. SAKURA's fetch unit is a shard and its
levels are the pack's rank–precision frontier; FP16 and IntQ fetch shards at one level; CacheGen
fetches token chunks of a step at one of its stored quality levels.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

Range = tuple[int, int]
KV = dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Level:
    label: str
    nbytes: int
    error: float  # offline quality proxy, lower is better (allocators only compare within a unit)
    key: tuple = ()


@dataclass(frozen=True)
class FetchUnit:
    index: int
    needed_by: int  # the first execution shard (index in shard order) that needs it
    label: str
    levels: tuple[Level, ...] = field(default_factory=tuple)


class StreamEncoding(ABC):
    """One stored file of a template and how to stream it. ``decode`` may keep per-edit assembly
    state (CacheGen chunks), so make a fresh instance per edit with ``fresh()``."""

    name: str = ""
    file_suffix: str = ""

    @property
    @abstractmethod
    def units(self) -> list[FetchUnit]: ...

    @abstractmethod
    def ranges(self, unit: FetchUnit, level: Level) -> list[Range]: ...

    @abstractmethod
    def decode(self, unit: FetchUnit, level: Level, blobs: list[bytes]) -> KV:
        """K/V of every (step, layer) this unit completes (maybe none yet, for partial chunks)."""

    def fresh(self) -> "StreamEncoding":
        return self

    def preamble_ranges(self) -> list[Range]:
        """Bytes every edit fetches once before the first unit (CacheGen's entropy models)."""
        return []

    def set_preamble(self, blobs: list[bytes]) -> None:
        pass

    @property
    def storage_bytes(self) -> int:
        return 0

    @property
    def shards(self) -> list[tuple[int, int, int]]:
        """Execution shards ``(step, layer_start, layer_end)`` the stored file was cut into."""
        return [tuple(s) for s in self.info.shards]  # type: ignore[attr-defined]
