"""Prefetch on template pick: the template's cache starts moving while the person picks a photo.

Choosing a template reveals nothing private (the server sees template ids and byte ranges only, as
during an edit). The device fetches each fetch unit, in consumption order, at the level the expected
think time allows (:func:`plan_prefetch`), and keeps what arrived *whole* compressed on device storage
(:class:`PrefetchStore`: a byte cap, least recently used template evicted first; rebuilt K/V in RAM is
still bounded by the edit's ≤ 3 shards). The edit then treats each held unit as a floor: the policy
fetches an upgrade only when it chooses a better level than the one held, and when execution reaches a
unit whose upgrade is still in flight it uses the held bytes instead of waiting.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from sakura.formats import FetchUnit, Level, Range, StreamEncoding
from sakura.online.policies import DEFAULT_GAMMA, best_within

DEFAULT_STORE_CAP_BYTES = 256 << 20  # compressed template bytes a device keeps across templates


@dataclass
class HeldUnit:
    """One fetch unit's bytes already on the device, at one level."""

    level: Level
    ranges: list[Range]
    parts: list[bytes]

    @property
    def nbytes(self) -> int:
        return sum(len(p) for p in self.parts)


@dataclass
class Prefetched:
    """What a template has on the device before the edit starts (by fetch-unit index)."""

    template_id: str
    file_id: str
    think_s: float
    units: dict[int, HeldUnit] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(h.nbytes for h in self.units.values())

    def summary(self) -> dict:
        return {"units": len(self.units), "bytes": self.nbytes, "think_s": self.think_s}


def plan_prefetch(units: list[FetchUnit], budget_bytes: float) -> list[tuple[FetchUnit, Level]]:
    """What to fetch, in consumption order, within ``budget_bytes``: the same per-unit budget for every
    unit (the best level within it); if even every unit's smallest level does not fit, the first units
    at their smallest — early shards matter most, later ones can still stream behind compute."""
    if not units or budget_bytes <= 0:
        return []
    smallest = [min(u.levels, key=lambda lv: lv.nbytes) for u in units]
    if sum(lv.nbytes for lv in smallest) <= budget_bytes:
        per_unit = budget_bytes / len(units)
        return [(u, best_within(u.levels, per_unit)[0]) for u in units]
    plan, spent = [], 0.0
    for u, lv in zip(units, smallest):
        if spent + lv.nbytes > budget_bytes:
            break
        plan.append((u, lv))
        spent += lv.nbytes
    return plan


def prefetch_budget(rate_bps: float, think_s: float, gamma: float = DEFAULT_GAMMA) -> float:
    """Bytes the device expects to receive in the think time (at its rate estimate when the template is picked)."""
    return max(0.0, rate_bps) / 8 * gamma * max(0.0, think_s)


def simulate_prefetch(encoding: StreamEncoding, file_id: str, template_id: str, trace, edit_start: float,
                      think_s: float, fetch, request_overhead_s: float) -> Prefetched:
    """Prefetch on the simulated clock: requests back to back from ``edit_start − think_s`` (trace time)
    over the FIFO link; a unit is held if its last byte is through by the edit's start."""
    t0 = edit_start - think_s
    plan = plan_prefetch(encoding.units, prefetch_budget(float(trace.rate_at(t0)) * 1e6, think_s))
    held = Prefetched(template_id, file_id, think_s)
    free = t0
    for unit, level in plan:
        ranges = encoding.ranges(unit, level)
        begin = max(t0 + request_overhead_s, free)
        done = begin + trace.time_to_send(sum(n for _, n in ranges), begin)
        if done > edit_start:
            break
        free = done
        held.units[unit.index] = HeldUnit(level, ranges, fetch(ranges))
    return held


def prefetch_over(link, encoding: StreamEncoding, file_id: str, template_id: str, think_s: float,
                  rate_bps: float, stop: threading.Event) -> Prefetched:
    """Prefetch on the real clock over a paced link until ``stop`` (the person pressed Run): units that
    came through whole are held; the one in flight at ``stop`` is dropped."""
    held = Prefetched(template_id, file_id, think_s)
    for unit, level in plan_prefetch(encoding.units, prefetch_budget(rate_bps, think_s)):
        if stop.is_set():
            break
        ranges = encoding.ranges(unit, level)
        tr = link.receive(link.send(file_id, ranges), drop=stop)
        if len(tr.parts) < len(ranges):
            break
        held.units[unit.index] = HeldUnit(level, ranges, tr.parts)
    return held


class PrefetchStore:
    """Compressed template bytes on device storage, capped; the least recently used template goes first."""

    def __init__(self, cap_bytes: int = DEFAULT_STORE_CAP_BYTES) -> None:
        self.cap_bytes = cap_bytes
        self._items: OrderedDict[str, Prefetched] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, held: Prefetched) -> None:
        with self._lock:
            self._items[held.template_id] = held
            self._items.move_to_end(held.template_id)
            while len(self._items) > 1 and self.nbytes > self.cap_bytes:
                self._items.popitem(last=False)

    def get(self, template_id: str) -> Prefetched | None:
        with self._lock:
            held = self._items.get(template_id)
            if held is not None:
                self._items.move_to_end(template_id)
            return held

    @property
    def nbytes(self) -> int:
        return sum(h.nbytes for h in self._items.values())

    def __contains__(self, template_id: str) -> bool:
        return template_id in self._items
