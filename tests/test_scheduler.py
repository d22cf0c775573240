"""The streaming scheduler, driven alone by generated event sequences (as either clock's driver would
feed it): it never asks for a unit twice or for a shard a fallback already covered, lets no shard
execute before its cache is there, and falls back only to what the device actually holds."""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sakura.formats import FetchUnit, Level, StreamEncoding
from sakura.online.fallback import FallbackContext, InFlight
from sakura.online.monitor import RuntimeMonitor
from sakura.online.policies import RULE_SETTINGS, SakuraPolicy
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.prefetch import HeldUnit
from sakura.runtime.scheduler import WAIT, Fetch, StreamScheduler, UseHeld

LEVELS = (Level("small", 2_000, 0.5, ("s",), work=1e6), Level("top", 40_000, 0.05, ("t",), work=1e7))
STEPS, PER_STEP = 3, 2


class _TwoPerShard(StreamEncoding):
    """Two fetch units per execution shard, nothing to decode (the scheduler never decodes)."""

    name = "two-per-shard"

    def __init__(self, shards: int, redecodable: bool = True, progressive: bool = False):
        self._units = [FetchUnit(2 * j + h, j, f"shard {j}/{h}", LEVELS) for j in range(shards) for h in range(2)]
        self.redecodable, self.progressive = redecodable, progressive  # (progressive: anytime shards cut it)

    @property
    def units(self):
        return self._units

    def ranges(self, fetch_unit, level):
        return [(fetch_unit.index * 50_000, level.nbytes)]

    def decode(self, fetch_unit, level, blobs):
        return {}

    @property
    def storage_bytes(self):
        return 0


def _compute() -> ComputeProfile:
    shards = [(s, 2 * j, 2 * j + 2) for s in range(STEPS) for j in range(PER_STEP)]
    return ComputeProfile(shards, [0.05] * len(shards), 0.02, 3.0)


def _scheduler(redecodable=True, held=None, fallback=True) -> StreamScheduler:
    compute = _compute()
    ctx = FallbackContext.for_edit(compute, STEPS, least_bytes=[2 * LEVELS[0].nbytes] * len(compute.shards))
    sched = StreamScheduler(_TwoPerShard(len(compute.shards), redecodable), SakuraPolicy(), compute,
                            RuntimeMonitor(initial_bps=8e6), ahead=2, fallback=ctx if fallback else None, held=held)
    sched.begin()
    return sched


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans())
def test_generated_event_sequences_keep_the_invariants(data, redecodable):
    sched = _scheduler(redecodable)
    units, n = sched.encoding.units, len(sched.starts)
    t, cursor, cur = 0.0, 0, 0
    on_link: list[tuple[Fetch, float]] = []  # requested, bytes not through yet
    asked: set[int] = set()
    rebuilt = {j: 0 for j in range(n)}  # the test's own count of each shard's rebuilt units
    has_cache: set[int] = set()  # shards whose cache the device got: rebuilt in full, reused or recomputed
    went_local = False
    pace = data.draw(st.sampled_from([0.04, 0.3]))  # a link that keeps up, or one that crawls
    for _ in range(data.draw(st.integers(10, 80))):
        t += data.draw(st.floats(0.0, pace))
        event = data.draw(st.sampled_from(["request", "arrive", "start", "wait"]))
        if event == "request" and cursor < len(units):
            unit = units[cursor]
            gate = sched.gate(unit)
            if gate is not None and sched.starts[gate] is None:
                continue  # the driver holds the request until its gate shard started
            covered = unit.needed_by in sched.replaced
            action = sched.request(unit, t)
            cursor += 1
            if action is None:
                assert covered or went_local
                continue
            assert not covered and not went_local and isinstance(action, Fetch)
            assert action.unit.index not in asked  # never a unit twice
            asked.add(action.unit.index)
            on_link.append((action, t))
        elif event == "arrive" and on_link:
            action, t_req = on_link.pop(0)
            sched.transferred(action.nbytes, t_req, t)
            j = action.unit.needed_by
            if j in sched.replaced:
                continue  # the driver drops the bytes of a shard a fallback covered
            sched.rebuild_timed(action.level.work, 0.002)
            rebuilt[j] += 1
            if sched.rebuilt(j, action.level, 0.002):
                assert rebuilt[j] == 2
                has_cache.add(j)
        elif event == "start" and cur < n and not went_local:
            if sched.ready(cur):
                assert cur in has_cache or cur in sched.replaced
                sched.shard_started(cur, t)
                cur += 1
            else:  # a shard without its cache never starts
                with pytest.raises(ValueError):
                    sched.shard_started(cur, t)
        elif event == "wait" and cur < n and not went_local and not sched.ready(cur):
            mine = [a for a, _ in on_link if a.unit.needed_by == cur]
            delivered = data.draw(st.floats(0.0, 1.0))
            flights = [InFlight(a.least_bytes, delivered * a.least_bytes, data.draw(st.floats(0.0, 1.0)))
                       for a in mine]
            reuse_s = sched.reuse_s(cur)
            choice = sched.waiting(cur, t, flights)
            if choice.kind == WAIT:
                continue
            assert any(f.delivered < f.need_bytes for f in flights)  # no fallback for a shard whose bytes are here
            assert cur in choice.shards
            if choice.kind == "reuse":  # only the previous step's K/V the device holds
                assert redecodable and reuse_s is not None and choice.reuse_from == cur - PER_STEP
                assert choice.reuse_from in has_cache
            elif choice.kind == "recompute":
                assert all(sched.fallback.shard_step[j] == 0 for j in choice.shards)
            else:
                went_local = True
                assert choice.local_from_step == sched.fallback.shard_step[cur]
                assert set(choice.shards) == set(range(cur, n))
            if choice.kind != "local":
                has_cache.update(choice.shards)
            assert sched.ready(cur)
    if went_local:
        assert all(sched.request(u, t + 1) is None for u in units[cursor:])  # no more requests after local


def test_a_unit_is_never_requested_twice():
    sched = _scheduler()
    unit = sched.encoding.units[0]
    assert isinstance(sched.request(unit, 0.0), Fetch)
    with pytest.raises(ValueError):
        sched.request(unit, 0.01)


def test_held_bytes_serve_when_the_policy_wants_no_better():
    unit = _TwoPerShard(1).units[0]
    held = {0: HeldUnit(LEVELS[1], [(0, LEVELS[1].nbytes)], [b"x" * LEVELS[1].nbytes])}
    sched = _scheduler(held=held)
    assert isinstance(sched.request(unit, 0.0), UseHeld)  # the top level is on the device already
    small = {6: HeldUnit(LEVELS[0], [(0, LEVELS[0].nbytes)], [b"x" * LEVELS[0].nbytes])}
    sched = _scheduler(held=small)
    action = sched.request(sched.encoding.units[6], 0.0)  # needed by shard 3: time enough for the top level
    assert isinstance(action, Fetch) and action.level.label == "top" and action.held is not None  # an upgrade


def test_without_fallbacks_execution_always_waits():
    sched = _scheduler(fallback=False)
    action = sched.request(sched.encoding.units[0], 0.0)
    stalled = [InFlight(action.least_bytes, 0.0, 5.0, 0.0, 0.1)]  # nothing through for 5 s
    assert sched.waiting(0, 5.0, stalled).kind == WAIT
    assert not sched.ready(0)


@pytest.mark.parametrize("asked_at, expected", [(0.0, WAIT), (0.12, "reuse")])
def test_a_wait_is_worth_what_was_asked_for(asked_at, expected):
    """Step 1's shard waits on bytes still coming; a reuse of step 0's K/V (0.05) adds 0.1. Asked for early,
    its units are the top level (0.05): the wait is worth its stall. Asked for at the last moment, they are
    the smallest level (0.5), no better than the reuse, which ends sooner."""
    compute = _compute()
    n = len(compute.shards)
    ctx = FallbackContext.for_edit(compute, STEPS, least_bytes=[2 * LEVELS[0].nbytes] * n, least_error=[0.5] * n,
                                   step_error=[None] * PER_STEP + [0.1] * (n - PER_STEP))
    sched = StreamScheduler(_TwoPerShard(n, progressive=True), SakuraPolicy(**RULE_SETTINGS), compute,
                            RuntimeMonitor(initial_bps=8e6), ahead=2, fallback=ctx)  # (each unit its own window)
    sched.begin()
    units = sched.encoding.units
    for u in units[:4]:  # step 0 at the top level, rebuilt
        assert sched.request(u, 0.0).level.label == "top"
        sched.rebuilt(u.needed_by, LEVELS[1], 0.001)
    sched.shard_started(0, 0.02)
    sched.shard_started(1, 0.07)
    asked = [sched.request(u, asked_at) for u in units[4:6]]
    assert {a.level.label for a in asked} == {"top" if expected == WAIT else "small"}
    coming = [InFlight(a.least_bytes, 0.4 * a.least_bytes, 0.03, 0.2 * a.least_bytes, 0.03) for a in asked]
    assert sched.waiting(2, 0.15, coming).kind == expected


class _Recording(SakuraPolicy):
    """SAKURA's policy, noting which of its two choices each unit got."""

    def __init__(self):
        super().__init__()
        self.before_start: list[int] = []

    def choose_before_start(self, unit, now, deadline, monitor, horizon=None):
        self.before_start.append(unit.index)
        return super().choose_before_start(unit, now, deadline, monitor, horizon)


def test_units_asked_for_before_execution_starts_are_chosen_as_such():
    compute = _compute()
    policy = _Recording()
    sched = StreamScheduler(_TwoPerShard(len(compute.shards)), policy, compute, RuntimeMonitor(initial_bps=8e6))
    sched.begin()
    units = sched.encoding.units
    for unit in units[:4]:  # shards 0 and 1 (ahead = 2): asked for at once
        sched.request(unit, 0.0)
    for unit in units[:2]:
        sched.rebuilt(0, unit.levels[0], 0.01)
    sched.shard_started(0, 0.1)
    sched.request(units[4], 0.1)  # shard 2's first unit, at shard 0's start
    assert policy.before_start == [0, 1, 2, 3]


@pytest.mark.parametrize("anytime, need", [(True, 0.1 + 0.05), (False, 0.02 + 0.05)])
def test_a_later_shard_asked_for_before_the_start_is_chosen_for_after_the_hold(anytime, need):
    """Shard 0 waits out the start-up hold (two shards' compute, 0.1 s) for its bytes, so shard 1 is needed no
    sooner than the hold's end plus shard 0's compute (0.15 s), not the prelude's end plus it (0.07 s): chosen for
    the later need, shard 1's units afford the top level at 0.5 MB/s. Without anytime shards there is no hold."""
    compute = _compute()
    sched = StreamScheduler(_TwoPerShard(len(compute.shards), progressive=True), SakuraPolicy(**RULE_SETTINGS),
                            compute, RuntimeMonitor(initial_bps=4e6), anytime=anytime)  # (the hold: one gate lead)
    sched.begin()
    units = sched.encoding.units
    for unit in units[:2]:
        sched.request(unit, 0.0)
    asked = sched.request(units[2], 0.0)
    assert asked.record.deadline_t == pytest.approx(need)
    assert asked.level.label == ("top" if anytime else "small")


def test_a_later_shard_asked_for_before_the_start_is_needed_when_shard_0_comes():
    """At 2 MB/s shard 0's two top-level units (80 kB) are through at 0.04 s and rebuilt 0.01 s later (1 ns
    per work unit), half-way through the 0.1 s hold; execution starts then, so shard 1 is needed at
    0.05 + 0.05 s, not at the hold's end plus shard 0's compute (0.15 s)."""
    compute = _compute()
    monitor = RuntimeMonitor(initial_bps=16e6)
    monitor.rebuild.prior = 1e-9
    sched = StreamScheduler(_TwoPerShard(len(compute.shards), progressive=True), SakuraPolicy(), compute, monitor,
                            anytime=True)
    sched.begin()
    units = sched.encoding.units
    assert [sched.request(u, 0.0).level.label for u in units[:2]] == ["top", "top"]
    assert sched.startup_at == pytest.approx(0.04 + 0.01)
    asked = sched.request(units[2], 0.0)
    assert asked.record.deadline_t == pytest.approx(0.05 + 0.05)


def test_a_start_in_the_future_of_a_request_is_not_yet_a_start():
    """The simulated clock settles shard 0 before it books shard 1's units at their (earlier) request times:
    the device that asked then had not started executing."""
    compute = _compute()
    policy = _Recording()
    sched = StreamScheduler(_TwoPerShard(len(compute.shards)), policy, compute, RuntimeMonitor(initial_bps=8e6))
    sched.begin()
    units = sched.encoding.units
    for unit in units[:2]:
        sched.request(unit, 0.0)
        sched.rebuilt(0, unit.levels[0], 0.01)
    sched.shard_started(0, 0.1)
    sched.request(units[2], 0.0)  # asked for at 0 s, booked after shard 0's start at 0.1 s was settled
    sched.request(units[4], 0.1)  # asked for at shard 0's start
    assert policy.before_start == [0, 1, 2]


@pytest.mark.parametrize("remaining, waits", [(0, False), (1_000, True), (4_000, False)])
def test_a_cut_waits_a_moment_for_a_rest_predicted_through_by_then(remaining, waits):
    """A quarter of the shard's compute (12.5 ms) at 2 Mbps carries 3.1 kB: execution waits that long for 1 kB
    still coming before it cuts, not for 4 kB; with nothing coming there is nothing to cut."""
    compute = _compute()
    sched = StreamScheduler(_TwoPerShard(len(compute.shards), progressive=True), SakuraPolicy(stall_share=0.0),
                            compute, RuntimeMonitor(initial_bps=2e6), anytime=True, cut_wait_share=0.25)
    assert sched.cut_at(3, 0.4, remaining) == pytest.approx(0.4 + (0.25 * 0.05 if waits else 0.0))


def test_a_cut_waits_for_a_rest_a_moment_away_while_the_edits_stall_budget_lasts():
    """A stall budget of 8 ms (2.5 % of 0.32 s predicted compute): 1 kB at 2 Mbps is 4 ms away, so execution waits
    1.5 × that for it once; the second such cut finds 2 ms left and cuts at once. Without a budget, no wait."""
    compute = _compute()

    def scheduler(share):
        return StreamScheduler(_TwoPerShard(len(compute.shards), progressive=True), SakuraPolicy(stall_share=share),
                               compute, RuntimeMonitor(initial_bps=2e6), anytime=True)

    sched = scheduler(0.025)
    assert sched.cut_at(3, 0.4, 1_000) == pytest.approx(0.406)
    assert sched.cut_at(4, 0.5, 1_000) == pytest.approx(0.5)
    assert scheduler(0.0).cut_at(3, 0.4, 1_000) == pytest.approx(0.4)
    planned = scheduler(0.0)  # a unit of shard 3 was planned 6 ms late: its cut waits for that, whatever is left
    planned.planned_late[3] = 0.006
    assert planned.cut_at(3, 0.4, 1_000) == pytest.approx(0.406) and planned.cut_at(4, 0.5, 1_000) == 0.5


def test_each_unit_planned_late_spends_the_edits_stall_budget_and_delays_the_shards_after_it():
    """Every unit after shard 0's (chosen for the start-up hold) planned 3 ms late: the budget (8 ms) shrinks by
    3 ms a unit until it is gone, and execution is predicted to reach shard 2 6 ms later (shard 1's two units)."""
    compute = _compute()

    def requested(share):
        seen: list[tuple[float, float]] = []

        class Late(SakuraPolicy):
            def choose(self, unit, now, deadline, monitor, horizon=None):
                seen.append((horizon.stall_budget_s, horizon.need_s[0]))
                d = super().choose(unit, now, deadline, monitor, horizon)
                return replace(d, stall_s=min(0.003, horizon.stall_budget_s))

        sched = StreamScheduler(_TwoPerShard(len(compute.shards)), Late(stall_share=share), compute,
                                RuntimeMonitor(initial_bps=2e6))
        for unit in sched.encoding.units[:5]:
            sched.request(unit, 0.0)
        return seen

    late, on_time = requested(0.025), requested(0.0)
    assert [b for b, _ in late] == pytest.approx([0.0, 0.0, 0.008, 0.005, 0.002])
    assert late[4][1] - on_time[4][1] == pytest.approx(0.006)  # shard 2's first unit
    assert [n for _, n in late[:3]] == pytest.approx([n for _, n in on_time[:3]])
