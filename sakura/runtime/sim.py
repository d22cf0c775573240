"""The simulated clock: a discrete-event replay of one streamed edit over a bandwidth trace.

Three stages, as on the device: the receiver fetches fetch units in order (up to ``inflight``
requests outstanding, at most ``ahead`` shards ahead of execution), the reconstructor rebuilds them in order, the
executor runs shards in order and stalls when a shard's cache is not rebuilt yet. Compute and
rebuild times are *measured* (ComputeProfile, and the real decode of the chosen bytes), the link
is the trace integral. Policies see only what a device would know at request time: the monitor's
rate and a deadline predicted from measured shard times and current progress.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from sakura.formats import KV, FetchUnit, StreamEncoding
from sakura.net.paced import DEFAULT_INFLIGHT, DEFAULT_REQUEST_OVERHEAD_S
from sakura.net.traces import Trace
from sakura.online.deadline import predict_need
from sakura.online.monitor import DEFAULT_ESTIMATOR, RuntimeMonitor
from sakura.online.policies import Policy
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.timeline import Timeline, UnitRecord

Fetch = Callable[[list[tuple[int, int]]], list[bytes]]


@dataclass
class LinkModel:
    """The link as the simulated clock sees it: a FIFO pipe following the trace. A request's bytes start
    ``request_overhead_s`` after it is sent (its round trip, measured on the real clock and kept with
    the calibration) or when the previous request's bytes are through, whichever is later; up to
    ``inflight`` requests may be outstanding, so with ≥ 2 the round trips hide behind transfers."""

    trace: Trace
    start_s: float  # offset into the trace where the edit starts
    request_overhead_s: float = DEFAULT_REQUEST_OVERHEAD_S
    inflight: int = DEFAULT_INFLIGHT

    def arrival(self, nbytes: int, t_request: float, link_free: float) -> float:
        """When the last byte of a request sent at ``t_request`` arrives."""
        begin = max(t_request + self.request_overhead_s, link_free)
        return begin + self.trace.time_to_send(nbytes, self.start_s + begin)

    def rate_bps_at(self, at: float) -> float:
        return float(self.trace.rate_at(self.start_s + at)) * 1e6


def simulate(encoding: StreamEncoding, policy: Policy, compute: ComputeProfile, link: LinkModel,
             fetch: Fetch | None, ahead: int = 2, keep: bool = True,
             rebuild_model: Callable[[FetchUnit, object], float] | None = None,
             predicted: ComputeProfile | None = None,
             timer: Callable[[], float] = time.perf_counter,
             estimator: str = DEFAULT_ESTIMATOR) -> tuple[Timeline, KV]:
    """Run one edit on the simulated clock. Returns its timeline and the rebuilt cache (for quality).

    Rebuild times are measured by decoding the chosen bytes for real; with ``rebuild_model`` (and no
    ``fetch``) nothing is decoded and the model gives the time (paper-scale projections).
    ``predicted`` is what the device believes about its compute (default: ``compute`` itself); replaying
    a real run passes the profile the real runtime predicted with and the compute it really did.
    ``timer`` measures the decodes; use the clock the compute profile was measured on."""
    predicted = predicted or compute
    encoding = encoding.fresh()
    units: list[FetchUnit] = encoding.units
    nshards = len(compute.shards)
    starts: list[float | None] = [None] * nshards
    ends: list[float | None] = [None] * nshards
    ready = [0.0] * nshards
    tl = Timeline.for_shards(policy.name, "sim", compute.shards, trace_start_s=link.start_s)
    cache: KV = {}

    def run_until(j: int) -> None:  # execution schedule of shards ≤ j (their data is all known)
        for k in range(j + 1):
            if starts[k] is None:
                prev_end = compute.prelude_s if k == 0 else ends[k - 1]
                starts[k] = max(prev_end, ready[k])
                ends[k] = starts[k] + compute.shard_s[k]
                tl.shard_started(k, starts[k], max(0.0, ready[k] - prev_end))
                tl.shard_ended(k, ends[k])

    monitor = RuntimeMonitor(initial_bps=link.rate_bps_at(0.0), estimator=estimator)
    policy.begin(units, predicted.masked_s, monitor.initial_bps)
    link_free = rebuild_free = last_request = 0.0
    arrivals: list[float] = []  # per request, when its last byte arrived (in request order)
    unseen: list[tuple[float, int, float]] = []  # (arrival, bytes, request time) the monitor has not seen yet
    received: list[tuple[float, float, int]] = []  # (from, to, bytes): bytes in flight or waiting to rebuild
    rebuilt_held: list[tuple[float, int, int]] = []  # (from, shard, bytes): rebuilt K/V, freed when the shard ends
    for u in units:
        run_until(u.needed_by - 1)
        gate = starts[u.needed_by - ahead] if u.needed_by - ahead >= 0 else 0.0
        slot = arrivals[-link.inflight] if len(arrivals) >= link.inflight else 0.0
        t_req = last_request = max(gate, slot, last_request)
        while unseen and unseen[0][0] <= t_req:  # transfers completed by now
            t_arr, n, t_sent = unseen.pop(0)
            monitor.observe(n, t_sent, t_arr)
        u = encoding.priced(u)
        deadline = predict_need(u.needed_by, t_req, predicted, starts)
        d = policy.choose(u, t_req, deadline, monitor)
        ranges = encoding.ranges(u, d.level)
        nbytes = sum(n for _, n in ranges)
        t_arr = link_free = link.arrival(nbytes, t_req, link_free)
        arrivals.append(t_arr)
        unseen.append((t_arr, nbytes, t_req))
        if rebuild_model is not None:
            kv, rebuild_s = {}, rebuild_model(u, d.level)
        else:
            blobs = fetch(ranges)
            t0 = timer()
            kv = encoding.decode(u, d.level, blobs)
            rebuild_s = timer() - t0
        t_ready = max(t_arr, rebuild_free) + rebuild_s
        rebuild_free = t_ready
        ready[u.needed_by] = max(ready[u.needed_by], t_ready)
        rebuilt = sum(k.nbytes + v.nbytes for k, v in kv.values())
        if keep:
            cache.update(kv)
        rec = UnitRecord(u.index, u.needed_by, u.label, d.level.label, nbytes, d.budget_bytes, d.window_s,
                         d.rate_bps / 1e6, d.fits, t_req, deadline_t=deadline, ranges=len(ranges))
        tl.requested(rec)
        tl.arrived(rec, t_arr, t_arr - t_req, ranges)
        tl.rebuilt(rec, t_ready)
        received.append((t_req, t_ready, nbytes))
        rebuilt_held.append((t_ready, u.needed_by, rebuilt))
    run_until(nshards - 1)
    for rec in tl.units:
        rec.needed_t = starts[rec.needed_by]
    intervals = received + [(a, ends[shard], n) for a, shard, n in rebuilt_held]
    tl.peak_cache_bytes = peak_concurrent(intervals)
    tl.latency_s = ends[-1]
    tl.bytes_total = sum(r.nbytes for r in tl.units)
    return tl, cache


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
