"""What a stored format is, and what a system streams from it (LMCache-style: one plug-in per codec).

A :class:`Format` is one kind of stored file: its name, the suffix of its file id, the magic in
its header, the type that parses that header (its *info*), its writer and its stream encoding.

A stream is a list of *fetch units* (:class:`FetchUnit`: what one request fetches) in consumption
order. Each has *levels* (ways to send it, sorted by bytes), byte ranges per level inside one
stored file, and a decoder that turns the received bytes into K/V for the cache units
(``(step, layer, kind)``, see :mod:`sakura.kvcache`) it completes. SAKURA's fetch unit is a shard
and its levels are the pack's rank–precision frontier; FP16 and IntQ fetch shards at one level;
CacheGen fetches shards at one of its stored quality levels (a level's entropy tables ride along
with its first use, see :meth:`StreamEncoding.priced`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from sakura.formats.container import Range
from sakura.kvcache import KV

__all__ = ["KV", "Range", "Level", "FileRef", "FetchUnit", "StreamEncoding", "ShardEncoding", "Format", "shard_label"]


@dataclass(frozen=True)
class Level:
    label: str
    nbytes: int
    error: float  # offline quality proxy, lower is better (allocators only compare within a fetch unit)
    key: tuple = ()
    # Rebuild work in multiply-accumulates (a low-rank level's A·B product): what its rebuild time grows
    # with, for policies that price rebuild (RebuildRate turns it into seconds); 0 = not modelled.
    work: float = 0.0
    # The ladder rung above a pack's allocated levels this level is ("" for every other level): the
    # timeline records it so rungs show apart from the allocated levels.
    rung: str = ""


@dataclass(frozen=True)
class FileRef:
    """Another stored file a level's ranges read: offsets ``[base, base + size)`` of the referring file's
    ranges are offsets ``[0, size)`` of ``file_id`` (the ladder's exact rung reads the FP16 file)."""

    file_id: str
    base: int
    size: int


@dataclass(frozen=True)
class FetchUnit:
    """What one request of a stream fetches (a shard in every stored format), not a cache unit."""

    index: int
    needed_by: int  # the first execution shard (index in shard order) that needs it
    label: str
    levels: tuple[Level, ...] = field(default_factory=tuple)
    # The output's masked MSE per unit of its levels' error (measured at build,
    # :mod:`sakura.offline.output_weights`): what makes errors of different units comparable. 1.0 where the
    # format stores none (its errors then compare only within a unit, as before).
    weight: float = 1.0


class StreamEncoding(ABC):
    """One stored file of a template and how to stream it. ``decode`` may keep per-edit assembly
    state (CacheGen chunks), so make a fresh instance per edit with ``fresh()``."""

    name: str = ""
    # Decoding keeps no per-edit state: the same bytes decode again to the same K/V (the reuse fallback
    # rebuilds kept bytes) and a dropped unit takes nothing later units need (the recompute fallback drops
    # step 0's). False for CacheGen, whose entropy tables ride with a level's first use in the edit.
    redecodable: bool = True
    # A leading part of a level's ranges decodes to a smaller level (``prefixes`` offers more than the whole):
    # a runtime that must consume a unit early can cut it rather than wait.
    progressive: bool = False

    @property
    def prices_pending(self) -> bool:
        """The file was published before its measured prices; the same file, priced, will replace it with every
        chunk where it was (a device reads its header again to get them)."""
        return False

    @property
    @abstractmethod
    def units(self) -> list[FetchUnit]:
        """The fetch units, in consumption order."""

    @abstractmethod
    def ranges(self, fetch_unit: FetchUnit, level: Level) -> list[Range]: ...

    def step_error(self, fetch_unit: FetchUnit) -> float | None:
        """How far its layers' K/V of one step earlier are from its own, in the metric of its levels'
        ``error`` (what the reuse fallback adds); None: not known (step 0, or a format without it)."""
        return None

    @abstractmethod
    def decode(self, fetch_unit: FetchUnit, level: Level, blobs: list[bytes]) -> KV:
        """K/V of every (step, layer) this fetch unit completes (maybe none yet, for partial chunks)."""

    def prefixes(self, fetch_unit: FetchUnit, level: Level, ranges: list[Range]) -> list[tuple[Level, int]]:
        """Levels decodable from a leading part of ``ranges`` (what ``ranges(fetch_unit, level)``
        returned), each with how many leading ranges it needs, smallest first; the last is ``level``
        with all of them. A runtime that must consume the unit early uses the best prefix that arrived
        (anytime shards). Default: only the whole."""
        return [(level, len(ranges))]

    def decode_prefix(self, fetch_unit: FetchUnit, level: Level, ranges: list[Range], blobs: list[bytes]) -> KV:
        """Decode ``level`` (one of :meth:`prefixes`) from the leading ``ranges`` that arrived."""
        return self.decode(fetch_unit, level, blobs)

    def fresh(self) -> "StreamEncoding":
        return self

    def priced(self, fetch_unit: FetchUnit) -> FetchUnit:
        """The unit as a policy should see it at this point of the edit: each level's ``nbytes`` is
        everything requesting it would fetch now, side data included (CacheGen's entropy tables of a
        level this edit has not used yet). ``ranges`` of a level then include that side data once."""
        return fetch_unit

    @property
    def storage_bytes(self) -> int:
        return 0

    @property
    def references(self) -> list[FileRef]:
        """Other stored files some levels' ranges read (:class:`FileRef`); a source resolves them."""
        return []

    @property
    def shards(self) -> list[tuple[int, int, int]]:
        """Execution shards ``(step, layer_start, layer_end)`` the stored file was cut into."""
        return [tuple(s) for s in self.info.shards]  # type: ignore[attr-defined]


def shard_label(shard: Sequence[int]) -> str:
    step, layer_start, layer_end = shard
    return f"step {step} layers {layer_start}-{layer_end - 1}"


class ShardEncoding(StreamEncoding):
    """Encodings whose fetch unit is one shard: subclasses say how levels map to ranges and decodes."""

    info_cls: type = object

    def __init__(self, info):
        self.info = info
        self._units = [FetchUnit(i, i, shard_label(shard), self._levels(i), self._weight(i))
                       for i, shard in enumerate(info.shards)]

    @classmethod
    def from_header(cls, header: bytes):
        return cls(cls.info_cls.from_bytes(header))

    @property
    def units(self):
        return self._units

    def decode(self, fetch_unit, level, blobs):
        return self._decode(fetch_unit.index, level.key, dict(zip(self.ranges(fetch_unit, level), blobs)))

    @abstractmethod
    def _levels(self, shard: int) -> tuple[Level, ...]: ...

    def _weight(self, shard: int) -> float:
        """The shard's output weight (:attr:`FetchUnit.weight`); 1.0 where the format stores none."""
        return 1.0

    @abstractmethod
    def _decode(self, shard: int, key: tuple, blobs: dict) -> KV: ...


@dataclass(frozen=True)
class Format:
    """One stored format. ``write(path, source, *, model_id, template_id, **options)`` takes the
    cache itself (with ``shard_size``), or, when ``from_factors``, the content the offline side
    computed for it (:class:`sakura.formats.pack.PackSource`): the format only serialises."""

    name: str
    suffix: str  # file id = template id + suffix; the file on disk is ``<file id>.pack``
    info_cls: type  # a StoredInfo: its magic, versions and header parsing
    encoding_cls: type[StreamEncoding]
    write: Callable[..., Any]
    from_factors: bool = False
    layout: str | None = None  # a pack layout this format always stores ("uniform" = v1); None: the builder's

    def file_id(self, template_id: str) -> str:
        return template_id + self.suffix

    def open(self, path: str | Path):
        """The parsed header (info) of a stored file of this format, checked against its length."""
        return self.info_cls.open(path)[1]
