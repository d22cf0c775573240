"""Transfer policies: SAKURA and every streaming baseline, as plug-ins over the same runtime and link.

Every adaptive policy sees the same monitor (rate R̂ from bytes / active receive time) and the
same deadline (when execution will need the unit, predicted from measured shard compute times
and current progress). The transfer window is ``γ · (deadline − now)``, which is the paper's
``γ · (T_ovlp + H_{p−1})``: the compute left before the unit is needed plus the lead carried over
from earlier early arrivals.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Callable

from sakura.formats import FetchUnit, Level
from sakura.online.monitor import RuntimeMonitor
from sakura.online.plan import Horizon, lower_hull, plan_levels, segment_gain

DEFAULT_GAMMA = 0.8
# Before execution starts, a level's last bytes are not bought when they cut error by less than this share of
# what the edit's marginal byte buys (its error price, :class:`ErrorPrice`); chosen on the traces' first
# halves against 10 (docs/results/issue32/policy4/).
DEFAULT_FLAT_RATIO = 3.0
# SAKURA plans every unit ahead (:mod:`sakura.online.plan`) on R̂ itself (a plan on 1.25 or 1.5 × R̂ was slower and
# poorer) and holds the start-up for 1.5 × the gate lead (1.0 and 1.25 were faster but poorer): first-half pilots in
# docs/results/issue32/policy8/ and policy9/; with rebuilds priced, 1.75 and 2.0 moved along the optimum's frontier,
# +0.2 dB for 1–4 % of p50 latency (policy17/).
DEFAULT_PLAN_MARGIN = 1.0
DEFAULT_HOLD_SCALE = 1.5
# The edit may be this share of its predicted compute later than on time, where a moment buys a much better level:
# a unit planned a little late (:func:`sakura.online.plan.plan_levels`), a cut that waits for a transfer's last bytes
# (:meth:`sakura.runtime.scheduler.StreamScheduler.cut_at`). docs/results/issue32/policy11/.
DEFAULT_STALL_SHARE = 0.05
# Before the start a plan also tries the unit asked for this many frontier levels lower (the greedy plan gave shard 0
# a rung more than the optimum and shard 1 an allocated level, issue #32; one first-half A/B, no verdict: 0)
DEFAULT_START_ALTERNATIVES = 0
# The per-unit window rule SAKURA used before (each unit its own window γ·(need − now), the hold one gate lead, no
# stall budget): `sakura bench --window-rule` runs it beside SAKURA.
RULE_SETTINGS = {"plan_margin": None, "hold_scale": 1.0, "stall_share": 0.0}


@dataclass
class Decision:
    level: Level
    rate_bps: float
    window_s: float
    budget_bytes: float  # what the policy allowed itself; inf for non-adaptive policies
    fits: bool  # the chosen level is within the budget
    stall_s: float = 0.0  # how much later than on time the level is planned, bought for quality (the edit's stall)


class Policy(ABC):
    """Picks a level for each fetch unit. Which stored format it reads is the system's (``sakura.systems``)."""

    name: str = ""
    plans_ahead = False  # wants a :class:`Horizon` with each choice (costs the scheduler a prediction per request)
    hold_scale = 1.0  # execution waits for shard 0 this many times the lead a later unit gets from its gate
    stall_share = 0.0  # the edit may be this share of its predicted compute later for better levels (the scheduler's)

    def begin(self, units: list[FetchUnit], compute_s: float, initial_bps: float) -> None:
        """Called once per edit before the first request; ``compute_s`` = predicted masked compute."""
        self.units = units

    @abstractmethod
    def choose(self, unit: FetchUnit, now: float, deadline: float, monitor: RuntimeMonitor,
               horizon: Horizon | None = None) -> Decision: ...

    def choose_before_start(self, unit: FetchUnit, now: float, deadline: float, monitor: RuntimeMonitor,
                            horizon: Horizon | None = None) -> Decision:
        """:meth:`choose` for a unit asked for before execution starts, whose every byte delays the start
        (nothing overlaps a transfer yet). Default: as any other unit."""
        return self.choose(unit, now, deadline, monitor, horizon)


def best_within(levels: tuple[Level, ...], budget: float | Callable[[Level], float]) -> tuple[Level, bool]:
    """Lowest error among levels that fit ``budget`` (bytes, or each level's own bytes allowance);
    the smallest level if none fits (stall rather than skip)."""
    allowance = budget if callable(budget) else (lambda lv: budget)
    fitting = [lv for lv in levels if lv.nbytes <= allowance(lv)]
    if not fitting:
        return min(levels, key=lambda lv: lv.nbytes), False
    return min(fitting, key=lambda lv: (lv.error, lv.nbytes)), True


class ErrorPrice:
    """The marginal error per byte of the whole edit at a byte budget: the slope at which an equal-slope
    allocation of ``budget`` bytes over every unit's frontier (:func:`lower_hull`) stops — what one more
    byte would buy at the best unit still short of its top. Errors are summed over units, each times its
    unit's output weight (:attr:`FetchUnit.weight`: the output's masked MSE per unit of error, where the
    pack stores it), so this needs a format whose levels share one metric (the SAKURA pack's)."""

    def __init__(self, units: list[FetchUnit]):
        steps = []  # (gain per byte, extra bytes) of every frontier segment of every unit
        self.floor = 0
        for u in units:
            hull = lower_hull(u.levels)
            if not hull:
                continue
            self.floor += hull[0].nbytes
            steps += [(u.weight * segment_gain(a, b), b.nbytes - a.nbytes) for a, b in zip(hull, hull[1:])]
        steps.sort(key=lambda g: -g[0])
        self.gains = [g for g, _ in steps]
        self.cumulative = []  # bytes of the allocation once the first k segments are bought
        total = self.floor
        for _, n in steps:
            total += n
            self.cumulative.append(total)

    def at(self, budget_bytes: float) -> float:
        """Error per byte of the first segment ``budget_bytes`` does not buy (0: it buys every top level)."""
        k = bisect.bisect_right(self.cumulative, budget_bytes)
        return self.gains[k] if k < len(self.gains) else 0.0


class WindowPolicy(Policy):
    """The best level whose bytes arrive within the transfer window γ·(deadline − now) at R̂; with
    ``price_rebuild``, within the window less the level's own predicted rebuild (``monitor.rebuild``,
    learnt from this edit's rebuilds), since a shard is needed rebuilt, not received."""

    def __init__(self, gamma: float = DEFAULT_GAMMA, price_rebuild: bool = False):
        self.gamma = gamma
        self.price_rebuild = price_rebuild

    def choose(self, unit, now, deadline, monitor, horizon=None):
        window = self.gamma * max(0.0, deadline - now)  # the transfer window γ·(deadline − now)
        level, fits = best_within(unit.levels, lambda lv: self.allowance(lv, window, monitor))
        return Decision(level, monitor.rate_bps, window, self.allowance(level, window, monitor), fits)

    def allowance(self, level: Level, window: float, monitor: RuntimeMonitor) -> float:
        """The bytes that arrive within ``window`` and leave ``level``'s rebuild room."""
        return monitor.rate_bps / 8 * (window - self.rebuild_s(monitor)(level))

    def rebuild_s(self, monitor: RuntimeMonitor) -> Callable[[Level], float]:
        """A level's predicted rebuild as this policy prices it (0 when it takes rebuild as free)."""
        return (lambda lv: monitor.rebuild.seconds(lv.work)) if self.price_rebuild else (lambda lv: 0.0)


class SakuraPolicy(WindowPolicy):
    """By default SAKURA plans every unit ahead (``plan_margin``, below). The per-unit window rule
    (``plan_margin=None``, the paper's): per-shard budget = R̂ · γ(T_ovlp + H); best profiled (r, b_A, b_B) within it,
    less the level's rebuild: higher ranks cost more rebuild for the same bytes (``Level.work``). The paper's rule takes
    rebuild as free (``price_rebuild=False``).

    Before execution starts it leaves the flat top of a unit's ladder (``flat_ratio``): levels whose extra
    bytes cut its weighted error by less than 1/``flat_ratio`` of the edit's error price at R̂ · γ · compute
    (:class:`ErrorPrice`): those bytes delay the start one for one, and an optimum of summed error buys them
    last (issue #32). Later units keep the rule above: bytes one leaves do not reach another (each is
    asked for at its gate), so a cut there trades quality for latency. ``flat_ratio=None``: the paper's rule.

    ``plan_margin``: instead of each unit's own window, plan every unit not asked for yet on the FIFO link at
    ``plan_margin`` · R̂ (:mod:`sakura.online.plan`, the scheduler's :class:`Horizon`) and ask for the plan's first;
    the flat-top rule still applies before the start (None: the per-unit window rule). ``hold_scale``: execution
    waits for shard 0 this many times the gate lead (the scheduler's start-up hold). ``stall_share``: the edit may be
    this share of its predicted compute later, where a moment buys a much better level (the scheduler's stall
    budget; 0: never late by choice). ``start_alternatives``: before the start, also plan with the unit asked for
    up to that many frontier levels lower and keep the plan of least error (:func:`plan_levels`)."""

    name = "sakura"

    def __init__(self, gamma: float = DEFAULT_GAMMA, price_rebuild: bool = True,
                 flat_ratio: float | None = DEFAULT_FLAT_RATIO, plan_margin: float | None = DEFAULT_PLAN_MARGIN,
                 hold_scale: float = DEFAULT_HOLD_SCALE, stall_share: float = DEFAULT_STALL_SHARE,
                 start_alternatives: int = DEFAULT_START_ALTERNATIVES):
        super().__init__(gamma, price_rebuild)
        self.flat_ratio = flat_ratio
        self.plan_margin, self.hold_scale, self.stall_share = plan_margin, hold_scale, stall_share
        self.start_alternatives, self._first_alternatives = start_alternatives, 0
        self.price: ErrorPrice | None = None

    @property
    def plans_ahead(self) -> bool:
        return self.plan_margin is not None

    def choose(self, unit, now, deadline, monitor, horizon=None):
        d = super().choose(unit, now, deadline, monitor)
        if horizon is None or self.plan_margin is None:
            return d
        rebuild = self.rebuild_s(monitor)
        rate_bps = self.budget_rate_bps(monitor, horizon)
        plan = plan_levels(horizon, rate_bps, rebuild, self._first_alternatives)
        level = plan.levels[0]
        return Decision(level, monitor.rate_bps, plan.window_s, rate_bps / 8 * (plan.window_s - rebuild(level)),
                        plan.ready[0] <= horizon.need_s[0] + plan.stall_s + 1e-9, plan.stall_s)

    def budget_rate_bps(self, monitor: RuntimeMonitor, horizon: Horizon | None) -> float:
        """The rate a decision's window is priced at: the plan's (``plan_margin`` · the link's), else R̂."""
        if horizon is None or self.plan_margin is None:
            return monitor.rate_bps
        return self.plan_margin * monitor.link_rate_bps

    def begin(self, units, compute_s, initial_bps):
        super().begin(units, compute_s, initial_bps)
        self.compute_s = compute_s
        self.price = ErrorPrice(units) if self.flat_ratio else None

    def choose_before_start(self, unit, now, deadline, monitor, horizon=None):
        self._first_alternatives = self.start_alternatives  # (for this choice only)
        try:
            d = self.choose(unit, now, deadline, monitor, horizon)
        finally:
            self._first_alternatives = 0
        if self.price is None or not d.fits:
            return d
        per_byte = self.price.at(monitor.rate_bps / 8 * self.gamma * self.compute_s) / self.flat_ratio
        # (the room a level has on time in the decision's window: the gate window at R̂ for the window rule, the
        # plan's window at the link's rate for the plan)
        rebuild = self.rebuild_s(monitor)
        rate_Bps = self.budget_rate_bps(monitor, horizon) / 8
        room = lambda lv: rate_Bps * (d.window_s - d.stall_s - rebuild(lv))  # noqa: E731
        cheaper = [lv for lv in lower_hull(unit.levels) if lv.nbytes < d.level.nbytes and lv.nbytes <= room(lv)]
        level = min([d.level, *cheaper], key=lambda lv: (unit.weight * lv.error + per_byte * lv.nbytes, lv.nbytes))
        if level is d.level:
            return d
        # (a cheaper level is on time in the window: no stall is spent on it)
        return replace(d, level=level, window_s=d.window_s - d.stall_s, budget_bytes=room(level), stall_s=0.0)


class Fp16Policy(Policy):
    """The uncompressed FP16 cache, shard by shard."""

    name = "fp16"

    def choose(self, unit, now, deadline, monitor, horizon=None):
        return Decision(unit.levels[0], monitor.rate_bps, deadline - now, float("inf"), True)


class IntQPolicy(Policy):
    """One bit width for the whole edit, chosen from the initial bandwidth: the most bits whose whole
    cache transfers within the edit's compute time; INT2 at minimum (paper §6.1)."""

    name = "intq"

    def __init__(self, gamma: float = DEFAULT_GAMMA):
        self.gamma = gamma
        self.bits: str | None = None

    def begin(self, units, compute_s, initial_bps):
        super().begin(units, compute_s, initial_bps)
        budget = initial_bps / 8 * self.gamma * compute_s
        labels = sorted({lv.label for u in units for lv in u.levels},
                        key=lambda lab: sum(lv.nbytes for u in units for lv in u.levels if lv.label == lab))
        total = {lab: sum(lv.nbytes for u in units for lv in u.levels if lv.label == lab) for lab in labels}
        fitting = [lab for lab in labels if total[lab] <= budget]
        self.bits = fitting[-1] if fitting else labels[0]

    def choose(self, unit, now, deadline, monitor, horizon=None):
        level = next(lv for lv in unit.levels if lv.label == self.bits)
        return Decision(level, monitor.rate_bps, deadline - now, float("inf"), True)


class CacheGenPolicy(WindowPolicy):
    """CacheGen's adaptation: pick each unit's stored level from the measured throughput so
    that it arrives before it is needed. CacheGen decides per token chunk of an LLM prefix; a DiT edit
    consumes its cache shard by shard, so here the unit is a shard (the same one SAKURA fetches) and
    the rule is SAKURA's: the best stored level within R̂ · γ · (deadline − now), same monitor, γ and
    look-ahead. Level sizes are as priced by the encoding, so a level whose tables this edit has not
    fetched yet carries their bytes. Its decode is not priced by default (CacheGen's own rule;
    ``price_rebuild=True`` prices it by bytes: ``sakura bench --figure rebuild-pricing``)."""

    name = "cachegen"


POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (SakuraPolicy, Fp16Policy, IntQPolicy, CacheGenPolicy)}


def get_policy(name: str, **kw) -> Policy:
    if name not in POLICIES:
        raise KeyError(f"no streaming policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name](**kw)
