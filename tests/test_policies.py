"""SAKURA's policy prices a level's rebuild as well as its transfer; the simulated device learns its
rebuild speed only from rebuilds that have finished."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sakura.formats import FetchUnit, Level, StreamEncoding
from sakura.net.traces import Trace
from sakura.online.monitor import RebuildRate, RuntimeMonitor
from sakura.online.policies import ErrorPrice, SakuraPolicy, lower_hull
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.sim import LinkModel, simulate

# Three levels of one shard: more bytes buy lower error; the best one is a high-rank level whose
# rebuild is 20× the middle one's (what a shared token basis at top rank looks like).
LEVELS = (Level("small", 1_000, 0.5, ("s",), work=1e7),
          Level("mid", 8_000, 0.2, ("m",), work=1e8),
          Level("top", 9_000, 0.1, ("t",), work=2e9))


def test_rebuild_rate_learns_seconds_per_work():
    rate = RebuildRate(prior_s_per_work=1e-9, window=2)
    assert rate.seconds(1e6) == pytest.approx(1e-3)  # nothing seen: the prior
    rate.observe(0.0, 5.0)  # a level with no modelled work teaches nothing
    assert rate.seconds(1e6) == pytest.approx(1e-3)
    rate.observe(1e8, 0.1)
    rate.observe(3e8, 0.2)
    assert rate.seconds(4e8) == pytest.approx(0.3)  # total time over total work
    rate.observe(1e8, 1.0)  # the window forgets the oldest
    assert rate.s_per_work == pytest.approx(1.2 / 4e8)


def test_the_monitor_keeps_the_links_rate_apart_from_the_round_trip():
    """R̂ folds a round trip into each transfer the link was idle for; the link's own rate and the round trip are
    learnt apart (the plan's model), and a request sent while the link was busy shows no round trip."""
    m = RuntimeMonitor(1e6, estimator="harmonic")
    rate, trip = 8e6, 0.004  # 1 MB/s
    t = 0.0
    for _ in range(3):  # idle link: request, first byte a round trip later, 10 kB
        m.observe(10_000, t, t + trip + 0.010, t + trip)
        t += 0.1
    assert m.link_rate_bps == pytest.approx(rate) and m.round_trip_s == pytest.approx(trip)
    assert m.rate_bps == pytest.approx(8 * 10_000 / 0.014)  # (the proportional R̂: the round trip in its time)
    m.observe(10_000, t, t + trip + 0.010, t + trip)  # then one behind it, sent while the link was busy
    m.observe(20_000, t + 0.001, t + trip + 0.030, t + trip + 0.010)
    assert m.link_rate_bps == pytest.approx(rate) and m.round_trip_s == pytest.approx(trip)
    assert list(m.round_trips) == [pytest.approx(trip)] * 4


def test_a_level_whose_rebuild_would_miss_the_deadline_does_not_fit():
    unit = FetchUnit(0, 0, "shard 0", LEVELS)
    monitor = RuntimeMonitor(initial_bps=8 * 100_000)  # 100 kB/s
    # window γ·(deadline − now) = 0.8 · 0.125 s = 0.1 s: 10 kB, so every level's bytes fit
    assert SakuraPolicy().choose(unit, 0.0, 0.125, monitor).level.label == "top"  # no rebuild seen: free
    monitor.rebuild.observe(1e8, 0.005)  # 5e-11 s per MAC: top rebuilds in 0.1 s, mid in 5 ms
    d = SakuraPolicy().choose(unit, 0.0, 0.125, monitor)
    assert d.level.label == "mid" and d.fits
    assert d.budget_bytes == pytest.approx(100_000 * (0.1 - 0.005))  # the window less mid's rebuild
    assert SakuraPolicy(price_rebuild=False).choose(unit, 0.0, 0.125, monitor).level.label == "top"


class _Synthetic(StreamEncoding):
    """``shards`` fetch units with LEVELS, laid out back to back; nothing to decode (a rebuild model
    gives the times)."""

    name = "synthetic"

    def __init__(self, shards: int):
        self._units = [FetchUnit(i, i, f"shard {i}", LEVELS) for i in range(shards)]

    @property
    def units(self):
        return self._units

    def ranges(self, fetch_unit, level):
        return [(fetch_unit.index * 20_000, level.nbytes)]

    def decode(self, fetch_unit, level, blobs):
        return {}


def simulated(policy: SakuraPolicy, s_per_work: float, shards: int = 8, slower_from: int | None = None):
    """One edit on the simulated clock; rebuilds cost ``s_per_work`` (3× that from shard ``slower_from``)."""
    compute = ComputeProfile([(0, 2 * i, 2 * i + 2) for i in range(shards)], [0.05] * shards, 0.02, 1.0)
    link = LinkModel(Trace.constant(8.0), 0.0, request_overhead_s=0.0)  # 1 MB/s: every level's bytes fit
    seen: list[float] = []

    class Watching(type(policy)):  # what the policy knew at each request
        def choose(self, unit, now, deadline, monitor, horizon=None):
            seen.append(monitor.rebuild.s_per_work)
            return super().choose(unit, now, deadline, monitor, horizon)

    policy.__class__ = Watching
    tl, _ = simulate(_Synthetic(shards), policy, compute, link, None, keep=False,
                     rebuild_model=lambda unit, level: level.work * s_per_work * (
                         3 if slower_from is not None and unit.index >= slower_from else 1))
    return tl, seen


def test_before_any_transfer_the_plan_pays_the_round_trip_the_device_measured_before():
    """The first requests of an edit are planned with the round trip earlier edits measured (the calibration's),
    not none: a plan that leaves it out is tight by a round trip per request and drops a level once it learns it."""
    assert RuntimeMonitor(1e6, initial_round_trip_s=0.003).round_trip_s == pytest.approx(0.003)
    m = RuntimeMonitor(1e6, initial_round_trip_s=0.003)
    m.observe(10_000, 0.0, 0.011, 0.001)  # then its own
    assert m.round_trip_s == pytest.approx(0.001)
    compute = ComputeProfile([(0, 2 * i, 2 * i + 2) for i in range(4)], [0.05] * 4, 0.02, 1.0)
    trips: list[float] = []

    class Watching(SakuraPolicy):
        def choose_before_start(self, unit, now, deadline, monitor, horizon=None):
            trips.append(horizon.round_trip_s)
            return super().choose_before_start(unit, now, deadline, monitor, horizon)

    simulate(_Synthetic(4), Watching(), compute, LinkModel(Trace.constant(8.0), 0.0, request_overhead_s=0.004),
             None, keep=False, rebuild_model=lambda unit, level: 0.0)
    assert trips and trips[0] == pytest.approx(0.004)


def test_pricing_the_rebuild_keeps_a_slow_rebuild_from_stalling_execution():
    slow = 1e-10  # top rebuilds in 0.2 s against 0.05 s of compute per shard
    free, _ = simulated(SakuraPolicy(price_rebuild=False), slow)
    priced, seen = simulated(SakuraPolicy(), slow)
    assert {u.level for u in free.units} == {"top"}
    assert seen[0] == 0.0 and seen[-1] == pytest.approx(slow)  # learnt on the way, never before a rebuild
    assert "mid" in {u.level for u in priced.units}
    assert priced.stall_s < free.stall_s / 2 and priced.latency_s < free.latency_s


def test_the_simulated_device_knows_a_rebuild_time_only_once_that_rebuild_is_done():
    # The first `ahead` (2) requests go out at t = 0 (nothing rebuilt: top, 0.2 s each, one after the
    # other) and the third when shard 0 starts (t ≈ 0.2 s), when shard 1's rebuild (3× slower) is still
    # running: the device knows shard 0's rate only. Seeing shard 1's too would read 2.5e-10.
    _, seen = simulated(SakuraPolicy(), 1e-10, shards=4, slower_from=1)
    assert seen[:2] == [0.0, 0.0]
    assert seen[2] == pytest.approx(1e-10)
    assert seen[3] > 1e-10  # by then shard 1's rebuild is done


def _edit_with_rebuilds(overlap: float, mbps: float, shards: int = 8):
    """``shards`` shards of 50 ms, each unit's rebuild 30 ms, at the top level on a ``mbps`` link."""
    compute = ComputeProfile([(0, 2 * i, 2 * i + 2) for i in range(shards)], [0.05] * shards, 0.02, 1.0)
    link = LinkModel(Trace.constant(mbps), 0.0, request_overhead_s=0.0)
    tl, _ = simulate(_Synthetic(shards), SakuraPolicy(price_rebuild=False), compute, link, None, keep=False,
                     rebuild_model=lambda unit, level: 0.03, fallback=None, rebuild_overlap=overlap)
    return tl


def test_a_rebuild_on_the_executors_core_delays_execution_by_its_time():
    # Fast link: every unit (9 kB) is through in 0.9 ms. With a core to spare each rebuild hides behind the shard
    # before (only shard 0 waits for its own, done at 30.9 ms); on the executor's core every shard waits for its
    # unit's 30 ms rebuild after the prelude or the shard before; sharing half of it, for 15 ms of it.
    spare, shared, half = (_edit_with_rebuilds(h, 80.0) for h in (1.0, 0.0, 0.5))
    assert [u.level for u in spare.units] == [u.level for u in shared.units] == ["top"] * 8
    assert spare.latency_s == pytest.approx(0.0309 + 8 * 0.05, abs=1e-6)
    assert shared.latency_s == pytest.approx(0.02 + 8 * (0.03 + 0.05), abs=1e-6)
    assert half.latency_s == pytest.approx(0.02 + 0.015 + 8 * 0.05 + 7 * 0.015, abs=1e-6)
    # A slow link: the executor is idle when each unit comes through, so the rebuild costs the same on either device.
    slow_spare, slow_shared = _edit_with_rebuilds(1.0, 0.04), _edit_with_rebuilds(0.0, 0.04)
    assert [u.level for u in slow_spare.units] == [u.level for u in slow_shared.units]
    assert slow_shared.latency_s == pytest.approx(slow_spare.latency_s, rel=1e-9)
    with pytest.raises(ValueError, match="share"):
        _edit_with_rebuilds(1.5, 80.0)


def test_the_unpaced_link_pays_each_sub_requests_round_trip_once_the_link_is_free():
    # 100 kB in ranges of 10 kB: sub-requests of 16 kB, 32 kB, then the rest (unpaced.groups: 20, 40, 40 kB here)
    ranges = [(i * 10_000, 10_000) for i in range(10)]
    paced = LinkModel(Trace.constant(8.0), 0.0, request_overhead_s=0.002)  # 1 MB/s
    unpaced = LinkModel(Trace.constant(8.0), 0.0, request_overhead_s=0.002, unpaced=True)
    # sent at 0 with the link busy until 0.05 s: the paced link's round trip hid behind the transfer before it
    assert paced.arrival(100_000, 0.0, 0.05, ranges) == pytest.approx(0.05 + 0.1)
    assert unpaced.arrival(100_000, 0.0, 0.05, ranges) == pytest.approx(0.05 + 3 * 0.002 + 0.1)
    assert unpaced.arrival(10_000, 0.0, 0.0, ranges[:1]) == pytest.approx(0.002 + 0.01)  # one range: one round trip


# -- the flat top of a ladder (issue #32) --------------------------------------------------------------------------

def _ladder(name: str, points: list[tuple[int, float]]) -> tuple[Level, ...]:
    return tuple(Level(f"{name}{i}", n, e, (name, i)) for i, (n, e) in enumerate(points))


# A unit whose last 2 MB cut error 1e-3 → 0 (what the top rungs of a shard look like), and units whose
# next bytes still buy error at ~1e-6 per byte.
FLAT_TOP = _ladder("top", [(100_000, 0.5), (1_000_000, 1e-3), (3_000_000, 0.0)])
STEEP = _ladder("steep", [(100_000, 0.5), (300_000, 0.2), (600_000, 0.05)])


# (errors on a grid of 1e-4: stored errors are never subnormal floats, whose differences underflow to 0)
@given(st.lists(st.lists(st.tuples(st.integers(1, 50), st.integers(0, 10_000).map(lambda k: k / 10_000)),
                         min_size=1, max_size=6), min_size=1, max_size=4), st.integers(0, 400))
def test_the_error_price_is_where_an_equal_slope_allocation_of_the_budget_stops(ladders, budget):
    units = [FetchUnit(i, i, f"u{i}", _ladder(f"u{i}", pts)) for i, pts in enumerate(ladders)]
    for u in units:  # the frontier: every level on or above it, its gains falling
        hull = lower_hull(u.levels)
        gains = [(a.error - b.error) / (b.nbytes - a.nbytes) for a, b in zip(hull, hull[1:])]
        assert all(g > 0 for g in gains) and gains == sorted(gains, reverse=True)
        for lv in u.levels:
            a = [h for h in hull if h.nbytes <= lv.nbytes][-1]
            b = next((h for h in hull if h.nbytes > lv.nbytes), None)
            on_chord = a.error if b is None else \
                a.error - (a.error - b.error) * (lv.nbytes - a.nbytes) / (b.nbytes - a.nbytes)
            assert lv.error >= on_chord - 1e-12
    price = ErrorPrice(units).at(budget)

    def spent(p: float) -> int:  # bytes of each unit's best level at error price p per byte
        return sum(min(lower_hull(u.levels), key=lambda lv: (lv.error + p * lv.nbytes, lv.nbytes)).nbytes
                   for u in units)

    assert spent(price * (1 + 1e-9)) <= max(budget, spent(float("inf")))  # what it buys fits the budget …
    if price > 0:
        assert spent(price * (1 - 1e-9)) > budget  # … and one more segment would not


def test_before_execution_starts_sakura_leaves_the_flat_top_of_a_ladder():
    units = [FetchUnit(0, 0, "shard 0", FLAT_TOP)] + [FetchUnit(i, i, f"shard {i}", STEEP) for i in range(1, 8)]
    monitor = RuntimeMonitor(initial_bps=8 * 10e6)  # 10 MB/s; window 0.8 · 0.5 s: every level fits
    policy = SakuraPolicy(price_rebuild=False)
    # the edit's bytes at R̂ · γ · compute = 10 MB/s · 0.8 · 0.3 s = 2.4 MB: the steep units stop short, so a
    # byte is worth ~5e-7 of error; the top's last 2 MB cut 5e-10 per byte
    policy.begin(units, 0.3, monitor.initial_bps)
    assert policy.choose(units[0], 0.0, 0.5, monitor).level.label == "top2"  # once execution runs: as before
    d = policy.choose_before_start(units[0], 0.0, 0.5, monitor)
    assert d.level.label == "top1" and d.fits and d.budget_bytes == pytest.approx(4e6)
    paper = SakuraPolicy(price_rebuild=False, flat_ratio=None)
    paper.begin(units, 0.3, monitor.initial_bps)
    assert paper.choose_before_start(units[0], 0.0, 0.5, monitor).level.label == "top2"
    # with bytes for every unit's top level, the price is 0 and the top is worth taking
    policy.begin(units, 10.0, monitor.initial_bps)
    assert policy.choose_before_start(units[0], 0.0, 0.5, monitor).level.label == "top2"


def test_a_unit_whose_error_costs_the_output_more_keeps_its_top_before_the_start():
    """Output weights (the output's masked MSE per unit of error) price a unit's ladder against the rest: the
    flat top the price leaves on a unit of weight 1 is worth its bytes on a unit the output is 10⁴× more
    sensitive to, and the edit's price itself counts the weights."""
    steep = [FetchUnit(i, i, f"shard {i}", STEEP) for i in range(1, 8)]
    monitor = RuntimeMonitor(initial_bps=8 * 10e6)
    policy = SakuraPolicy(price_rebuild=False)
    for weight, label in ((1.0, "top1"), (1e4, "top2")):
        units = [FetchUnit(0, 0, "shard 0", FLAT_TOP, weight)] + steep
        policy.begin(units, 0.3, monitor.initial_bps)
        assert policy.choose_before_start(units[0], 0.0, 0.5, monitor).level.label == label
    # the steep units' gains scaled by 10: the price at the same budget is 10× as high
    scaled = [FetchUnit(i, i, f"shard {i}", STEEP, 10.0) for i in range(1, 8)]
    assert ErrorPrice(scaled).at(2.4e6) == pytest.approx(10 * ErrorPrice(steep).at(2.4e6))


def test_true_future_rates_run_the_policy_with_its_own_knobs():
    """The regret decomposition's "true future rates" run must differ from SAKURA in the rates alone: every knob the
    runtime reads off a policy (the start-up hold, the stall budget, planning ahead) is the inner policy's."""
    from sakura.eval.regret import PerfectPrediction
    from sakura.online.policies import Policy

    inner = SakuraPolicy(hold_scale=2.25, stall_share=0.07)
    perfect = PerfectPrediction(inner, trace=None, start_s=0.0)
    knobs = [k for k, v in vars(Policy).items() if not k.startswith("_") and not callable(v) and k != "name"]
    assert {"hold_scale", "stall_share", "plans_ahead"} <= set(knobs)
    assert {k: getattr(perfect, k) for k in knobs} == {k: getattr(inner, k) for k in knobs}
