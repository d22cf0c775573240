"""The per-edit timeline: every fetch unit's request, arrival and rebuild, every shard's execution.

Times are seconds since the edit started. The same records come from the real runtime and from the
simulated clock, so plots and tests treat both alike. A timeline is also the one model of an edit's
progress on both sides of the device protocol: the runtime records into it through the methods
below, each of which emits one event (a JSON-ready dict, ``docs/device-protocol.md``), and a
viewer (the app) folds the same events back into a :class:`Timeline` with :meth:`Timeline.apply`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

EventSink = Callable[[dict], None]


@dataclass
class UnitRecord:
    """One fetch unit of the stream (a shard of the cache at one level)."""

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
    arrival_t: float | None = None  # None: still in flight
    first_byte_t: float | None = None  # (real clock) when the link started on its bytes
    rebuild_done_t: float | None = None
    deadline_t: float = 0.0  # predicted need time when requested
    needed_t: float = 0.0  # when execution actually reached it
    ranges: int = 0
    requested_level: str = ""  # what was asked for, when execution cut the transfer short (anytime)
    requested_bytes: int = 0
    dropped: bool = False  # a fallback replaced it: what came through (``nbytes``) was not used
    prefetched: bool = False  # execution used bytes fetched when the template was picked (``level``)
    # The ladder rung ``level`` is, above the pack's allocated levels ("res4": the top level plus 4 residual
    # planes, "exact": the FP16 values); "" for an allocated level or any other format's.
    rung: str = ""
    # How late the plan chose this unit to be, spending the edit's stall budget for a much better level (0: on time).
    planned_late_s: float = 0.0


@dataclass
class ShardRecord:
    shard: int
    step: int
    layers: tuple[int, int]
    exec_start_t: float | None = None
    exec_end_t: float | None = None
    stall_s: float = 0.0

    @property
    def label(self) -> str:
        return f"step {self.step} · L{self.layers[0]}–{self.layers[1] - 1}"


def _merge(intervals) -> list[list[float]]:
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


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
    fallbacks: list[dict] = field(default_factory=list)  # {kind, shard, t, predicted_end_s}, in order
    on_event: EventSink | None = field(default=None, repr=False, compare=False)

    @classmethod
    def for_shards(cls, system: str, clock: str, shards, on_event: EventSink | None = None, **kw) -> "Timeline":
        """An empty timeline over execution shards ``(step, layer_start, layer_end)``."""
        return cls(system, clock, shards=[ShardRecord(j, s, (a, b)) for j, (s, a, b) in enumerate(shards)],
                   on_event=on_event, **kw)

    # ------------------------------------------------------------------ recording (the runtime side)
    def _emit(self, event_type: str, **data) -> None:
        if self.on_event is not None:
            self.on_event({"type": event_type, **data})

    def requested(self, rec: UnitRecord) -> None:
        self.units.append(rec)
        self._emit("request", unit=rec.unit, shard=rec.needed_by, label=rec.label, level=rec.level, bytes=rec.nbytes,
                   t=rec.request_t, deadline=rec.deadline_t, budget_bytes=rec.budget_bytes, window_s=rec.window_s,
                   rate_mbps=rec.rate_mbps, fits=rec.fits, prefetched=rec.prefetched, rung=rec.rung,
                   planned_late_s=rec.planned_late_s)

    def arrived(self, rec: UnitRecord, t: float, active_s: float, ranges, first_byte_t: float | None = None) -> None:
        rec.arrival_t, rec.first_byte_t = t, first_byte_t
        self._emit("arrival", unit=rec.unit, shard=rec.needed_by, level=rec.level, bytes=rec.nbytes, t=t,
                   deadline=rec.deadline_t, active_s=active_s, ranges=[list(r) for r in ranges])

    def cut(self, rec: UnitRecord, level: str, nbytes: int, t: float, rung: str = "") -> None:
        """Execution reached the unit before all of it arrived: it uses ``level`` (ladder rung ``rung``), the
        best configuration within the ``nbytes`` that had, and the rest of the transfer is dropped."""
        rec.requested_level, rec.requested_bytes = rec.level, rec.nbytes
        rec.level, rec.nbytes, rec.rung = level, nbytes, rung
        self._emit("cut", unit=rec.unit, shard=rec.needed_by, level=level, bytes=nbytes,
                   requested_level=rec.requested_level, requested_bytes=rec.requested_bytes, t=t, rung=rung)

    def dropped(self, rec: UnitRecord, nbytes: int, t: float, used_level: str = "") -> None:
        """A fallback replaced the unit: its transfer stopped at ``t`` with ``nbytes`` through, unused.
        ``used_level``: the level execution uses instead, from bytes prefetched on the device."""
        rec.requested_level, rec.requested_bytes = rec.level, rec.nbytes
        rec.level, rec.nbytes, rec.dropped, rec.arrival_t = used_level, nbytes, True, t
        rec.prefetched = bool(used_level)
        self._emit("drop", unit=rec.unit, shard=rec.needed_by, bytes=nbytes, t=t, used_level=used_level)

    def fallback(self, kind: str, shard: int, t: float, predicted_end_s: dict | None = None) -> None:
        """Execution did not wait for ``shard``: ``reuse`` (the previous step's K/V of its layers) or
        ``local`` (this step and the rest on every token), chosen by predicted end of the edit."""
        ends = {k: round(v, 4) for k, v in (predicted_end_s or {}).items() if v != float("inf")}
        self.fallbacks.append({"kind": kind, "shard": shard, "t": t, "predicted_end_s": ends})
        self._emit("fallback", kind=kind, shard=shard, t=t, predicted_end_s=ends)

    def fallback_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.fallbacks:
            out[f["kind"]] = out.get(f["kind"], 0) + 1
        return out

    @property
    def cuts(self) -> int:
        return sum(1 for u in self.units if u.requested_level and not u.dropped)

    def rebuilt(self, rec: UnitRecord, t: float) -> None:
        rec.rebuild_done_t = t
        self._emit("rebuilt", unit=rec.unit, shard=rec.needed_by, t=t)

    def shard_started(self, shard: int, t: float, stall_s: float = 0.0) -> None:
        rec = self.shards[shard]
        rec.exec_start_t, rec.stall_s = t, stall_s
        self._emit("shard_start", shard=shard, t=t, stall_s=stall_s)

    def shard_ended(self, shard: int, t: float) -> None:
        self.shards[shard].exec_end_t = t
        self._emit("shard_end", shard=shard, t=t)

    # --------------------------------------------------------------------- folding (the viewer side)
    def apply(self, ev: dict) -> None:
        """Fold one timeline event in (unknown types are ignored: forward compatible)."""
        kind, t = ev.get("type"), ev.get("t")
        if kind == "request":
            self.units.append(UnitRecord(int(ev["unit"]), int(ev.get("shard", 0)), str(ev.get("label", "")),
                                         str(ev.get("level", "")), int(ev.get("bytes") or 0),
                                         _num(ev.get("budget_bytes")), _num(ev.get("window_s")),
                                         _num(ev.get("rate_mbps")), bool(ev.get("fits", True)), _num(t),
                                         deadline_t=_num(ev.get("deadline")), prefetched=bool(ev.get("prefetched")),
                                         rung=str(ev.get("rung") or ""),
                                         planned_late_s=_num(ev.get("planned_late_s"))))
        elif kind == "cut":
            rec = self.unit(int(ev.get("unit", -1)))
            if rec is not None:
                rec.requested_level, rec.requested_bytes = rec.level, rec.nbytes
                rec.level, rec.nbytes = str(ev.get("level", rec.level)), int(ev.get("bytes") or 0)
                rec.rung = str(ev.get("rung") or "")
        elif kind == "drop":
            rec = self.unit(int(ev.get("unit", -1)))
            if rec is not None:
                rec.requested_level, rec.requested_bytes = rec.level, rec.nbytes
                rec.level, rec.nbytes, rec.dropped, rec.arrival_t = (str(ev.get("used_level") or ""),
                                                                     int(ev.get("bytes") or 0), True, _num(t))
                rec.prefetched = bool(ev.get("used_level"))
        elif kind == "fallback":
            self.fallbacks.append({"kind": str(ev.get("kind", "")), "shard": int(ev.get("shard", 0)), "t": _num(t),
                                   "predicted_end_s": ev.get("predicted_end_s") or {}})
        elif kind in ("arrival", "rebuilt"):
            rec = self.unit(int(ev.get("unit", -1)))
            if rec is not None and isinstance(t, (int, float)):
                if kind == "arrival":
                    rec.arrival_t = float(t)
                else:
                    rec.rebuild_done_t = float(t)
        elif kind in ("shard_start", "shard_end"):
            j = int(ev.get("shard", 0))
            while len(self.shards) <= j:
                self.shards.append(ShardRecord(len(self.shards), 0, (0, 1)))
            if kind == "shard_start":
                self.shards[j].exec_start_t, self.shards[j].stall_s = _num(t), _num(ev.get("stall_s"))
            else:
                self.shards[j].exec_end_t = _num(t)

    def unit(self, index: int) -> UnitRecord | None:
        return next((u for u in reversed(self.units) if u.unit == index), None)

    # ------------------------------------------------------------------------------------- summary
    @property
    def stall_s(self) -> float:
        return sum(s.stall_s for s in self.shards)

    @property
    def deadline_misses(self) -> int:
        return sum(1 for s in self.shards if s.stall_s > 1e-4)

    @property
    def bytes_received(self) -> int:
        return sum(u.nbytes for u in self.units if u.arrival_t is not None)

    def transfer_split(self) -> tuple[float, float, float]:
        """(transfer time, hidden, exposed): the union of request→arrival intervals, and how much of
        it overlapped a stall of execution (exposed) or not (hidden behind compute)."""
        xfer = _merge([(u.request_t, u.arrival_t) for u in self.units if u.arrival_t is not None])
        stalls = _merge([(s.exec_start_t - s.stall_s, s.exec_start_t) for s in self.shards
                         if s.stall_s > 0 and s.exec_start_t is not None])
        total = sum(b - a for a, b in xfer)
        exposed = sum(max(0.0, min(b, d) - max(a, c)) for a, b in xfer for c, d in stalls)
        return total, max(0.0, total - exposed), exposed

    def summary(self) -> dict:
        return {"system": self.system, "clock": self.clock, "latency_s": self.latency_s,
                "stall_s": self.stall_s, "bytes": self.bytes_total, "deadline_misses": self.deadline_misses,
                "shards": len(self.shards), "peak_cache_bytes": self.peak_cache_bytes,
                "levels": [u.level for u in self.units], "rungs": [u.rung for u in self.units], "cuts": self.cuts,
                "fallbacks": self.fallback_counts()}

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("on_event", None)
        d["summary"] = self.summary()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Timeline":
        """The timeline :meth:`to_dict` wrote (a simulated edit's, sent whole: it emitted no events)."""
        units = [UnitRecord(**{k: v for k, v in u.items() if k in UnitRecord.__dataclass_fields__})
                 for u in d.get("units") or []]
        shards = [ShardRecord(**{**{k: v for k, v in s.items() if k in ShardRecord.__dataclass_fields__},
                                 "layers": tuple(s["layers"])}) for s in d.get("shards") or []]
        return cls(str(d.get("system", "")), str(d.get("clock", "sim")), units, shards,
                   float(d.get("latency_s") or 0.0), int(d.get("bytes_total") or 0),
                   int(d.get("peak_cache_bytes") or 0), float(d.get("trace_start_s") or 0.0),
                   dict(d.get("extras") or {}), list(d.get("fallbacks") or []))


def _num(x) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else 0.0
