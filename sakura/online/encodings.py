"""The stream encodings (plug-ins) and a factory that picks one by name from a template's header."""

from __future__ import annotations

from sakura.offline.pack import PackInfo, decode_shard
from sakura.online.encoding import KV, FetchUnit, Level, StreamEncoding


class SakuraPackEncoding(StreamEncoding):
    """One progressive pack; fetch unit = shard; levels = its rank–precision frontier."""

    name, file_suffix = "sakura", ".pack"

    def __init__(self, info: PackInfo):
        self.info = info
        self._units = []
        for s in range(info.num_shards):
            frontier = info.frontier(s)
            if not frontier:
                raise ValueError(f"pack for {info.template_id} has no trade-off profile for shard {s}")
            levels = tuple(Level(f"r{c.r}/a{c.b_a}/b{c.b_b}", c.bytes, c.error, c.key) for c in frontier)
            step, l0, l1 = info.shards[s]
            self._units.append(FetchUnit(s, s, f"step {step} layers {l0}-{l1 - 1}", levels))

    @property
    def units(self) -> list[FetchUnit]:
        return self._units

    def ranges(self, unit: FetchUnit, level: Level):
        return self.info.ranges(unit.index, *level.key)

    def decode(self, unit: FetchUnit, level: Level, blobs: list[bytes]) -> KV:
        ranges = self.ranges(unit, level)
        return decode_shard(self.info, unit.index, *level.key, dict(zip(ranges, blobs)))

    @property
    def storage_bytes(self) -> int:
        return self.info.file_size


ENCODINGS: dict[str, type[StreamEncoding]] = {"sakura": SakuraPackEncoding}


def encoding_from_header(name: str, header: bytes) -> StreamEncoding:
    """Build the named encoding from the raw header bytes of its stored file."""
    if name == "sakura":
        return SakuraPackEncoding(PackInfo.from_bytes(header))
    if name not in ENCODINGS:
        raise KeyError(f"unknown encoding {name!r}; known: {', '.join(ENCODINGS)}")
    return ENCODINGS[name].from_header(header)  # type: ignore[attr-defined]
