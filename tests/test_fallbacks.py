"""Fallbacks: when a shard's cache cannot come in time the edit reuses the previous step's K/V or goes
local, chosen by predicted end of the edit, on both clocks; a dead link costs local generation's time."""

import numpy as np
import pytest

from sakura.model import LocalSwitch
from sakura.net.folder import FolderSource
from sakura.net.traces import Trace
from sakura.online.fallback import (
    CHECK_EVERY_S,
    FIRST_BYTE_S,
    FallbackContext,
    InFlight,
    choose_fallback,
    observed_rate_bps,
    predict_ready,
)
from sakura.runtime.calibration import CalibrationStore
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.session import DeviceRuntime, Network
from sakura.runtime.timeline import Timeline

DEAD = Trace(np.array([0.0, 600.0]), np.array([0.0]), "dead")


@pytest.fixture(scope="module")
def folder(fs_packs):
    packs, tpl = fs_packs
    runtime = DeviceRuntime(FolderSource(packs), calibration=CalibrationStore(repeats=1))
    req = runtime.session(tpl, "oracle", Network(DEAD, "dead", 0.0, 1.0)).request(catalog_request=tpl.eval_requests[0])
    return tpl, runtime, req


def test_the_session_knows_each_shards_smallest_prefix_and_step_error(folder):
    tpl, runtime, _ = folder
    for system, knows in (("sakura", True), ("cachegen", False), ("fp16", False)):
        session = runtime.session(tpl, system, Network(DEAD, "dead", 0.0, 1.0))
        ctx, units = session.fallback_context(), session.encoding.units
        steps = [ctx.shard_step[u.needed_by] for u in units]
        assert [e is not None for e in ctx.step_error] == [knows and s > 0 for s in steps], system
        smallest = [min(u.levels, key=lambda lv: lv.nbytes) for u in units]
        assert list(ctx.least_error) == [lv.error for lv in smallest]


def dip(session) -> Trace:
    """Fast for the first third of the masked run, then nothing: shards of later steps cannot come. (A start-up hold
    longer than the gate lead of the two shards ahead starts execution later by the difference: so does the dip.)"""
    later = (session.policy.hold_scale - 1.0) * sum(session.compute.shard_s[:2])
    return Trace(np.array([0.0, later + 0.35 * session.compute.masked_s, 600.0]), np.array([50.0, 0.0]), "dip")


def test_the_choice_waits_within_the_bound_and_then_takes_the_cheapest_way():
    compute = ComputeProfile([(s, 2 * j, 2 * j + 2) for s in range(2) for j in range(2)], [0.05] * 4, 0.05, 2.0)
    ctx = FallbackContext.for_edit(compute, num_steps=2)  # one full step 1.0 s; bound 1.8 s, hard bound 2.2 s
    assert choose_fallback(ctx, 2, 0.5, ready_s=1.0, reuse_s=0.01)[0] == "wait"  # ends at 1.1 s ≤ 1.8 s
    kind, ends = choose_fallback(ctx, 2, 0.5, ready_s=5.0, reuse_s=0.01)
    assert kind == "reuse" and ends["reuse"] == pytest.approx(0.61) and ends["local"] == pytest.approx(1.5)
    # nothing to reuse: the device keeps waiting (the link may come back) while going local one check
    # later still ends within the hard bound, and not past it
    assert choose_fallback(ctx, 2, 0.5, ready_s=5.0, reuse_s=None)[0] == "wait"
    assert choose_fallback(ctx, 2, 1.185, ready_s=5.0, reuse_s=None)[0] == "wait"
    assert choose_fallback(ctx, 2, 1.195, ready_s=5.0, reuse_s=None)[0] == "local"
    assert choose_fallback(FallbackContext.for_edit(compute, 2, allow_local=False), 2, 1.5, 5.0, None)[0] == "wait"
    # step 0 has no previous step: the device recomputes it (exact K/V, one full step) when that is expected
    # to end well — later steps' smallest bytes (1 kB a shard) come at the rate the link shows now — or
    # when doing so and then going local at step 1 still ends within the hard bound; else it goes local
    ctx0 = FallbackContext.for_edit(compute, num_steps=2, least_bytes=[1000.0] * 4)
    assert choose_fallback(ctx0, 0, 0.05, ready_s=9.0, reuse_s=None, rate_bps=1e6)[0] == "recompute"
    assert choose_fallback(ctx0, 0, 0.15, ready_s=9.0, reuse_s=None, rate_bps=1e6)[0] == "recompute"  # ends 1.35 s
    assert choose_fallback(ctx0, 0, 0.05, ready_s=0.5, reuse_s=None, rate_bps=1e6)[0] == "wait"  # bytes coming
    crawl = 100.0  # bits/s: every option that streams is expected to take minutes
    assert choose_fallback(ctx0, 0, 0.05, ready_s=9.0, reuse_s=None, rate_bps=crawl)[0] == "recompute"  # worst 2.15 s
    # its worst case (step 0 exact, then local from step 1) may pass the hard bound by step 0's masked shards
    # (0.1 s): they are run, not waited for, and end closer to the FP16-cache output than local from step 0
    assert choose_fallback(ctx0, 0, 0.15, ready_s=9.0, reuse_s=None, rate_bps=crawl)[0] == "recompute"  # worst 2.25 s
    assert choose_fallback(ctx0, 0, 0.25, ready_s=9.0, reuse_s=None, rate_bps=crawl)[0] == "local"  # worst 2.35 s
    # a transfer that has shown nothing for long enough reads as a dead link, whatever the monitor says
    silent = [InFlight(10_000, 0.0, 0.5, 0.0, 0.1)]
    assert observed_rate_bps(8e6, silent) == 1.0 and predict_ready(0.0, silent, 8e6, 0.0) > 1e4
    back = [InFlight(10_000, 1000.0, 2.0, 1000.0, 0.1)]  # silent for most of 2 s, flowing again lately
    assert observed_rate_bps(8e6, back) == pytest.approx(80e3)
    assert predict_ready(0.0, [InFlight(10_000, 0.0, 0.001)], 8e6, 0.0) == pytest.approx(0.01)  # too early to tell
    # before its first byte a request waits for the server and the queue ahead of it: 40 ms of nothing is no
    # evidence of a dead link; a trickle after the first byte is
    assert observed_rate_bps(8e6, [InFlight(10_000, 0.0, 0.04, 0.0, 0.04)]) == 8e6
    assert observed_rate_bps(8e6, [InFlight(10_000, 100.0, 0.04, 100.0, 0.04)]) == pytest.approx(20e3)


def test_a_wait_for_a_prefix_no_better_than_a_reuse_is_not_free():
    compute = ComputeProfile([(s, 2 * j, 2 * j + 2) for s in range(2) for j in range(2)], [0.05] * 4, 0.05, 2.0)
    # step 1's smallest prefixes have error 0.7 (shard 2) and 0.05 (shard 3); their layers' step-0 K/V are
    # 0.1 away from their own, so a reuse of bytes kept at error e leaves 0.1 + e
    ctx = FallbackContext.for_edit(compute, num_steps=2, least_error=[0.7, 0.7, 0.7, 0.05],
                                   step_error=[None, None, 0.1, 0.1])
    assert ctx.reuse_error(2, 0.05) == pytest.approx(0.15) and ctx.reuse_error(0, 0.05) is None
    # the wait ends within the bound (1.1 s), but a reuse ends sooner and is as good or better: it wins
    assert choose_fallback(ctx, 2, 0.5, ready_s=1.0, reuse_s=0.01, kept_error=0.05)[0] == "reuse"
    assert choose_fallback(ctx, 2, 0.5, ready_s=1.0, reuse_s=0.01, kept_error=0.65)[0] == "reuse"  # 0.7 vs 0.75
    # a prefix at least twice as good as the reuse is worth its stall; so is one nothing is known against
    assert choose_fallback(ctx, 3, 0.5, ready_s=1.0, reuse_s=0.01, kept_error=0.05)[0] == "wait"  # 0.05 vs 0.15
    assert choose_fallback(ctx, 2, 0.5, ready_s=1.0, reuse_s=0.01, kept_error=None)[0] == "wait"
    # a wait that is not free still wins on its expected end (it arrives before the reuse's rebuild ends)
    assert choose_fallback(ctx, 2, 0.5, ready_s=0.505, reuse_s=0.01, kept_error=0.05)[0] == "wait"
    # a wait gets what was asked for (its smallest usable prefix), not the shard's smallest level: a wait on a
    # top level nearly through is free, one on a prefix worse than the reuse is not
    assert choose_fallback(ctx, 2, 0.5, ready_s=1.0, reuse_s=0.01, kept_error=0.05, wait_error=0.0)[0] == "wait"
    assert choose_fallback(ctx, 3, 0.5, ready_s=1.0, reuse_s=0.01, kept_error=0.05, wait_error=0.7)[0] == "reuse"
    # without the pack's step errors the rule is the paper-era one: waiting within the bound is free
    assert choose_fallback(FallbackContext.for_edit(compute, 2), 2, 0.5, 1.0, 0.01, kept_error=0.05)[0] == "wait"


@pytest.mark.parametrize("seed", range(4))
def test_no_choice_risks_more_than_the_hard_bound_unless_it_is_expected_to_end_well(seed):
    """The option taken either can still end within the hard bound whatever the link does next (waiting
    escapes one check later, recompute at step 1, reuse chained over every later shard), or is expected to
    end within the soft bound at the rate the link shows now — or it is local."""
    compute = ComputeProfile([(s, 2 * j, 2 * j + 2) for s in range(2) for j in range(2)], [0.05] * 4, 0.05, 2.0)
    ctx = FallbackContext.for_edit(compute, num_steps=2, least_bytes=[1000.0] * 4)
    rng = np.random.default_rng(seed)
    for _ in range(500):
        now, wait_s, shard = rng.uniform(0, 3), rng.exponential(1.0), int(rng.integers(0, 4))
        reuse_s = None if rng.random() < 0.5 or ctx.shard_step[shard] == 0 else rng.uniform(0, 0.2)
        check_one_choice(ctx, shard, now, wait_s, reuse_s, 10 ** rng.uniform(1, 7))


def check_one_choice(ctx, shard, now, wait_s, reuse_s, rate_bps):
    kind, ends = choose_fallback(ctx, shard, now, now + wait_s, reuse_s, rate_bps)
    step, rest = ctx.shard_step[shard], sum(ctx.shard_s[shard:])
    if kind == "local":
        assert ends["local"] == pytest.approx(ctx.local_end(now, step))
        return
    escape_at = {"wait": now + CHECK_EVERY_S, "reuse": now}.get(kind)
    slack = 0.0
    if kind == "recompute":
        slack = sum(ctx.shard_s[shard:2])  # step 0's masked shards, run exactly (see the module's docstring)
        worst = ctx.local_end(now + ctx.full_step_s + slack, 1)
    elif reuse_s is not None:
        worst = escape_at + (len(ctx.shard_s) - shard) * reuse_s + rest
    else:
        worst = ctx.local_end(escape_at, step) if wait_s > CHECK_EVERY_S else now
    assert worst <= ctx.hard_s + slack + 1e-9 or ends[kind] <= ctx.bound_s, (kind, ends)


def test_a_provider_that_switches_at_step_0_is_local_generation(folder):
    tpl, runtime, req = folder
    model = runtime.template_state(tpl).model

    def provider(step, layer):
        raise LocalSwitch

    res = model.masked_edit(req, provider)
    assert res.extras["local_from"] == 0
    np.testing.assert_allclose(res.image, model.full_edit(req).image, atol=1e-5)


@pytest.mark.parametrize("clock", ["sim", "real"])
def test_a_dead_link_ends_within_the_hard_bound_of_local_generation(folder, clock):
    """Nothing ever arrives. Step 0 is recomputed (exact, and the link might come back for step 1), then
    the device waits at step 1 only while going local still ends within the hard bound, and goes local."""
    tpl, runtime, req = folder
    session = runtime.session(tpl, "sakura", Network(DEAD, "dead", 0.0, 1.0), timeout_s=30)
    outcome = session.simulate(req) if clock == "sim" else session.run(req)
    tl = outcome.timeline
    kinds = [f["kind"] for f in tl.fallbacks]
    assert kinds in (["local"], ["recompute", "local"]), tl.fallbacks
    assert tl.summary()["fallbacks"].get("local") == 1 and "local_from_step" in tl.extras
    assert not any(u.level for u in tl.units)  # no byte of the link was used
    if kinds == ["local"]:
        np.testing.assert_allclose(outcome.image, session.local_output(req), atol=1e-5)
    if clock == "sim":  # compute is the calibration's: the bound holds up to one check and the prelude
        ctx = session.fallback_context()  # (plus step 0's masked shards where they were recomputed)
        bound = ctx.hard_s + sum(s for s, st in zip(ctx.shard_s, ctx.shard_step) if st == 0 and kinds[0] == "recompute")
        assert tl.latency_s <= bound + session.compute.prelude_s + 0.02, (tl.latency_s, bound)
    assert session.quality(outcome.image, req)["psnr_masked"] > 20


@pytest.mark.parametrize("clock", ["sim", "real"])
def test_a_link_that_dies_mid_edit_reuses_the_previous_step(folder, clock):
    tpl, runtime, req = folder
    probe = runtime.session(tpl, "sakura", Network(DEAD, "dead", 0.0, 1.0))
    session = runtime.session(tpl, "sakura", Network(dip(probe), "dip", 0.0, 1.0), timeout_s=30)
    events: list[dict] = []
    session.on_event = events.append
    outcome = session.simulate(req) if clock == "sim" else session.run(req)
    tl = outcome.timeline
    kinds = {f["kind"] for f in tl.fallbacks}
    # (the dip is placed by calibrated compute: a loaded machine's real run may still be in step 0 then, and
    # go local; the simulated clock replays the calibration exactly)
    assert "reuse" in kinds if clock == "sim" else kinds, tl.fallbacks
    steps = [tl.shards[f["shard"]].step for f in tl.fallbacks if f["kind"] == "reuse"]
    assert min(steps, default=1) >= 1  # step 0 has nothing to reuse
    if "local" not in kinds:
        assert all(s.exec_end_t is not None for s in tl.shards)
    dropped = [u for u in tl.units if u.dropped]
    assert all(u.level == "" and u.requested_level for u in dropped) and (dropped or "local" in kinds)
    if clock == "real":  # the protocol events fold back into the same timeline
        viewer = Timeline("sakura", clock)
        for ev in events:
            viewer.apply(ev)
        assert [f["kind"] for f in viewer.fallbacks] == [f["kind"] for f in tl.fallbacks]
        assert sum(u.dropped for u in viewer.units) == len(dropped)
    q = session.quality(outcome.image, req)
    # adjacent steps' K/V are close: the edit stays usable (12 of 16 shards reused with the plan's longer hold:
    # 30.4–31.5 dB run alone, 29.2 dB on the real clock inside the whole suite on a fresh clone)
    assert q["psnr_masked"] > 28, q


def test_a_dropped_transfer_teaches_the_monitor_the_links_rate(folder):
    """A transfer a fallback drops tells the monitor what came through, on the simulated clock as on the real
    one (its collector): else every unit asked for after a slump is chosen at the rate before it, is too
    big to come in time, is dropped in turn, and the edit reuses shard after shard."""
    tpl, runtime, req = folder
    probe = runtime.session(tpl, "sakura", Network(DEAD, "dead", 0.0, 1.0))
    slump = Trace(np.array([0.0, 0.35 * probe.compute.masked_s, 600.0]), np.array([50.0, 0.5]), "slump")
    tl = runtime.session(tpl, "sakura", Network(slump, "slump", 0.0, 1.0)).simulate(req).timeline
    dropped = [u for u in tl.units if u.dropped and u.nbytes]
    assert dropped, tl.fallbacks
    first = min(dropped, key=lambda u: u.arrival_t)
    later = [u for u in tl.units if u.request_t > first.arrival_t]
    # (without it, R̂ stays at what the transfers completed before the slump showed: ≈ 19 Mbit/s here)
    assert later and all(u.rate_mbps < 10 * 0.5 for u in later), [(u.request_t, u.rate_mbps) for u in later]


def test_without_fallbacks_a_dying_link_waits(folder):
    tpl, runtime, req = folder
    session = runtime.session(tpl, "sakura", Network(dip(runtime.session(tpl, "sakura", Network(DEAD, "d", 0.0, 1.0))),
                                                     "dip", 0.0, 1.0), fallbacks=False)
    tl = session.simulate(req).timeline
    assert not tl.fallbacks and tl.latency_s > 500  # the paper's runtime waits until the trace wraps (600 s)


@pytest.mark.parametrize("clock", ["sim", "real"])
def test_prefetched_units_are_used_without_a_request_and_are_a_floor_under_late_upgrades(folder, clock):
    """Prefetch on template pick (simulated think time): the held units' bytes are on the device, the
    edit fetches only upgrades, and an upgrade still in flight when needed gives way to the held level."""
    tpl, runtime, req = folder
    probe = runtime.session(tpl, "sakura", Network(DEAD, "dead", 0.0, 1.0))
    trace = Trace(np.array([0.0, 10.0, 10.0 + 0.35 * probe.compute.masked_s, 600.0]),
                  np.array([20.0, 50.0, 0.0]), "think-then-dip")
    session = runtime.session(tpl, "sakura", Network(trace, "think-then-dip", 10.0, 1.0), timeout_s=30)
    held = session.prefetch_simulated(think_s=0.3)  # 0.3 s at 20 Mbps: every unit, at a low level
    assert len(held.units) == len(session.encoding.units) and held.nbytes > 0
    outcome = session.simulate(req) if clock == "sim" else session.run(req)
    tl = outcome.timeline
    assert tl.extras["prefetched"]["bytes"] == held.nbytes
    upgraded = [u for u in tl.units if not u.prefetched]
    floored = [u for u in tl.units if u.prefetched and u.dropped]  # the upgrade came too late
    assert upgraded and all(u.nbytes > held.units[u.unit].nbytes for u in upgraded)  # 50 Mbps: upgrades fit
    assert floored and not tl.fallbacks  # the dip costs nothing: every late unit has its floor
    assert all(s.stall_s < 0.05 for s in tl.shards)
    for u in tl.units:
        if u.prefetched:  # the level used is the one held
            assert u.level == held.units[u.unit].level.label
    q = session.quality(outcome.image, req)
    assert q["psnr_masked"] > 30, q


def test_the_device_recomputes_step_0_exactly(folder):
    """At step 0 every token is the template's fixed noise: one full forward of the template's own
    request on the device gives the stored FP16 cache of step 0 (to fp16 precision)."""
    tpl, runtime, req = folder
    session = runtime.session(tpl, "oracle", Network(DEAD, "dead", 0.0, 1.0))
    stored = session.reference_kv()
    mine = session.model.recompute_first_step(req)
    assert sorted(mine) == sorted(key for key in stored if key[0] == 0)
    for key, (k, v) in mine.items():
        np.testing.assert_array_equal(k.half().numpy(), stored[key][0].numpy())
        np.testing.assert_array_equal(v.half().numpy(), stored[key][1].numpy())


@pytest.mark.parametrize("clock", ["sim", "real"])
def test_a_dip_in_the_first_step_is_recomputed_and_the_rest_streams(folder, clock):
    """The link drops out right after the edit starts, for about a full step, and is back before
    step 1: step 0 is recomputed on the device (one full step; no reuse exists yet, and going local would
    cost every step). Waiting is allowed no slack here (bound 0), so the choice is by predicted end only."""
    tpl, runtime, req = folder
    # The device reads the link as dead FIRST_BYTE_S after asking (it waits on shard 0 from then): recomputing step 0
    # then going local from step 1 must still end within the hard bound, so the edit is at least ~2 s of compute
    # (local generation measured 1.0 s on one machine of these: the recompute's worst case was 8 ms past the bound)
    predicted = runtime.session(tpl, "sakura", Network(DEAD, "dead", 0.0, 1.0)).compute
    compute = predicted.scaled(max(1.0, 20 * FIRST_BYTE_S / predicted.local_full_s))
    fb = runtime.session(tpl, "sakura", Network(DEAD, "dead", 0.0, 1.0), compute=compute).fallback_context()
    # 0.1 ms of link first: 625 bytes, less than any level of shard 0 (1 ms carried a shared-basis level whole)
    back_s = 1.1 * fb.full_step_s
    dip = Trace(np.array([0.0, 0.0001, back_s, 600.0]), np.array([50.0, 0.0, 50.0]), "dip")
    session = runtime.session(tpl, "sakura", Network(dip, "dip", 0.0, 1.0), timeout_s=30, compute=compute)
    session.fallback_bound_share = 0.0
    for _ in range(3):
        outcome = session.simulate(req) if clock == "sim" else session.run(req)
        tl = outcome.timeline
        asked = tl.shards[0].exec_start_t - tl.shards[0].stall_s
        # (a loaded machine can hold the executor back until the dip is nearly over: then nothing was to decide)
        if tl.fallbacks or asked < back_s / 3:
            break
    else:
        pytest.skip(f"the machine held the device's first ask back past the dip three times (last at {asked:.2f} s)")
    assert tl.fallbacks and tl.fallbacks[0]["kind"] == "recompute" and tl.fallbacks[0]["shard"] == 0, tl.fallbacks
    assert all(u.needed_by >= 4 or u.dropped for u in tl.units)  # nothing of step 0 was used from the link
    if clock == "sim":  # (the real run's compute drifts from the calibration on a loaded machine)
        assert "local_from_step" not in tl.extras and tl.latency_s < session.compute.local_full_s
    assert session.quality(outcome.image, req)["psnr_masked"] > 30


def test_cachegen_never_recomputes_and_a_dead_link_still_ends(folder):
    """CacheGen's tables ride with a level's first use, so dropping step 0's units would strand later ones:
    it waits or goes local, and a dead link ends within the hard bound all the same."""
    tpl, runtime, req = folder
    session = runtime.session(tpl, "cachegen", Network(DEAD, "dead", 0.0, 1.0), timeout_s=30)
    assert not session.fallback_context().allow_recompute
    tl = session.simulate(req).timeline
    assert [f["kind"] for f in tl.fallbacks] == ["local"]
    assert tl.latency_s <= session.fallback_context().hard_s + session.compute.prelude_s + 0.02
