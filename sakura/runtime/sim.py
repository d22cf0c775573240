"""The simulated clock: a discrete-event replay of one streamed edit over a bandwidth trace.

Three stages, as on the device: the receiver fetches fetch units in order (up to ``inflight``
requests outstanding, at most ``ahead`` shards ahead of execution), the reconstructor rebuilds them in order, the
executor runs shards in order and stalls when a shard's cache is not rebuilt yet. Compute and
rebuild times are *measured* (ComputeProfile, and the real decode of the chosen bytes), the link
is the trace integral. Every decision is the scheduler's (:mod:`sakura.runtime.scheduler`, as on the
real clock); this module only works out when things happen, and tells the scheduler what a device
would know at that time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sakura.formats import KV, FetchUnit, Level, StreamEncoding
from sakura.net.paced import DEFAULT_INFLIGHT, DEFAULT_REQUEST_OVERHEAD_S, cut_point
from sakura.net.traces import MAX_MBPS, Trace
from sakura.net.unpaced import groups
from sakura.online.fallback import CHECK_EVERY_S, FallbackContext, in_flight
from sakura.online.monitor import DEFAULT_ESTIMATOR, RuntimeMonitor
from sakura.online.policies import Policy
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.prefetch import HeldUnit, Prefetched
from sakura.runtime.scheduler import WAIT, FallbackChoice, StreamScheduler, UseHeld
from sakura.runtime.timeline import Timeline, UnitRecord

Fetch = Callable[[list[tuple[int, int]]], list[bytes]]


@dataclass
class LinkModel:
    """The link as the simulated clock sees it: a FIFO pipe following the trace. A request's bytes start
    ``request_overhead_s`` after it is sent (its round trip, measured on the real clock and kept with
    the calibration) or when the previous request's bytes are through, whichever is later; up to
    ``inflight`` requests may be outstanding, so with ≥ 2 the round trips hide behind transfers.
    ``unpaced``: the device's link on a kernel-shaped network (:class:`sakura.net.unpaced.UnpacedLink`): one
    worker sends a request when the one before it is through, in sub-requests of growing size, so each
    sub-request's round trip is paid after the link is free."""

    trace: Trace
    start_s: float  # offset into the trace where the edit starts
    request_overhead_s: float = DEFAULT_REQUEST_OVERHEAD_S
    inflight: int = DEFAULT_INFLIGHT
    unpaced: bool = False

    def begin(self, t_request: float, link_free: float, ranges=()) -> float:
        """When the link starts on the bytes of a request sent at ``t_request``."""
        if self.unpaced:
            return max(t_request, link_free) + self.request_overhead_s * max(1, len(groups(ranges)))
        return max(t_request + self.request_overhead_s, link_free)

    def arrival(self, nbytes: int, t_request: float, link_free: float, ranges=()) -> float:
        """When the last byte of a request sent at ``t_request`` arrives."""
        begin = self.begin(t_request, link_free, ranges)
        return begin + self.trace.time_to_send(nbytes, self.start_s + begin)

    def rate_bps_at(self, at: float) -> float:
        return float(self.trace.rate_at(self.start_s + at)) * 1e6


def measured_link(timeline: Timeline, nominal: LinkModel, tail_s: float = 60.0) -> LinkModel:
    """The link a real-clock run actually got, to replay that run on the simulated clock: each transfer's
    bytes spread evenly over its active time (from its first byte as the run recorded it — else its request plus
    the round trip —, or the previous transfer's last byte, to its own last byte), ``nominal`` wherever no
    transfer was on the link. What then differs between the clocks is the pipeline and its decisions, not how
    promptly this machine's threads were scheduled (a loaded CPU wakes the receiver late and reads as a slower
    link)."""
    edges, rates, free = [0.0], [], 0.0

    def nominal_until(t: float) -> None:
        a = edges[-1]
        if t > a + 1e-9:  # the first gap at the rate the edit started on (the monitor's first estimate)
            got = nominal.trace.bytes_between(nominal.start_s + a, nominal.start_s + t)
            rates.append(nominal.rate_bps_at(0.0) / 1e6 if a == 0.0 else 8 * got / (t - a) / 1e6)
            edges.append(t)

    on_link = [u for u in timeline.units if u.arrival_t is not None and u.nbytes > 0 and not u.prefetched]
    for u in sorted(on_link, key=lambda u: u.request_t):
        begin = nominal.begin(u.request_t, free) if u.first_byte_t is None else max(u.first_byte_t, free)
        nominal_until(begin)
        if u.arrival_t > edges[-1] + 1e-9:
            rates.append(min(MAX_MBPS, 8 * u.nbytes / (u.arrival_t - edges[-1]) / 1e6))
            edges.append(u.arrival_t)
        free = max(free, u.arrival_t)
    nominal_until(edges[-1] + tail_s)
    return LinkModel(Trace(np.array(edges), np.array(rates), f"{nominal.trace.name} as measured"), 0.0,
                     nominal.request_overhead_s, nominal.inflight)


@dataclass
class _Booked:
    """One request on the simulated link: what was asked for and when its bytes come through."""

    unit: FetchUnit
    level: Level
    ranges: list
    rec: UnitRecord
    t_req: float
    begin: float  # the link starts on its bytes
    t_arr: float  # its last (used) byte is through
    nbytes: int
    used: tuple = ()  # (level, parts) execution uses: all of it, or the prefix it was cut at
    on_device: HeldUnit | None = None  # prefetched bytes of this unit: a floor under its transfer
    from_device: bool = False  # execution uses the prefetched bytes (no transfer, or the upgrade came too late)
    dropped: bool = False  # a fallback replaced it
    through_at_cut: int = 0  # (cut) bytes through the link by the cut, kept prefix and beyond: the monitor's measure


def simulate(encoding: StreamEncoding, policy: Policy, compute: ComputeProfile, link: LinkModel,
             fetch: Fetch | None, ahead: int = 2, keep: bool = True,
             rebuild_model: Callable[[FetchUnit, object], float] | None = None,
             predicted: ComputeProfile | None = None,
             timer: Callable[[], float] = time.perf_counter,
             estimator: str = DEFAULT_ESTIMATOR, anytime: bool = True,
             fallback: FallbackContext | None = None, prefetched: Prefetched | None = None,
             recompute: Callable[[], KV] | None = None, rebuild_overlap: float = 1.0,
             rebuild_prior_s_per_work: float = 0.0) -> tuple[Timeline, KV]:
    """Run one edit on the simulated clock. Returns its timeline and the rebuilt cache (for quality).

    Rebuild times are measured by decoding the chosen bytes for real; with ``rebuild_model`` (and no
    ``fetch``) nothing is decoded and the model gives the time (paper-scale projections).
    ``predicted`` is what the device believes about its compute (default: ``compute`` itself); replaying
    a real run passes the profile the real runtime predicted with and the compute it really did.
    ``timer`` measures the decodes; use the clock the compute profile was measured on. ``anytime``:
    when execution reaches a unit still in flight, use the best prefix that came through and drop the
    rest (encodings whose levels are prefixes of one another, SAKURA's pack). ``fallback``: while
    execution waits on a shard, re-decide every ``CHECK_EVERY_S`` between waiting, reusing the previous
    step's K/V and going local (:mod:`sakura.online.fallback`); None: always wait (the paper's runtime).
    A local fallback ends the stream: ``timeline.extras["local_from_step"]`` says from which step.
    ``prefetched``: units already on the device (:mod:`sakura.runtime.prefetch`); ``recompute``: the
    template's step-0 K/V as the device would compute them (the recompute fallback's output).
    ``rebuild_overlap``: the share of a rebuild's time that runs beside execution — 1, a device with a core to
    spare for the reconstructor (a phone); 0, rebuilds take the executor's core, so a rebuild done while a shard
    executes delays the next shard by its time (the 2-core host testbed, where the template server and the
    link's threads take the second core). ``rebuild_prior_s_per_work``: the device's calibrated rebuild rate, what
    it predicts rebuilds with until this edit has timed one (0: free)."""
    if not 0.0 <= rebuild_overlap <= 1.0:
        raise ValueError(f"rebuild_overlap is a share in [0, 1], not {rebuild_overlap}")
    return _SimulatedEdit(encoding.fresh(), policy, compute, link, fetch, ahead, keep, rebuild_model,
                          predicted or compute, timer, estimator, anytime, fallback, prefetched, recompute,
                          rebuild_overlap, rebuild_prior_s_per_work).run()


class _SimulatedEdit:
    def __init__(self, encoding, policy, compute, link, fetch, ahead, keep, rebuild_model, predicted, timer,
                 estimator, anytime, fallback=None, prefetched=None, recompute=None, rebuild_overlap=1.0,
                 rebuild_prior_s_per_work=0.0):
        self.fallback, self.recompute, self.rebuild_overlap = fallback, recompute, rebuild_overlap
        self.encoding, self.compute, self.link, self.fetch = encoding, compute, link, fetch
        self.keep, self.rebuild_model, self.timer, self.anytime = keep, rebuild_model, timer, anytime
        monitor = RuntimeMonitor(initial_bps=link.rate_bps_at(0.0), estimator=estimator,
                                 initial_round_trip_s=link.request_overhead_s,
                                 rebuild_prior_s_per_work=rebuild_prior_s_per_work)
        self.sched = StreamScheduler(encoding, policy, predicted, monitor, ahead, anytime, fallback,
                                     prefetched.units if prefetched is not None else None)
        n = len(compute.shards)
        self.starts = self.sched.starts  # (the scheduler's: the deadlines it predicts read them)
        self.ends: list[float | None] = [None] * n
        self.ready = [0.0] * n
        self.tl = Timeline.for_shards(policy.name, "sim", compute.shards, trace_start_s=link.start_s)
        if prefetched is not None:
            self.tl.extras["prefetched"] = prefetched.summary()
        self.cache: KV = {}
        self.booked: list[_Booked] = []  # every request, in order
        self.unseen: list[_Booked] = []  # completed requests the monitor has not seen yet
        self.unseen_rebuilds: list[tuple[float, float, float]] = []  # (done at, work, seconds), not seen yet
        self.done = 0  # requests finalized (consumed by execution), in order
        self.link_free = self.rebuild_free = self.last_request = 0.0
        self.core_free = 0.0  # the executor's core is free for rebuild work (rebuild_overlap < 1)
        self.held: list[tuple[float, float, int]] = []  # (from, to, bytes) of received / rebuilt cache
        self.rebuilt: dict[int, list[tuple[float, int]]] = {}  # per shard: (ready at, K/V bytes), held until it ends
        self.kv_bytes: dict[int, int] = {}  # per shard: rebuilt K/V bytes
        self.local_at: tuple[int, float] | None = None  # (shard, time) of a local fallback

    def run(self) -> tuple[Timeline, KV]:
        self.sched.begin()
        for u in self.encoding.units:
            self.run_until(u.needed_by - 1)
            if self.local_at is not None:
                break
            self.book(u)
        self.run_until(len(self.starts) - 1)
        tl = self.tl
        for rec in tl.units:
            rec.needed_t = self.starts[rec.needed_by] if self.starts[rec.needed_by] is not None else 0.0
        tl.peak_cache_bytes = peak_concurrent(self.held)
        tl.latency_s = self.ends[-1] if self.local_at is None else self._local_end()
        tl.bytes_total = sum(r.nbytes for r in tl.units)
        return tl, self.cache

    def run_until(self, j: int) -> None:
        """The execution schedule of shards ≤ j: each starts when the previous ended and its data is rebuilt."""
        for k in range(j + 1):
            if self.local_at is not None:
                return
            if self.starts[k] is None:
                prev_end = self.compute.prelude_s if k == 0 else self.ends[k - 1]
                first = self.done
                self.core_free = max(self.core_free, prev_end)
                need = self._startup_need(prev_end) if k == 0 else prev_end
                if self.sched.cuts:
                    need = self._cut_at(k, need)
                while self.done < len(self.booked) and self.booked[self.done].unit.needed_by == k:
                    if not self.booked[self.done].dropped:
                        self.settle(self.booked[self.done], need)
                    self.done += 1
                mine = [b for b in self.booked[first:self.done] if not b.dropped]
                # (fallbacks look from the prelude's end: the start-up hold waits for better bytes, not out an outage)
                if self.fallback is not None and not self._fall_back(k, prev_end, mine):
                    for b in mine:
                        self.finalize(b)
                if self.local_at is not None:
                    return
                self.sched.shard_started(k, max(prev_end, self.ready[k]))
                self.ends[k] = self.starts[k] + self.compute.shard_s[k]
                self.tl.shard_started(k, self.starts[k], max(0.0, self.ready[k] - prev_end))
                self.tl.shard_ended(k, self.ends[k])
                self.held += [(a, self.ends[k], n) for a, n in self.rebuilt.pop(k, [])]

    def _startup_need(self, prelude_end: float) -> float:
        """When execution takes shard 0 as it is (an anytime cut): when its bytes are through, at the prelude's
        end at the earliest and at the deadline they were chosen for at the latest."""
        if not self.anytime:
            return prelude_end
        mine = [b for b in self.booked if b.unit.needed_by == 0 and not b.dropped]
        through = max((b.t_arr for b in mine), default=prelude_end)
        return max(prelude_end, min(self.sched.startup_until, through))

    def _cut_at(self, k: int, need: float) -> float:
        """When shard ``k``'s transfers still in flight at ``need`` are cut (the scheduler may wait a moment)."""
        start = self.link.start_s
        late = [b for b in self.booked[self.done:] if b.unit.needed_by == k and not b.dropped
                and b.on_device is None and b.t_arr > need]  # (as the real clock: a held floor never waits)
        if not late:
            return need
        through = lambda b: self.link.trace.bytes_between(start + b.begin, start + need) if need > b.begin else 0.0  # noqa: E731
        return self.sched.cut_at(k, need, sum(max(0.0, b.nbytes - through(b)) for b in late))

    def book(self, u: FetchUnit) -> None:
        """Send one request when the device would (a free slot of ``inflight``, its gate shard started)."""
        link = self.link
        gate = self.sched.gate(u)
        opens = self.starts[gate] if gate is not None else 0.0
        slot = self.booked[-link.inflight].t_arr if len(self.booked) >= link.inflight else 0.0
        t_req = self.last_request = max(opens, slot, self.last_request)
        self._observe_until(t_req)  # transfers completed by now
        action = self.sched.request(u, t_req)
        if action is None:  # a fallback already gave its shard a cache
            return
        self.tl.requested(action.record)
        if isinstance(action, UseHeld):
            held = action.held
            self.booked.append(_Booked(action.unit, held.level, held.ranges, action.record, t_req, t_req, t_req, 0,
                                       on_device=held, from_device=True))
            return
        nbytes = action.nbytes
        begin = link.begin(t_req, self.link_free, action.ranges)
        t_arr = self.link_free = link.arrival(nbytes, t_req, self.link_free, action.ranges)
        b = _Booked(action.unit, action.level, action.ranges, action.record, t_req, begin, t_arr, nbytes,
                    on_device=action.held)
        self.booked.append(b)
        self.unseen.append(b)

    def settle(self, b: _Booked, need: float) -> None:
        """Execution reaches ``b``'s shard at ``need``: cut it short if it is still in flight (anytime)."""
        b.used = (b.level, len(b.ranges))
        if b.from_device:
            pass
        elif b.on_device is not None and b.t_arr > need:  # the upgrade is late: the prefetched level instead
            self._drop([b], need, used_level=b.on_device.level.label)
            b.t_arr, b.from_device, b.dropped = need, True, False  # (its transfer is dropped, not the unit)
            b.used = (b.on_device.level, len(b.on_device.ranges))
        elif self.anytime and b.t_arr > need:
            b.used = self._cut(b, need)
        if self.fallback is None:
            self.finalize(b)

    def finalize(self, b: _Booked) -> None:
        """Rebuild what ``b`` uses."""
        level, k = b.used
        ranges = b.on_device.ranges if b.from_device else b.ranges[:k]
        if self.rebuild_model is not None:
            kv, rebuild_s = {}, self.rebuild_model(b.unit, level)
        else:
            blobs = b.on_device.parts if b.from_device else self.fetch(ranges)
            t0 = self.timer()
            kv = (self.encoding.decode(b.unit, level, blobs) if b.from_device or k == len(b.ranges)
                  else self.encoding.decode_prefix(b.unit, level, ranges, blobs))
            rebuild_s = self.timer() - t0
        t_ready = self._rebuild_done(b.t_arr, rebuild_s)
        self.unseen_rebuilds.append((t_ready, level.work, rebuild_s))
        shard = b.unit.needed_by
        self.sched.rebuilt(shard, level, rebuild_s)
        self.ready[shard] = max(self.ready[shard], t_ready)
        if self.keep:
            self.cache.update(kv)
        self.tl.arrived(b.rec, b.t_arr, b.t_arr - b.t_req, ranges)
        self.tl.rebuilt(b.rec, t_ready)
        self.held.append((b.t_req, t_ready, b.nbytes))
        kv_bytes = sum(x.nbytes + y.nbytes for x, y in kv.values())
        self.kv_bytes[shard] = self.kv_bytes.get(shard, 0) + kv_bytes
        self.rebuilt.setdefault(shard, []).append((t_ready, kv_bytes))

    def _rebuild_done(self, t_arr: float, rebuild_s: float) -> float:
        """When a rebuild of ``rebuild_s`` whose bytes are through at ``t_arr`` is done: the reconstructor
        works in order; the part that does not overlap execution also waits for the executor's core."""
        done = max(t_arr, self.rebuild_free) + rebuild_s
        if self.rebuild_overlap < 1.0:
            self.core_free = max(t_arr, self.core_free) + (1.0 - self.rebuild_overlap) * rebuild_s
            done = max(done, self.core_free)
        self.rebuild_free = done
        return done

    def _fall_back(self, k: int, need: float, mine: list[_Booked]) -> bool:
        """While shard ``k`` would wait (from ``need`` until its last transfer is through), ask the scheduler
        every ``CHECK_EVERY_S`` as the device would; True when a fallback fired (its transfers are dropped)."""
        until = max((b.t_arr for b in mine), default=need)
        start = self.link.start_s
        t = need + CHECK_EVERY_S  # the executor's first look, as on the real clock
        while t < until:
            self._observe_until(t)
            flights = [in_flight(self.link.trace, start + b.begin, start + t, b.nbytes, b.nbytes)
                       for b in mine if b.t_arr > t]
            choice = self.sched.waiting(k, t, flights)
            if choice.kind != WAIT:
                self._drop([b for b in mine if not b.from_device], t)
                self.tl.fallback(choice.kind, k, t, choice.ends)
                if choice.kind == "local":
                    self.local_at = (k, t)
                    self.tl.extras["local_from_step"] = choice.local_from_step
                elif choice.kind == "recompute":
                    self._recompute(choice, t, t + self.fallback.full_step_s)
                else:
                    self._reuse(k, choice.reuse_from, t + self.sched.rebuild_s[k])
                return True
            t += CHECK_EVERY_S
        return False

    def _observe_until(self, t: float) -> None:
        while self.unseen and self.unseen[0].t_arr <= t:
            b = self.unseen.pop(0)
            self.sched.transferred(max(b.nbytes, b.through_at_cut), b.t_req, b.t_arr, b.begin)
        seen = [x for x in self.unseen_rebuilds if x[0] <= t]  # the device knows a rebuild's time once done
        for _, work, seconds in sorted(seen):
            self.sched.rebuild_timed(work, seconds)
        self.unseen_rebuilds = [x for x in self.unseen_rebuilds if x[0] > t]

    def _drop(self, mine: list[_Booked], t: float, used_level: str = "") -> None:
        """``mine``'s transfers stop at ``t`` (what came through is wasted); later ones move up."""
        start = self.link.start_s
        for b in mine:
            b.dropped = True
            got = self.link.trace.bytes_between(start + b.begin, start + t) if t > b.begin else 0.0
            b.nbytes, b.t_arr = int(min(b.nbytes, got)), min(b.t_arr, max(t, b.begin))
            self.tl.dropped(b.rec, b.nbytes, t, used_level)
            if b in self.unseen:
                self.unseen.remove(b)
                if b.nbytes:  # what came through tells the monitor the link's rate, as on the real clock
                    self.sched.transferred(b.nbytes, b.t_req, b.t_arr, b.begin)
        self._rebook(self.done, t)

    def _rebook(self, first: int, free: float) -> None:
        """The link is free from ``free`` on: requests from ``booked[first]`` that still use it move up."""
        for later in self.booked[first:]:
            if later.from_device or later.dropped:
                continue
            later.begin = self.link.begin(later.t_req, free, later.ranges)
            later.t_arr = free = self.link.arrival(later.nbytes, later.t_req, free, later.ranges)
        self.link_free = free

    def _reuse(self, k: int, prev: int, ready: float) -> None:
        """Shard ``k`` runs on the K/V its layers had one step earlier (shard ``prev``)."""
        self.ready[k] = self.rebuild_free = max(ready, self.rebuild_free)
        self.rebuilt.setdefault(k, []).append((ready, self.kv_bytes.get(prev, 0)))
        self.kv_bytes[k] = self.kv_bytes.get(prev, 0)
        step = self.compute.shards[k][0]
        for (s, layer), kv in list(self.cache.items()):
            if s == step - 1 and self.compute.shards[prev][1] <= layer < self.compute.shards[prev][2]:
                self.cache[(step, layer)] = kv

    def _recompute(self, choice: FallbackChoice, t: float, ready: float) -> None:
        """At ``t`` the device starts computing step 0's K/V itself (one full forward, done at ``ready``):
        the waited-on shard and the rest of step 0 need no transfer; what was asked for them is dropped."""
        mine = choice.shards
        self._drop([b for b in self.booked[self.done:] if b.unit.needed_by in mine and not b.dropped], t)
        kv = self.recompute() if self.recompute is not None and self.keep else {}
        for j in mine:
            _, l0, l1 = self.compute.shards[j]
            part = {key: pair for key, pair in kv.items() if l0 <= key[1] < l1}
            self.cache.update(part)
            self.ready[j] = ready
            self.rebuilt.setdefault(j, []).append((ready, sum(x.nbytes + y.nbytes for x, y in part.values())))

    def _local_end(self) -> float:
        """A local fallback at shard k, time t: the rest of the edit on every token, from k's step."""
        k, t = self.local_at
        fb = self.fallback
        return t + (fb.num_steps - fb.shard_step[k]) * fb.full_step_s

    def _cut(self, b: _Booked, need: float) -> tuple[Level, int]:
        """The best prefix through the link by ``need`` (or the smallest, when it comes); the link then
        carries the later requests' bytes from the cut on."""
        prefixes = self.encoding.prefixes(b.unit, b.level, b.ranges)
        if len(prefixes) < 2:
            return b.level, len(b.ranges)
        start = self.link.start_s
        sizes = np.cumsum([0] + [n for _, n in b.ranges])
        k, t_cut = cut_point(self.link.trace, start + b.begin, start + need, sizes, [k for _, k in prefixes])
        level, t_cut = next(lv for lv, n in prefixes if n == k), t_cut - start
        if t_cut >= b.t_arr:
            return b.level, len(b.ranges)
        b.through_at_cut = int(self.link.trace.bytes_between(start + b.begin, start + t_cut))
        b.t_arr, b.nbytes = t_cut, int(sizes[k])
        self.tl.cut(b.rec, level.label, b.nbytes, t_cut, level.rung)
        self._rebook(self.done + 1, t_cut)  # (b is booked[done]) the later bytes move up behind the cut
        return level, k


def peak_concurrent(intervals: list[tuple[float, float, int]]) -> int:
    events = sorted([(a, n) for a, _, n in intervals] + [(b, -n) for _, b, n in intervals],
                    key=lambda e: (e[0], e[1]))  # frees before allocations at the same instant
    cur = peak = 0
    for _, n in events:
        cur += n
        peak = max(peak, cur)
    return peak


def simulate_masked(system: str, compute: ComputeProfile) -> Timeline:
    """A masked run with the whole cache already on the device (``oracle``): measured compute, no stalls."""
    tl = Timeline.for_shards(system, "sim", compute.shards)
    t = compute.prelude_s
    for j, c in enumerate(compute.shard_s):
        tl.shard_started(j, t)
        tl.shard_ended(j, t + c)
        t += c
    tl.latency_s = t
    return tl
