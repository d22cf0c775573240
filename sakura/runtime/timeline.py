"""The per-edit timeline: what every shard request looked like, and the run's summary.

Times are seconds since the edit started. The same records come from the real runtime and from
the simulated clock, so plots and tests treat both alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class UnitRecord:
    unit: int
    needed_by: int  # execution shard index
    label: str  # what the unit covers (e.g. "step 0 layers 0-1")
    level: str = ""  # the chosen configuration, e.g. "r32/a4/b6", "int4", "fp16"
    nbytes: int = 0
    budget_bytes: float = 0.0
    window_s: float = 0.0
    rate_mbps: float = 0.0
    fits: bool = True
    request_t: float = 0.0
    arrival_t: float = 0.0
    rebuild_done_t: float = 0.0
    deadline_t: float = 0.0  # predicted need time when requested
    needed_t: float = 0.0  # when execution actually reached it
    ranges: int = 0


@dataclass
class ShardRecord:
    shard: int
    step: int
    layers: tuple[int, int]
    exec_start_t: float = 0.0
    exec_end_t: float = 0.0
    stall_s: float = 0.0


@dataclass
class Timeline:
    system: str
    clock: str  # "real" | "sim"
    units: list[UnitRecord] = field(default_factory=list)
    shards: list[ShardRecord] = field(default_factory=list)
    latency_s: float = 0.0
    bytes_total: int = 0
    peak_cache_bytes: int = 0
    trace_start_s: float = 0.0
    extras: dict = field(default_factory=dict)

    @property
    def stall_s(self) -> float:
        return sum(s.stall_s for s in self.shards)

    @property
    def deadline_misses(self) -> int:
        return sum(1 for s in self.shards if s.stall_s > 1e-4)

    def summary(self) -> dict:
        return {"system": self.system, "clock": self.clock, "latency_s": self.latency_s,
                "stall_s": self.stall_s, "bytes": self.bytes_total, "deadline_misses": self.deadline_misses,
                "shards": len(self.shards), "peak_cache_bytes": self.peak_cache_bytes,
                "levels": [u.level for u in self.units]}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["summary"] = self.summary()
        return d
