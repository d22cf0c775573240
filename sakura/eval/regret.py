"""Regret in the bench (issue #32): each streamed edit against the clairvoyant optimum of its own system.

For one edit of one streaming system on the simulated clock this module builds the planner's problem
(:mod:`sakura.eval.optimal`) from the same session — the scaled trace from the same offset, the same
link model, the calibrated compute, the system's own stored levels and fallbacks — and records

* ``latency_ratio``: the run's latency over the least latency of a schedule whose every unit is at
  least as good as the run's (problem (a));
* ``error_gap``: the run's total estimated error less the least reachable within the run's latency
  (problem (b)), and ``psnr_gap_db``: the masked PSNR of that schedule's output less the run's —
  the optimal schedules are *replayed* (their cache assembled from the stored bytes they name, reuse /
  recompute / local as the runtime does them, then the masked edit), so their quality is measured, not
  estimated; ``psnr_gap_visible_db``: the same with each PSNR counted at most at ``DISPLAY_PSNR_DB`` (two
  outputs both closer to the reference than an 8-bit display's own rounding differ by nothing one can see);
* the planner's exactness (and gap, where it stopped early).

Estimated error per unit: the stored per-level error of the SAKURA pack; for IntQ and CacheGen, whose
stored errors only order their levels, the measured ones (:mod:`sakura.offline.level_errors`); a reuse
adds the pack's ``step_error``; a recompute is exact. Where the SAKURA pack stores output weights
(:mod:`sakura.offline.output_weights`) every unit's error, of every format, is its shard's weight times it —
the summed error then predicts the output's masked MSE — and going local counts the pack's local masked MSE
shared over the units; without them going local counts ``LOCAL_ERROR`` per unit.
Rebuild times: a per-format fit ``a + b·work`` (``b·bytes`` where levels carry no work) to decodes timed
on the thread's CPU clock, once per template.

:class:`PerfectPrediction` reruns a policy with the true future rate (the trace's mean over each unit's
transfer window) in place of the monitor's estimate: SAKURA's latency over it is the estimator's share
of the regret, the rest is the policy's.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from sakura.eval.optimal import PlanResult, least_error, least_latency
from sakura.eval.plan_model import LOCAL, RECOMPUTE, REUSE, STREAM, PlanProblem, PlanUnit, Schedule, UnitOption
from sakura.formats import KV, Level, StreamEncoding, file_id
from sakura.model import LocalSwitch
from sakura.net.refs import resolving
from sakura.offline.level_errors import MEASURED, load_level_errors, measure_level_errors, write_level_errors
from sakura.online.plan import DISPLAY_MSE
from sakura.online.policies import Policy
from sakura.runtime.calibration import REBUILD_SAMPLE_LEVELS, fit_affine, time_decodes
from sakura.runtime.timeline import Timeline

# Going local counts this per unit, in the pack's metric: local generation computes every token's K/V
# exactly, so what separates its output from the reference is reuse itself, not compression (fs-astronaut:
# 43 dB masked PSNR going local at step 0, 50 dB at step 1, where SAKURA's smallest levels give 28 dB).
# Just above 0, so a unit that streamed exact bytes (FP16, a recompute) is not matched by going local.
# (The replayed outputs measure it exactly; a first try at 1.0 made (b) trade local for 33 dB CacheGen levels.)
LOCAL_ERROR = 1e-4
PERFECT = "sakura+perfect"
# The masked PSNR of rounding an image to 8 bits (uniform error, RMS 1/√12 of a level): ≈ 58.9 dB. An output
# above it is closer to the reference than the display can show.
DISPLAY_PSNR_DB = -10 * math.log10(DISPLAY_MSE)
LABEL_LEVELS = 8  # a format with at most this many labels is timed at every level (the device's calibration sample)


@dataclass(frozen=True)
class RebuildFit:
    """A level's rebuild seconds: the mean timed decode of its label where a format has few labels (IntQ,
    CacheGen, FP16: every unit has the same geometry, and decode time is not linear in bytes across bit
    widths), else ``base_s + per_s · x`` (x = its work, or its bytes where no level has work)."""

    base_s: float
    per_s: float
    basis: str  # "label" | "work" | "bytes"
    samples: int
    by_label: tuple[tuple[str, float], ...] = ()

    def seconds(self, level: Level) -> float:
        if self.basis == "label":
            return dict(self.by_label).get(level.label, self.base_s)
        x = level.work if self.basis == "work" else level.nbytes
        return self.base_s + self.per_s * x


@dataclass
class FormatInputs:
    """What the planner needs of one stored format of a template (measured once per process)."""

    level_errors: dict[int, dict[str, float]] | None  # measured per unit and level (None: the stored ones)
    rebuild: RebuildFit
    step_error: dict[int, float | None]  # per shard: the reuse fallback's added error (the SAKURA pack's)
    shard_weight: dict[int, float] = field(default_factory=dict)  # per shard: the SAKURA pack's output weight
    local_mse: float | None = None  # the SAKURA pack's local masked MSE (with the weights)

    def error(self, unit_index: int, level: Level) -> float:
        if self.level_errors is not None:
            return self.level_errors[unit_index].get(level.label, level.error)
        return level.error

    def weight(self, shard: int) -> float:
        return self.shard_weight.get(shard, 1.0)

    def local_error(self, units: int) -> float:
        """Going local, per unit: the local masked MSE shared over the edit's units (``LOCAL_ERROR`` unweighted)."""
        return self.local_mse / max(1, units) if self.shard_weight and self.local_mse is not None else LOCAL_ERROR


def fit_rebuild(encoding: StreamEncoding, read: Callable, timer: Callable[[], float] = time.thread_time) -> RebuildFit:
    """Time the decode of a sample of levels (the device calibration's) and fit ``a + b·x`` (least squares,
    both ≥ 0)."""
    units = encoding.units
    labels = {lv.label for u in units for lv in u.levels}
    per_label = len(labels) <= LABEL_LEVELS
    basis = "label" if per_label else "work" if any(lv.work > 0 for u in units for lv in u.levels) else "bytes"
    decodes = time_decodes(encoding, read, timer, levels_per_unit=None if per_label else REBUILD_SAMPLE_LEVELS)
    ys = [d.seconds for d in decodes]
    xs = [d.level.work if basis == "work" else d.level.nbytes for d in decodes]
    timed: dict[str, list[float]] = {}
    for d in decodes:
        timed.setdefault(d.level.label, []).append(d.seconds)
    if per_label:
        return RebuildFit(float(np.mean(ys)), 0.0, "label", len(ys),
                          tuple((label, float(np.mean(v))) for label, v in sorted(timed.items())))
    return RebuildFit(*fit_affine(xs, ys), basis, len(ys))


def format_inputs(prepared, system_format: str, say: Callable[[str], None] = print) -> FormatInputs:
    """The planner's inputs for one template and stored format, cached on ``prepared``."""
    cache = prepared.__dict__.setdefault("_planner_inputs", {})
    if system_format in cache:
        return cache[system_format]
    runtime, state, tid = prepared.runtime, prepared.state, prepared.template.id
    encoding = runtime.encoding(state, system_format)
    fid = file_id(tid, system_format)
    source = resolving(runtime.source, fid, encoding)  # (a level may read another file: the ladder's exact rung)

    def read(ranges):
        return source.fetch_timed(fid, ranges).parts

    errors = None
    if system_format in MEASURED:
        packs = getattr(prepared, "packs", None)
        errors = load_level_errors(packs, fid) if packs is not None and not isinstance(packs, str) else None
        if errors is None:
            say(f"{tid}: measuring {system_format}'s per-level errors (its pack predates them)")
            ref = prepared.fp16_kv
            importance = _importance(packs, tid)
            errors = measure_level_errors(encoding, read, lambda s, layer: ref[(s, layer)], importance)
            try:
                if packs is not None and not isinstance(packs, str):
                    write_level_errors(packs, fid, errors)
            except OSError:  # a read-only pack folder: measured again next time
                pass
    sakura = runtime.encoding(state, "sakura")
    step_error = {u.needed_by: sakura.step_error(u) for u in sakura.units}
    weights = {u.needed_by: u.weight for u in sakura.units} if sakura.output_weights() else {}
    inputs = FormatInputs(errors, fit_rebuild(encoding, read), step_error, weights, sakura.local_output_mse())
    cache[system_format] = inputs
    return inputs


def _importance(packs, template_id: str) -> dict | None:
    from sakura.offline.builder import load_importance  # (torch, safetensors)

    try:
        return load_importance(packs, template_id)
    except (OSError, TypeError):
        return None  # uniform weights


def plan_problem(session, inputs: FormatInputs, fallbacks: bool = True) -> PlanProblem:
    """The planner's problem for one edit session (its system's stored format, link, compute)."""
    enc = session.encoding.fresh()
    units = []
    for u in enc.units:
        priced = {lv.label: lv for lv in enc.fresh().priced(u).levels}  # side data as a first use pays it
        opts = []
        for lv in u.levels:
            side_bytes = priced[lv.label].nbytes - lv.nbytes
            opts.append(UnitOption(lv.label, lv.nbytes, inputs.weight(u.needed_by) * inputs.error(u.index, lv),
                                   inputs.rebuild.seconds(lv),
                                   lv.label if side_bytes > 0 else "", max(0, side_bytes)))
        units.append(PlanUnit(u.index, u.needed_by, tuple(opts)))
    c = session.compute
    steps = session.model.num_steps
    n = len(c.shards)
    local = fallbacks and session.executor is None
    return PlanProblem(tuple(units), tuple(c.shard_s), tuple(s for s, _, _ in c.shards), c.prelude_s, steps,
                       c.local_full_s / max(1, steps), session.link_model(), 2,
                       tuple(None if inputs.step_error.get(j) is None else inputs.weight(j) * inputs.step_error[j]
                             for j in range(n)),
                       allow_reuse=fallbacks and enc.redecodable, allow_recompute=local and enc.redecodable,
                       allow_local=local, local_error=inputs.local_error(len(units)))


def realized_errors(tl: Timeline, p: PlanProblem) -> dict[int, float]:
    """Per fetch unit: the estimated error of what the run used (its level after any cut, or a fallback's)."""
    local_from = min((f["shard"] for f in tl.fallbacks if f["kind"] == LOCAL), default=None)
    recomputed = {k for f in tl.fallbacks if f["kind"] == RECOMPUTE
                  for k in range(f["shard"], p.n) if p.shard_step[k] == p.shard_step[0]}
    reused = {f["shard"] for f in tl.fallbacks if f["kind"] == REUSE}
    records = {r.unit: r for r in tl.units}
    shard_error: dict[int, float] = {}
    out: dict[int, float] = {}
    for j in range(p.n):
        units = p.shard_units(j)
        for u in units:
            if local_from is not None and j >= local_from:
                out[u.index] = p.local_error
            elif j in recomputed:
                out[u.index] = 0.0
            elif j in reused:
                out[u.index] = (p.step_error[j] or 0.0) + shard_error.get(j - p.per_step, 0.0)
            else:
                rec = records.get(u.index)
                by_label = {o.label: o.error for o in u.options}
                out[u.index] = by_label.get(rec.level, max(by_label.values())) if rec else max(by_label.values())
        if units:
            shard_error[j] = sum(out[u.index] for u in units) / len(units)
    return out


def replay_output(session, req, p: PlanProblem, schedule: Schedule) -> np.ndarray:
    """The output of a planned schedule: its cache assembled from the stored bytes it names (reuse,
    recompute and local as the runtime does them), then the masked edit."""
    enc = session.encoding.fresh()
    by_index = {u.index: u for u in enc.units}
    shards = session.compute.shards
    kv: KV = {}
    local_from: int | None = None
    recomputed: KV | None = None
    for j, action in enumerate(schedule.actions):
        step, l0, l1 = shards[j]
        if action.kind == STREAM:
            for unit, label in zip(p.shard_units(j), action.levels):
                priced = enc.priced(by_index[unit.index])
                lv = next(x for x in priced.levels if x.label == label)
                ranges = enc.ranges(priced, lv)
                kv.update(enc.decode(priced, lv, session.source.fetch_timed(session.file_id, ranges).parts))
        elif action.kind == REUSE:
            for layer in range(l0, l1):
                kv[(step, layer)] = kv[(step - 1, layer)]
        elif action.kind == RECOMPUTE:
            if recomputed is None:
                recomputed = session.model.recompute_first_step(req)
            kv.update({key: pair for key, pair in recomputed.items() if key[0] == step and l0 <= key[1] < l1})
        else:
            local_from = step
            break

    def provider(step, layer):
        if local_from is not None and step >= local_from:
            raise LocalSwitch
        return kv[(step, layer)]

    return session.model.masked_edit(req, provider).image


@dataclass
class EditRegret:
    """One streamed edit against its system's clairvoyant optimum."""

    latency_s: float
    optimal_latency_s: float  # (a) at per-unit quality at least the run's
    latency_ratio: float
    error: float  # the run's total estimated error
    optimal_error: float  # (b) within ``latency_budget_s``
    error_gap: float
    psnr_masked: float
    optimal_psnr_masked: float  # (b)'s schedule, replayed
    psnr_gap_db: float
    equal_quality_psnr_masked: float  # (a)'s schedule, replayed
    exact: bool  # both optima proven
    gap: float  # the larger relative gap where a solve stopped early
    planner_s: float
    optimal_actions: list  # (a)'s schedule, per shard
    quality_source: str = "replayed"
    exact_latency: bool = True  # (a) proven
    exact_error: bool = True  # (b) proven
    gap_latency: float = 0.0
    gap_error: float = 0.0
    latency_budget_s: float = 0.0  # (b)'s: the run's latency, or (a)'s optimum where the model is slower
    equal_latency_actions: list = field(default_factory=list)  # (b)'s schedule, per shard
    psnr_gap_visible_db: float = math.nan  # psnr_gap_db with both PSNRs at most DISPLAY_PSNR_DB
    fastest_latency_s: float = math.nan  # the least latency at any quality (no unit bound; local counts)
    fastest_error: float = math.nan  # ... and that schedule's estimated error

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def edit_regret(session, req, request_key, timeline: Timeline, run_psnr_masked: float, inputs: FormatInputs,
                fallbacks: bool = True, budget_s: float = 20.0) -> EditRegret:
    """The regret of one run (its ``timeline`` and measured masked PSNR) against its own system's optimum."""
    p = plan_problem(session, inputs, fallbacks)
    used = realized_errors(timeline, p)
    t0 = time.perf_counter()
    a: PlanResult = least_latency(p, used, budget_s=budget_s)
    # Equal latency: the run's, or the model's least at the run's quality where the model cannot reach the
    # run's own latency (its timing differs from the simulated clock's by the rebuild estimates) — so (a)'s
    # schedule is always within it, and (b) never reads worse than the run for lack of a few milliseconds.
    latency_budget = max(timeline.latency_s, a.value if a.schedule else 0.0)
    b: PlanResult = least_error(p, latency_budget, budget_s=budget_s)
    if a.schedule is not None and (b.schedule is None or a.schedule.total_error < b.schedule.total_error):
        b = PlanResult(a.schedule, False, min(b.lower_bound, a.schedule.total_error), b.states, b.seconds, "error")
    fastest: PlanResult = least_latency(p, {}, budget_s=budget_s)  # no unit bound: how fast the edit could be
    planner_s = time.perf_counter() - t0

    def psnr(result: PlanResult) -> float:
        if result.schedule is None:
            return math.nan
        image = replay_output(session, req, p, result.schedule)
        return float(session.quality(image, req, request_key)["psnr_masked"])

    a_psnr, b_psnr = psnr(a), psnr(b)
    err = sum(used.values())
    return EditRegret(timeline.latency_s, a.value, timeline.latency_s / a.value if a.value > 0 else math.nan,
                      err, b.value if b.schedule else math.nan, err - b.value if b.schedule else math.nan,
                      run_psnr_masked, b_psnr, b_psnr - run_psnr_masked, a_psnr, a.exact and b.exact,
                      max(a.gap, b.gap), planner_s, a.schedule.to_dict()["actions"] if a.schedule else [],
                      exact_latency=a.exact, exact_error=b.exact, gap_latency=a.gap, gap_error=b.gap,
                      latency_budget_s=latency_budget,
                      equal_latency_actions=b.schedule.to_dict()["actions"] if b.schedule else [],
                      fastest_latency_s=fastest.value if fastest.schedule else math.nan,
                      fastest_error=fastest.schedule.total_error if fastest.schedule else math.nan,
                      psnr_gap_visible_db=visible_gap_db(b_psnr, run_psnr_masked))


def visible_gap_db(optimal_psnr: float | None, own_psnr: float | None) -> float:
    """The optimum's masked PSNR less the run's, each at most ``DISPLAY_PSNR_DB`` (NaN where one is missing)."""
    if optimal_psnr is None or own_psnr is None or math.isnan(optimal_psnr) or math.isnan(own_psnr):
        return math.nan
    return min(optimal_psnr, DISPLAY_PSNR_DB) - min(own_psnr, DISPLAY_PSNR_DB)


class _Seen:
    """The monitor as a policy sees it, with the rate replaced (R̂ and the link's rate alike)."""

    def __init__(self, monitor, rate_bps: float):
        self._monitor, self.rate_bps = monitor, rate_bps
        self.link_rate_bps = rate_bps

    def __getattr__(self, name):
        return getattr(self._monitor, name)


class PerfectPrediction(Policy):
    """``inner`` with the true future rate: the trace's mean over the transfer window it would use
    (γ·(deadline − now) from ``now``), instead of the monitor's estimate. Fallbacks keep the monitor."""

    def __init__(self, inner: Policy, trace, start_s: float, name: str = PERFECT):
        self.inner, self.trace, self.start_s, self.name = inner, trace, start_s, name

    def begin(self, units, compute_s, initial_bps):
        self.inner.begin(units, compute_s, initial_bps)

    @property
    def plans_ahead(self) -> bool:
        return self.inner.plans_ahead

    @property
    def hold_scale(self) -> float:
        return self.inner.hold_scale

    @property
    def stall_share(self) -> float:
        return self.inner.stall_share

    def choose(self, unit, now, deadline, monitor, horizon=None):
        return self.inner.choose(unit, now, deadline, self._seen(now, deadline, monitor), horizon)

    def choose_before_start(self, unit, now, deadline, monitor, horizon=None):
        return self.inner.choose_before_start(unit, now, deadline, self._seen(now, deadline, monitor), horizon)

    def _seen(self, now: float, deadline: float, monitor) -> "_Seen":
        window = getattr(self.inner, "gamma", 1.0) * max(0.0, deadline - now)
        t = self.start_s + now
        if window > 1e-6:
            rate = 8 * self.trace.bytes_between(t, t + window) / window
        else:
            rate = float(self.trace.rate_at(t)) * 1e6
        return _Seen(monitor, max(rate, 1.0))


def regret_stats(rows: list[dict]) -> dict:
    """p50 / p90 of the regret fields over one system's rows that have them."""
    regs = [r["regret"] for r in rows if r.get("regret")]
    if not regs:
        return {}

    # (records from before the visible gap was recorded: derived from the two PSNRs they hold, not written back)
    regs = [x if "psnr_gap_visible_db" in x else
            {**x, "psnr_gap_visible_db": visible_gap_db(x.get("optimal_psnr_masked"), x.get("psnr_masked"))}
            for x in regs]

    def pct(key: str) -> dict:
        xs = [x[key] for x in regs if x.get(key) is not None and not math.isnan(x[key])]
        if not xs:
            return {"p50": None, "p90": None}
        return {"p50": float(np.percentile(xs, 50)), "p90": float(np.percentile(xs, 90))}

    return {"n": len(regs), "latency_over_optimal": pct("latency_ratio"), "error_gap": pct("error_gap"),
            "psnr_gap_db": pct("psnr_gap_db"), "psnr_gap_visible_db": pct("psnr_gap_visible_db"),
            "optimal_latency_s": pct("optimal_latency_s"),
            "fastest_latency_s": pct("fastest_latency_s"),
            "exact_share": float(np.mean([bool(x["exact"]) for x in regs])),
            "exact_latency_share": float(np.mean([bool(x.get("exact_latency", x["exact"])) for x in regs])),
            "gap_latency_max": float(max(x.get("gap_latency", x["gap"]) for x in regs)),
            "gap_max": float(max(x["gap"] for x in regs)),
            "planner_s_mean": float(np.mean([x["planner_s"] for x in regs]))}


def decomposition(rows: list[dict], ours: str = "sakura") -> dict:
    """SAKURA's latency regret split into the estimator's share and the policy's, per edit then p50 / p90 /
    mean. Each run is measured against the optimum at its own quality (perfect prediction buys quality as
    well as time): (sakura's ratio − the ratio with true rates) is the estimator's, (the ratio with true
    rates − 1) the policy's. ``psnr_gain_db``: what true rates add to the masked PSNR."""
    key = lambda r: (r["template"], r["request"], round(r["start_s"], 6))  # noqa: E731
    perfect = {key(r): r for r in rows if r["system"] == PERFECT and r.get("regret")}
    est, pol, gain = [], [], []
    for r in rows:
        if r["system"] != ours or not r.get("regret") or key(r) not in perfect:
            continue
        mine, theirs = r["regret"]["latency_ratio"], perfect[key(r)]["regret"]["latency_ratio"]
        if mine is None or theirs is None:
            continue
        est.append(mine - theirs)
        pol.append(theirs - 1.0)
        gain.append(perfect[key(r)]["psnr_masked"] - r["psnr_masked"])
    if not est:
        return {}

    def pct(xs):
        return {"p50": float(np.percentile(xs, 50)), "p90": float(np.percentile(xs, 90)), "mean": float(np.mean(xs))}

    return {"n": len(est), "estimator": pct(est), "policy": pct(pol), "psnr_gain_db": pct(gain),
            "note": "latency / optimal − 1 split: sakura's ratio − the ratio with true future rates is the estimator's "
                    "share, the ratio with true rates − 1 the policy's (each against the optimum at its own quality)"}
