"""Measured device compute: per-shard execution times of a masked run, and local full generation.

The simulated clock replays these measurements; it never assumes compute times.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field, replace

from sakura.kvcache import KVCache, shard_plan
from sakura.model import DiTAdapter, EditRequest

# Repeated local-generation runs further apart than this ((max − min) / median) are not trusted as the machine's
# calibration; an edit's compute further than this (or the calibration's own spread) from it ran on a busy machine.
SPREAD_BOUND = 0.10


@dataclass
class ComputeProfile:
    shards: list[tuple[int, int, int]]  # (step, layer_start, layer_end) in execution order
    shard_s: list[float]  # execution time of each shard (the last one includes the final decode)
    prelude_s: float  # text encoding, embeddings: before the first shard can start
    local_full_s: float  # the whole model on every token (the `local` baseline)
    local_full_samples: list[float] = field(default_factory=list)  # every measured run (its spread)

    @property
    def masked_s(self) -> float:
        return self.prelude_s + sum(self.shard_s)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_timeline(cls, tl, local_full_s: float = 0.0) -> "ComputeProfile":
        """The compute a real run actually did (stalls removed): for replaying that run on the
        simulated clock."""
        shards = [(r.step, *r.layers) for r in tl.shards]
        first = tl.shards[0]
        return cls(shards, [r.exec_end_t - r.exec_start_t for r in tl.shards], first.exec_start_t - first.stall_s,
                   local_full_s)

    def as_run(self, tl) -> "ComputeProfile":
        """The compute a real run of this profile's edit did (stalls removed), this profile's where it did not run
        (the shards after a local fallback): what replaying that run on the simulated clock executes."""
        ran = {r.shard: r.exec_end_t - r.exec_start_t for r in tl.shards
               if r.exec_start_t is not None and r.exec_end_t is not None}
        first = tl.shards[0] if tl.shards else None
        prelude = (first.exec_start_t - first.stall_s if first is not None and first.exec_start_t is not None
                   else self.prelude_s)
        return replace(self, shard_s=[ran.get(j, s) for j, s in enumerate(self.shard_s)], prelude_s=prelude)

    def scaled(self, factor: float) -> "ComputeProfile":
        """The same edit on a device ``factor`` times slower (paper-scale projections)."""
        return ComputeProfile(self.shards, [s * factor for s in self.shard_s], self.prelude_s * factor,
                              self.local_full_s * factor, [s * factor for s in self.local_full_samples])



@dataclass(frozen=True)
class ComputeCheck:
    """A real-clock edit's own compute against what calibration measured for the same work: a machine
    busy with something else during the edit shows as measured compute outside the calibration's spread,
    and then its latency measures the machine, not the system."""

    measured_s: float
    calibrated_s: float
    tolerance: float  # relative: the calibration's spread, at least SPREAD_BOUND

    @property
    def ratio(self) -> float:
        return self.measured_s / self.calibrated_s if self.calibrated_s > 0 else float("nan")

    @property
    def busy(self) -> bool:
        return self.calibrated_s > 0 and abs(self.ratio - 1.0) > self.tolerance

    def to_dict(self) -> dict:
        return {"measured_s": round(self.measured_s, 4), "calibrated_s": round(self.calibrated_s, 4),
                "ratio": round(self.ratio, 3), "tolerance": round(self.tolerance, 3), "busy": self.busy}

    @classmethod
    def of(cls, timeline, compute: ComputeProfile, runs_locally: bool) -> "ComputeCheck | None":
        """For a real-clock timeline: local generation against the calibrated local time, or the shards
        that executed against their calibrated times (stalls are not compute). None when nothing executed
        that calibration timed (a simulated timeline, a stream that went local before its first shard)."""
        if timeline.clock != "real":
            return None
        tol = max(SPREAD_BOUND, spread(compute.local_full_samples) or 0.0)
        if runs_locally:
            return cls(timeline.latency_s, compute.local_full_s, tol) if compute.local_full_s > 0 else None
        ran = [(r.exec_end_t - r.exec_start_t, compute.shard_s[r.shard]) for r in timeline.shards
               if r.exec_start_t is not None and r.exec_end_t is not None and r.shard < len(compute.shard_s)]
        if not ran or "local_from_step" in timeline.extras:
            return None
        return cls(sum(m for m, _ in ran), sum(c for _, c in ran), tol)


def spread(xs: list[float]) -> float | None:
    """(max − min) / median of repeated timings; None for fewer than two."""
    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) > 1 else None


def shard_times(layer_times: list[tuple[int, int, float]], t0: float, t1: float,
                shards: list[tuple[int, int, int]]) -> tuple[float, list[float]]:
    """Split a masked run into shard execution times from when each layer asked for its K/V."""
    first = {(s, l): t for s, l, t in layer_times}
    starts = [first[(s, a)] for s, a, _ in shards]
    ends = starts[1:] + [t1]
    return starts[0] - t0, [e - s for s, e in zip(starts, ends)]


def zero_cache(adapter: DiTAdapter, req: EditRequest) -> KVCache:
    """A cache of zeros with the template's geometry: compute time does not depend on K/V values, so
    a device can calibrate its shard times before it holds any cache."""
    import torch

    reuse = torch.nonzero(~adapter.token_mask(req.mask)).flatten()
    cache = KVCache(adapter.num_steps, adapter.num_layers, adapter.heads, adapter.head_dim, reuse)
    zeros = torch.zeros(len(reuse), cache.dim)
    for s in range(adapter.num_steps):
        for layer in range(adapter.num_layers):
            cache.k[(s, layer)] = cache.v[(s, layer)] = zeros
    return cache


def measure_compute(adapter: DiTAdapter, req: EditRequest, cache: KVCache, shard_size: int,
                    repeats: int = 3, full_repeats: int | None = None) -> ComputeProfile:
    """Median over ``repeats`` runs (after one warm-up) of masked-run shard times, and over
    ``full_repeats`` (default ``repeats − 1``, at least 1) of the full-run time."""
    shards = shard_plan(adapter.num_steps, adapter.num_layers, shard_size)
    provider = cache.provider()
    adapter.masked_edit(req, provider)  # warm-up
    preludes, per_shard = [], []
    for _ in range(repeats):
        res = adapter.masked_edit(req, provider)
        pre, times = shard_times(res.extras["layer_times"], res.extras["t0"], res.extras["t1"], shards)
        preludes.append(pre)
        per_shard.append(times)
    full = [adapter.full_edit(req).seconds for _ in range(full_repeats or max(1, repeats - 1))]
    return ComputeProfile(shards, [statistics.median(col) for col in zip(*per_shard)],
                          statistics.median(preludes), statistics.median(full), full)


def measure_executor_compute(executor, req: EditRequest, cache: KVCache, base: ComputeProfile,
                             repeats: int = 3) -> ComputeProfile:
    """``base`` with its masked run's shard times measured through ``executor`` (exported programs run at
    their own speed), timed as the real clock times them: from each shard's first K/V request. Local
    generation stays ``base``'s (it runs the eager model)."""
    shards = base.shards
    shard_size = shards[0][2] - shards[0][1]
    provider = cache.provider()

    def timed_run() -> tuple[float, list[float]]:
        asked: list[tuple[int, int, float]] = []

        def timed(step: int, layer: int):
            asked.append((step, layer, time.perf_counter()))
            return provider(step, layer)

        t0 = time.perf_counter()
        executor.run_masked_edit(req, timed, shard_size)
        return shard_times(list(reversed(asked)), t0, time.perf_counter(), shards)  # (first request wins)

    timed_run()  # warm-up
    runs = [timed_run() for _ in range(max(1, repeats))]
    return replace(base, shard_s=[statistics.median(col) for col in zip(*(r[1] for r in runs))],
                   prelude_s=statistics.median(r[0] for r in runs))
