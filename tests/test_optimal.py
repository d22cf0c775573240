"""The clairvoyant planner (issue #32): its dynamic program equals brute force on small edits, a thinned
front carries a true bound, and its timing model is the simulated clock's."""

import random

import numpy as np
import pytest

from sakura.eval.optimal import brute_force, least_error, least_latency
from sakura.eval.plan_model import LOCAL, STREAM, PlanProblem, PlanUnit, ShardAction, UnitOption, evaluate
from sakura.formats import FetchUnit, Level, StreamEncoding
from sakura.net.traces import Trace
from sakura.online.policies import Decision, Policy
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.sim import LinkModel, simulate


def random_trace(rng: random.Random) -> Trace:
    """A link with dead stretches (zero is a bandwidth) and bursts."""
    edges = np.arange(0.0, 4.0001, 0.05)
    mbps = np.array([0.0 if rng.random() < 0.3 else rng.uniform(0.2, 6.0) for _ in edges[1:]])
    mbps[-1] = 2.0
    return Trace(edges, mbps, "random")


def random_problem(seed: int, steps: int = 2, per_step: int = 2, units_per_shard: int = 1,
                   sides: bool = False) -> PlanProblem:
    rng = random.Random(seed)
    n = steps * per_step
    units, index = [], 0
    for j in range(n):
        for _ in range(units_per_shard):
            opts = []
            for k in range(rng.randint(1, 3)):
                side = f"L{k}" if sides else ""
                opts.append(UnitOption(f"l{k}", rng.randint(500, 20_000), round(rng.uniform(0.0, 0.5), 3),
                                       rng.uniform(0.0, 0.03), side, rng.randint(0, 3000) if sides else 0))
            units.append(PlanUnit(index, j, tuple(opts)))
            index += 1
    shard_step = tuple(j // per_step for j in range(n))
    step_error = tuple(None if s == 0 else round(rng.uniform(0.05, 0.3), 3) for s in shard_step)
    link = LinkModel(random_trace(rng), rng.uniform(0.0, 1.0), request_overhead_s=rng.choice([0.0, 0.002]),
                     inflight=rng.choice([1, 2]))
    return PlanProblem(tuple(units), tuple(rng.uniform(0.01, 0.08) for _ in range(n)), shard_step,
                       rng.uniform(0.0, 0.02), steps, rng.uniform(0.1, 0.4), link, ahead=rng.choice([1, 2]),
                       step_error=step_error, allow_reuse=rng.random() < 0.8, allow_recompute=rng.random() < 0.8,
                       allow_local=rng.random() < 0.8, local_error=rng.choice([0.2, 0.6]))


@pytest.mark.parametrize("seed", range(40))
def test_least_latency_equals_brute_force(seed):
    p = random_problem(seed, steps=2 + seed % 3 // 2, units_per_shard=1 + seed % 2, sides=seed % 3 == 0)
    rng = random.Random(seed + 1000)
    bounds = {u.index: rng.choice([None, 0.1, 0.3, 0.6]) for u in p.units}
    bounds = {k: v for k, v in bounds.items() if v is not None}
    got = least_latency(p, bounds)
    want = brute_force(p, "latency", bounds)
    assert got.exact
    assert got.value == want  # exact, not approximately
    if got.schedule is not None:  # the schedule it returns costs what it says and keeps the bounds
        again = evaluate(p, [a for i, a in enumerate(got.schedule.actions)
                             if i == 0 or a is not got.schedule.actions[i - 1] or a.kind == STREAM])
        assert again.latency_s == got.value
        assert all(got.schedule.unit_error[i] <= b + 1e-9 for i, b in bounds.items())


@pytest.mark.parametrize("seed", range(40))
def test_least_error_within_a_latency_equals_brute_force(seed):
    p = random_problem(seed, steps=2 + seed % 2, units_per_shard=1, sides=seed % 4 == 1)
    free = least_latency(p)
    # a latency between the fastest schedule's and a slower one's, so the constraint binds
    limit = free.value * random.Random(seed).uniform(1.0, 1.6)
    got = least_error(p, limit)
    want = brute_force(p, "error", max_latency=limit)
    assert got.exact
    assert got.value == want
    assert got.schedule.latency_s <= limit + 1e-9


def test_a_thinned_front_reports_a_true_bound_and_gap():
    for seed in range(12):
        p = random_problem(seed, steps=3, per_step=2)
        limit = least_latency(p).value * 1.3
        want = brute_force(p, "error", max_latency=limit)
        got = least_error(p, limit, max_front=1)
        assert got.lower_bound <= want + 1e-12 <= got.value + 1e-12
        if not got.exact:
            assert 0.0 <= got.gap <= 1.0


def test_the_time_budget_counts_cpu_time_so_a_busy_machine_thins_no_sooner(monkeypatch):
    # a wall clock that runs 100 s per reading (other work on the machine) spends no CPU time of the solver's:
    # the front keeps all 80 states, where a spent budget would keep 8 and miss the optimum (seeds 5 and 6)
    import sakura.eval.optimal as optimal

    for seed in (5, 6):
        p = random_problem(seed, steps=3, per_step=2, units_per_shard=2)
        limit = least_latency(p).value * 1.3
        alone = least_error(p, limit, max_front=80, budget_s=1.0)
        wall = iter(range(0, 10**9, 100))
        monkeypatch.setattr(optimal.time, "perf_counter", lambda: float(next(wall)))
        busy = least_error(p, limit, max_front=80, budget_s=1.0)
        monkeypatch.undo()
        assert alone.exact and busy.exact and busy.value == alone.value
        assert least_error(p, limit, max_front=8).value > alone.value  # (what a spent budget would have kept)


def test_going_local_counts_its_time_and_error():
    p = random_problem(3)
    sched = evaluate(p, [ShardAction(LOCAL)])
    assert sched.latency_s == pytest.approx(p.prelude_s + p.num_steps * p.full_step_s)
    assert sched.total_error == pytest.approx(p.local_error * len(p.units))


# -- the planner's clock is the simulated clock's -------------------------------------------------------

class _Units(StreamEncoding):
    name = "planned"

    def __init__(self, p: PlanProblem):
        self._units = [FetchUnit(u.index, u.shard, f"u{u.index}",
                                 tuple(Level(o.label, o.nbytes, o.error, (o.label,)) for o in u.options))
                       for u in p.units]

    @property
    def units(self):
        return self._units

    def ranges(self, fetch_unit, level):
        return [(fetch_unit.index * 100_000, level.nbytes)]

    def decode(self, fetch_unit, level, blobs):
        return {}


class _Planned(Policy):
    """Asks for the level a schedule names for each unit."""

    name = "planned"

    def __init__(self, labels: dict[int, str]):
        self.labels = labels

    def choose(self, unit, now, deadline, monitor, horizon=None):
        level = next(lv for lv in unit.levels if lv.label == self.labels[unit.index])
        return Decision(level, monitor.rate_bps, deadline - now, float("inf"), True)


@pytest.mark.parametrize("seed", range(15))
def test_a_streamed_schedule_ends_when_the_simulated_clock_says(seed):
    p = random_problem(seed, steps=2, per_step=3, units_per_shard=1 + seed % 2)
    rng = random.Random(seed)
    labels = {u.index: rng.choice(u.options).label for u in p.units}
    actions = [ShardAction(STREAM, tuple(labels[u.index] for u in p.shard_units(j))) for j in range(p.n)]
    planned = evaluate(p, actions)
    compute = ComputeProfile([(s, 2 * j, 2 * j + 2) for j, s in enumerate(p.shard_step)], list(p.shard_s),
                             p.prelude_s, p.full_step_s * p.num_steps)
    rebuild = {(u.index, o.label): o.rebuild_s for u in p.units for o in u.options}
    tl, _ = simulate(_Units(p), _Planned(labels), compute, p.link, None, ahead=p.ahead, keep=False,
                     rebuild_model=lambda unit, level: rebuild[(unit.index, level.label)], anytime=False)
    assert planned.latency_s == pytest.approx(tl.latency_s, rel=1e-12, abs=1e-12)
