"""The simulated clock: a discrete-event replay of one streamed edit over a bandwidth trace.

Three stages, as on the device: the receiver fetches fetch units in order (one request in flight,
at most ``ahead`` shards ahead of execution), the reconstructor rebuilds them in order, the
executor runs shards in order and stalls when a shard's cache is not rebuilt yet. Compute and
rebuild times are *measured* (ComputeProfile, and the real decode of the chosen bytes), the link
is the trace integral. Policies see only what a device would know at request time: the monitor's
rate and a deadline predicted from measured shard times and current progress.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from sakura.net.traces import Trace
from sakura.online.encoding import KV, FetchUnit, StreamEncoding
from sakura.online.monitor import RuntimeMonitor
from sakura.online.policies import Policy
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.timeline import ShardRecord, Timeline, UnitRecord

Fetch = Callable[[list[tuple[int, int]]], list[bytes]]


@dataclass
class LinkModel:
    trace: Trace
    start_s: float  # offset into the trace where the edit starts
    request_overhead_s: float = 0.002  # one request's round trip on top of the payload time

    def transfer_s(self, nbytes: int, at: float) -> float:
        return self.request_overhead_s + self.trace.time_to_send(nbytes, self.start_s + at + self.request_overhead_s)

    def rate_bps_at(self, at: float) -> float:
        return float(self.trace.rate_at(self.start_s + at)) * 1e6


def predict_need(shard: int, now: float, compute: ComputeProfile, starts: list[float | None]) -> float:
    """When execution will reach ``shard``, as the device would predict it at ``now``: the shard in
    progress finishes on its measured time, later ones take their measured times, no stalls."""
    t, c = compute.prelude_s, compute.shard_s
    for k in range(shard):
        s = starts[k]
        if s is None or s > now:  # not started yet: waiting on data (or in the prelude)
            return max(now, t) + sum(c[k:shard])
        t = s + c[k]
    return max(now, t)


def simulate(encoding: StreamEncoding, policy: Policy, compute: ComputeProfile, link: LinkModel,
             fetch: Fetch | None, ahead: int = 2, keep: bool = True,
             rebuild_model: Callable[[FetchUnit, object], float] | None = None,
             predicted: ComputeProfile | None = None,
             timer: Callable[[], float] = time.perf_counter) -> tuple[Timeline, KV]:
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
    tl = Timeline(policy.name, "sim", trace_start_s=link.start_s)
    tl.shards = [ShardRecord(j, s, (a, b)) for j, (s, a, b) in enumerate(compute.shards)]
    cache: KV = {}

    def run_until(j: int) -> None:  # execution schedule of shards ≤ j (their data is all known)
        for k in range(j + 1):
            if starts[k] is None:
                prev_end = compute.prelude_s if k == 0 else ends[k - 1]
                starts[k] = max(prev_end, ready[k])
                ends[k] = starts[k] + compute.shard_s[k]
                tl.shards[k].exec_start_t, tl.shards[k].exec_end_t = starts[k], ends[k]
                tl.shards[k].stall_s = max(0.0, ready[k] - prev_end)

    monitor = RuntimeMonitor(initial_bps=link.rate_bps_at(0.0))
    policy.begin(units, predicted.masked_s, monitor.initial_bps)
    recv_free = rebuild_free = 0.0
    pre = encoding.preamble_ranges()
    if pre:  # fetched once before the first unit (CacheGen's entropy models)
        nbytes = sum(n for _, n in pre)
        recv_free = link.transfer_s(nbytes, 0.0)
        monitor.record_transfer(nbytes, recv_free)
        if fetch is not None:
            encoding.set_preamble(fetch(pre))
        tl.extras["preamble_bytes"] = nbytes
    received: list[tuple[float, float, int]] = []  # (from, to, bytes): bytes in flight or waiting to rebuild
    rebuilt_held: list[tuple[float, int, int]] = []  # (from, shard, bytes): rebuilt K/V, freed when the shard ends
    for u in units:
        run_until(u.needed_by - 1)
        gate = starts[u.needed_by - ahead] if u.needed_by - ahead >= 0 else 0.0
        t_req = max(recv_free, gate)
        deadline = predict_need(u.needed_by, t_req, predicted, starts)
        d = policy.choose(u, t_req, deadline, monitor)
        t_arr = t_req + link.transfer_s(d.level.nbytes, t_req)
        monitor.record_transfer(d.level.nbytes, t_arr - t_req)
        recv_free = t_arr
        ranges = encoding.ranges(u, d.level)
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
        monitor.record_arrival(t_ready, deadline)
        rebuilt = sum(k.nbytes + v.nbytes for k, v in kv.values())
        if keep:
            cache.update(kv)
        tl.units.append(UnitRecord(u.index, u.needed_by, u.label, d.level.label, d.level.nbytes, d.budget_bytes,
                                   d.window_s, d.rate_bps / 1e6, d.fits, t_req, t_arr, t_ready, deadline,
                                   ranges=len(ranges)))
        received.append((t_req, t_ready, d.level.nbytes))
        rebuilt_held.append((t_ready, u.needed_by, rebuilt))
    run_until(nshards - 1)
    for rec in tl.units:
        rec.needed_t = starts[rec.needed_by]
    intervals = received + [(a, ends[shard], n) for a, shard, n in rebuilt_held]
    tl.peak_cache_bytes = peak_concurrent(intervals)
    tl.latency_s = ends[-1]
    tl.bytes_total = sum(r.nbytes for r in tl.units) + tl.extras.get("preamble_bytes", 0)
    return tl, cache


def peak_concurrent(intervals: list[tuple[float, float, int]]) -> int:
    events = sorted([(a, n) for a, _, n in intervals] + [(b, -n) for _, b, n in intervals],
                    key=lambda e: (e[0], e[1]))  # frees before allocations at the same instant
    cur = peak = 0
    for _, n in events:
        cur += n
        peak = max(peak, cur)
    return peak


def simulate_local(system: str, compute: ComputeProfile) -> Timeline:
    """`local` (full model, no cache) and `oracle` (FP16 cache already on the device)."""
    tl = Timeline(system, "sim")
    if system == "local":
        tl.latency_s = compute.local_full_s
        return tl
    t = compute.prelude_s
    for j, ((s, a, b), c) in enumerate(zip(compute.shards, compute.shard_s)):
        tl.shards.append(ShardRecord(j, s, (a, b), t, t + c, 0.0))
        t += c
    tl.latency_s = t
    return tl
