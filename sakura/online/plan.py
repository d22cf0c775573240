"""Model-predictive level choice (issue #32): at each request, a plan for every unit not yet asked for, made on
what the device predicts — the link's rate held constant, the shards' calibrated compute, this edit's rebuild rate —
and the first unit of it is what the device asks for. The next request plans again with what it has learnt.

The plan model is the clairvoyant planner's (:mod:`sakura.eval.plan_model`) cut to what a device can solve
in milliseconds: one FIFO link at a constant rate (the link's, ``RuntimeMonitor.link_rate_bps``) from when the
bytes already asked for are through, each unit asked for at its gate and its bytes starting a round trip later
(or when the link is free, if later), rebuilds one at a time, no fallbacks. A unit is *on time* when it is
rebuilt by the moment execution is predicted to reach its shard (no stall). Among the plans that keep every
unit on time (or no later than its smallest level would be), the plan of least weighted error
(``FetchUnit.weight`` · level error: the output's predicted masked MSE) is found greedily: the frontier
segment that cuts the most weighted error per byte first, kept when every unit is still on time. With
nested deadlines over one FIFO link this is the equal-slope allocation the per-unit rule cannot make: a unit
the output sees more takes bytes a unit it hardly sees would have spent.

A plan that keeps every unit on time is tight: a round trip or a rebuild a little slower than predicted makes the
first unit's planned level late, and the best one on time may be far poorer (the residual rungs between an
allocated level and the exact one rebuild for many times the exact rung's time). So the first unit may also be late
by a small stall (``Horizon.stall_budget_s``, what is left of the edit's) when that cuts the edit's predicted error by
``MIN_STALL_GAIN_DB`` or more, the units after it planned again behind it: a few milliseconds of latency for decibels
the optimum takes (issue #32) — decibels a display shows: a predicted error under ``UNSEEN_PREDICTED_MSE`` counts as
that.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from typing import Callable

from sakura.formats import FetchUnit, Level

MIN_STALL_GAIN_DB = 1.0
# The output's masked MSE (pixels in [0, 1]) of rounding it to 8 bits: an output error below it is not seen on a
# display (a masked PSNR over 58.9 dB), so a stall buys no gain under it
DISPLAY_MSE = 1 / (255**2 * 12)
# The output's masked MSE runs above the plan's predicted error (the units' weighted errors, summed): per workload
# 1.2–1.5× at the median and 1.5–2.4× at p90 over SAKURA's first-half edits (docs/results/issue32/policy15/). A
# prediction counts as unseen only this far under the display's MSE: one just under it is often a visible 55 dB.
PREDICTION_SLACK = 2.0
UNSEEN_PREDICTED_MSE = DISPLAY_MSE / PREDICTION_SLACK


@dataclass(frozen=True)
class Horizon:
    """The rest of the edit as the device predicts it when it asks for ``units[0]``."""

    now: float
    units: tuple[FetchUnit, ...]  # that unit and every later one not asked for yet, in consumption order
    need_s: tuple[float, ...]  # per unit: when execution is predicted to reach its shard
    gate_s: tuple[float, ...]  # per unit: when it may be asked for
    link_free_s: float  # when the bytes asked for so far are predicted through
    round_trip_s: float = 0.0  # a request's wait for its first byte on an idle link
    error_before: float = 0.0  # the weighted error of the units already asked for, at the levels asked
    stall_budget_s: float = 0.0  # how much later than on time the edit may still be, for better levels


@dataclass(frozen=True)
class Plan:
    levels: list[Level]  # per unit of the horizon
    ready: list[float]  # per unit: when it is predicted rebuilt
    stall_s: float = 0.0  # how much later than on time the first unit is planned, bought for quality
    # the first unit's time from its first byte (the link's queue and round trip past) to its need + the stall: its
    # bytes and rebuild must fit in it (the units after it may take some of it)
    window_s: float = math.inf


def lower_hull(levels: tuple[Level, ...]) -> list[Level]:
    """The levels on the lower convex frontier of (bytes, error), fewest bytes first: each next one cuts
    error by less per extra byte than the one before (an equal-slope allocation only ever picks these)."""
    hull: list[Level] = []
    for lv in sorted(levels, key=lambda x: (x.nbytes, x.error)):
        if hull and lv.error >= hull[-1].error:
            continue
        while len(hull) >= 2 and segment_gain(hull[-2], hull[-1]) <= segment_gain(hull[-1], lv):
            hull.pop()
        hull.append(lv)
    return hull


def segment_gain(a: Level, b: Level) -> float:
    """Error cut per extra byte from ``a`` to ``b``."""
    return (a.error - b.error) / max(1, b.nbytes - a.nbytes)


def ready_times(h: Horizon, levels: list[Level], rate_Bps: float, rebuild_s: Callable[[Level], float],
                first: int = 0, state: tuple[float, float] | None = None) -> tuple[list[float], list[tuple]]:
    """When each unit from ``first`` on is rebuilt if asked for at ``levels``; also the (link free, rebuilder
    free) state before each unit, so a change at unit k replays from k."""
    link, rebuilder = state if state is not None else (max(h.now, h.link_free_s), h.now)
    ready, states = [], []
    for k in range(first, len(levels)):
        states.append((link, rebuilder))
        link = max(link, h.gate_s[k] + h.round_trip_s) + levels[k].nbytes / rate_Bps
        rebuilder = max(link, rebuilder) + rebuild_s(levels[k])
        ready.append(rebuilder)
    return ready, states


def plan_levels(h: Horizon, rate_bps: float, rebuild_s: Callable[[Level], float], first_alternatives: int = 0) -> Plan:
    """The least-weighted-error levels of ``h.units`` that keep each unit on time at ``rate_bps`` (see the module),
    the first one late by up to ``h.stall_budget_s`` where that is worth it; and each one's predicted ready time.

    ``first_alternatives``: also plan with the first unit up to that many frontier levels below the greedy's and keep
    the plan of least error. The greedy never lowers a unit it has raised, so a first unit raised early can leave a
    later one's next level late for good (a residual rung's long rebuild), where a level less for the first would have
    made room for it."""
    rate_Bps = max(rate_bps, 1.0) / 8
    hulls = [lower_hull(u.levels) for u in h.units]
    best = _greedy(h, hulls, rate_Bps, rebuild_s)
    for below in range(1, first_alternatives + 1):
        if best.first_at - below < 0:
            break
        alt = _greedy(h, hulls, rate_Bps, rebuild_s, cap_first=best.first_at - below)
        if alt.error < best.error * (1 - 1e-9):
            best = alt
    start = max(best.states[0][0], h.gate_s[0] + h.round_trip_s)
    if h.stall_budget_s > 0:
        late = _worth_a_stall(h, hulls, best, start, rate_Bps, rebuild_s, h.stall_budget_s)
        if late is not None:
            return late
    return Plan(best.levels, best.ready, window_s=max(0.0, h.need_s[0] - start))


@dataclass
class _Greedy:
    levels: list[Level]
    ready: list[float]
    states: list[tuple]
    limit: list[float]
    first_at: int  # the first unit's index on its frontier (the last frontier level at most its error)
    error: float  # the plan's weighted error


def _greedy(h: Horizon, hulls: list[list[Level]], rate_Bps: float, rebuild_s: Callable[[Level], float],
            cap_first: int | None = None) -> _Greedy:
    """The greedy plan of the module (the first unit at most its frontier level ``cap_first``)."""
    at = [0] * len(hulls)
    levels = [hull[0] for hull in hulls]
    ready, states = ready_times(h, levels, rate_Bps, rebuild_s)
    # on time: by the need, or no later than the smallest plan has it (a unit late at its smallest level stalls
    # whatever is chosen; it must not stall longer)
    limit = [max(n, r) for n, r in zip(h.need_s, ready)]
    heap = []

    def push(k: int) -> None:
        i = at[k]
        if i + 1 < len(hulls[k]) and (k > 0 or cap_first is None or i < cap_first):
            a, b = hulls[k][i], hulls[k][i + 1]
            gain = h.units[k].weight * (a.error - b.error) / max(1, b.nbytes - a.nbytes)
            heapq.heappush(heap, (-gain, k))

    for k in range(len(hulls)):
        push(k)
    while heap:
        _, k = heapq.heappop(heap)
        trial = levels[:k] + [hulls[k][at[k] + 1]] + levels[k + 1:]
        tail, tail_states = ready_times(h, trial, rate_Bps, rebuild_s, first=k, state=states[k])
        if all(r <= lim + 1e-9 for r, lim in zip(tail, limit[k:])):
            levels, at[k] = trial, at[k] + 1
            ready[k:], states[k:] = tail, tail_states
            push(k)
            continue
        # the next frontier level is late; one off the frontier may fit: a lower rank needs less rebuild for its bytes,
        # the exact rung (the FP16 bytes) none (a unit's own window rules out most at once)
        start = max(states[k][0], h.gate_s[k] + h.round_trip_s)
        floor = hulls[0][cap_first].error if k == 0 and cap_first is not None else -math.inf
        for lv in sorted(h.units[k].levels, key=lambda x: x.error):
            if lv.error >= levels[k].error:
                break
            if lv.error < floor or start + lv.nbytes / rate_Bps + rebuild_s(lv) > limit[k] + 1e-9:
                continue
            trial = levels[:k] + [lv] + levels[k + 1:]
            tail, tail_states = ready_times(h, trial, rate_Bps, rebuild_s, first=k, state=states[k])
            if all(r <= lim + 1e-9 for r, lim in zip(tail, limit[k:])):
                levels, ready[k:], states[k:] = trial, tail, tail_states
                break
    first_at = max(i for i, lv in enumerate(hulls[0]) if lv.error >= levels[0].error)
    return _Greedy(levels, ready, states, limit, first_at, sum(u.weight * lv.error for u, lv in zip(h.units, levels)))


def _worth_a_stall(h: Horizon, hulls: list[list[Level]], on_time: _Greedy, start: float, rate_Bps: float,
                   rebuild_s: Callable[[Level], float], budget_s: float) -> Plan | None:
    """The plan of least error with the first unit at a better level late by at most ``budget_s``, where it cuts the
    edit's predicted error by ``MIN_STALL_GAIN_DB`` or more; None when there is none. Execution reaches each later
    shard that much later, and no later unit may be later than that: the later units keep their levels, or are planned
    again behind the stall (a first unit's better level can be worth a later one's poorer, issue #32: the unit
    asked for next at the start was left a level the optimum never picks when the first one took a rung more)."""
    unit, planned, limit = h.units[0], on_time.levels[0], on_time.limit
    total = h.error_before + on_time.error
    seen = max(total, UNSEEN_PREDICTED_MSE)
    gain_db = lambda error: 10 * math.log10(seen / max(h.error_before + error, UNSEEN_PREDICTED_MSE))  # noqa: E731
    best: Plan | None = None
    best_error = math.inf
    for lv in sorted(unit.levels, key=lambda x: x.error):
        own = on_time.error - unit.weight * (planned.error - lv.error)  # (the later units as planned)
        if lv.error >= planned.error or gain_db(own) < MIN_STALL_GAIN_DB:
            break  # (less error first: no later one cuts more, and a later unit planned again only loses)
        stall = max(0.0, start + lv.nbytes / rate_Bps + rebuild_s(lv) - limit[0])
        if stall > budget_s:
            continue
        kept = [lv, *on_time.levels[1:]]
        ready, _ = ready_times(h, kept, rate_Bps, rebuild_s, state=on_time.states[0])
        options = [(own, kept, ready)] if all(r <= lim + stall + 1e-9 for r, lim in zip(ready, limit)) else []
        again = _greedy(replace(h, need_s=tuple(n + stall for n in h.need_s)), [[lv], *hulls[1:]], rate_Bps,
                        rebuild_s)
        if all(lim <= old + stall + 1e-9 for lim, old in zip(again.limit[1:], limit[1:])):
            options.append((again.error, again.levels, again.ready))
        for error, levels, ready in options:
            if error < best_error and gain_db(error) >= MIN_STALL_GAIN_DB:
                best_error, best = error, Plan(levels, ready, stall, max(0.0, h.need_s[0] + stall - start))
    return best
