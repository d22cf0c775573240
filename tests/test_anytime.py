"""Anytime shards: a shard's bytes arrive smallest configuration first, and when execution reaches a
shard still in flight it uses the best configuration that came through instead of stalling."""

import time

import numpy as np
import pytest

from sakura.formats import encoding_from_header, file_id
from sakura.net.folder import FolderSource
from sakura.net.traces import Trace
from sakura.online.policies import DEFAULT_GAMMA, SakuraPolicy
from sakura.runtime.calibration import CalibrationStore
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.scheduler import StreamScheduler
from sakura.runtime.session import DeviceRuntime, Network

STEADY = Trace(np.array([0.0, 30.0]), np.array([8.0]), "steady 8 Mbps")  # the budgets sit between levels
# 40 Mbps for 10 ms (the policy's first estimate), then 2 Mbps: what was asked for cannot all arrive
# (10 ms carry 50 kB; the first two shards' top levels are ~130 kB in a v2 pack, 300 kB in a v1 one).
COLLAPSE = Trace(np.array([0.0, 0.01, 30.0]), np.array([40.0, 2.0]), "collapse")


@pytest.fixture(scope="module")
def folder(fs_packs):
    packs, tpl = fs_packs
    runtime = DeviceRuntime(FolderSource(packs), calibration=CalibrationStore(repeats=1))
    req = runtime.session(tpl, "oracle", Network(COLLAPSE, "collapse", 0.0, 1.0)).request(
        catalog_request=tpl.eval_requests[0])
    raw = (packs / f"{file_id(tpl.id, 'sakura')}.pack").read_bytes()
    return tpl, runtime, req, raw


def quiet_compute(runtime, tpl) -> ComputeProfile:
    """The template's shards at a fixed speed (25 ms a shard), for tests whose margins are in compute time: the
    fixture's measured compute moves with the machine (fast shards left the start-up hold under two checks)."""
    shards = runtime.session(tpl, "oracle", Network(STEADY, "probe", 0.0, 1.0)).compute.shards
    return ComputeProfile(shards, [0.025] * len(shards), 0.01, 1.3)


def test_every_prefix_of_a_level_decodes_to_that_configuration(folder):
    tpl, runtime, req, raw = folder
    enc = encoding_from_header("sakura", raw)
    unit = enc.units[1]
    # the largest level of the nested chain: the top residual rung (the exact rung is the FP16 file's bytes,
    # a chain of its own), so the prefixes cross from the allocated levels into the ladder
    top = max((lv for lv in unit.levels if lv.rung != "exact"), key=lambda lv: lv.nbytes)
    assert top.rung and any(lv.rung for lv, _ in enc.prefixes(unit, top, enc.ranges(unit, top))[:-1])
    ranges = enc.ranges(unit, top)
    assert sum(n for _, n in ranges) == top.nbytes
    prefixes = enc.prefixes(unit, top, ranges)
    assert len(prefixes) > 3 and prefixes[-1] == (top, len(ranges))
    assert [k for _, k in prefixes] == sorted({k for _, k in prefixes})  # strictly growing prefixes
    for level, k in prefixes:
        assert level in unit.levels
        assert sum(n for _, n in ranges[:k]) == level.nbytes  # a prefix holds exactly that configuration
        part = enc.decode_prefix(unit, level, ranges[:k], [raw[o:o + n] for o, n in ranges[:k]])
        whole = enc.decode(unit, level, [raw[o:o + n] for o, n in enc.ranges(unit, level)])
        for key in whole:
            np.testing.assert_array_equal(part[key][0].numpy(), whole[key][0].numpy())


def rebuilt_from_timeline(enc, tl, raw) -> dict:
    """The cache the device used, rebuilt locally from the timeline's requested and used levels."""
    kv = {}
    for unit, rec in zip(enc.units, tl.units):
        by_label = {lv.label: lv for lv in unit.levels}
        asked = by_label[rec.requested_level or rec.level]
        ranges = enc.ranges(unit, asked)
        k = dict((lv.label, k) for lv, k in enc.prefixes(unit, asked, ranges))[rec.level]
        kv.update(enc.decode_prefix(unit, by_label[rec.level], ranges[:k], [raw[o:o + n] for o, n in ranges[:k]]))
    return kv


@pytest.mark.parametrize("clock", ["sim", "real"])
def test_a_collapsing_link_cuts_shards_short_instead_of_stalling(folder, clock):
    tpl, runtime, req, raw = folder
    session = runtime.session(tpl, "sakura", Network(COLLAPSE, "collapse", 0.0, 1.0), fallbacks=False)
    outcome = session.simulate(req) if clock == "sim" else session.run(req)
    tl = outcome.timeline
    cut = [u for u in tl.units if u.requested_level]
    assert cut, "the policy's first choices cannot arrive at 2 Mbps: some shards must be cut"
    for u in cut:
        assert u.nbytes < u.requested_bytes and u.level != u.requested_level
    assert tl.summary()["cuts"] == len(cut)
    # the image is exactly what the used configurations give
    kv = rebuilt_from_timeline(session.encoding, tl, raw)
    expected = session.model.masked_edit(req, lambda s, l: kv[(s, l)]).image
    np.testing.assert_array_equal(outcome.image, expected)
    if clock == "sim":  # and it is faster than waiting for everything that was asked for
        waited = session.simulate(req, anytime=False).timeline
        assert not any(u.requested_level for u in waited.units)
        assert tl.latency_s < waited.latency_s


@pytest.mark.parametrize("clock", ["sim", "real"])
def test_execution_waits_as_long_as_the_scheduler_asks_before_it_cuts(folder, clock, monkeypatch):
    """Both clocks cut a shard's transfers when the scheduler says (:meth:`StreamScheduler.cut_at`), not when
    execution reaches it: asked to wait 60 ms, every shard after the first that is cut stalls that long."""
    tpl, runtime, req, raw = folder
    asked = []

    def cut_at(self, shard, now, remaining_bytes):
        asked.append(shard)
        return now + (0.06 if shard > 0 else 0.0)

    monkeypatch.setattr(StreamScheduler, "cut_at", cut_at)
    session = runtime.session(tpl, "sakura", Network(COLLAPSE, "collapse", 0.0, 1.0), fallbacks=False)
    tl = (session.simulate(req) if clock == "sim" else session.run(req)).timeline
    cut = {u.needed_by for u in tl.units if u.requested_level and u.needed_by > 0}
    assert cut, "at 2 Mbps, 60 ms carry 15 kB: some later shard is still cut"
    assert cut <= set(asked)
    for k in cut:
        assert tl.shards[k].stall_s >= 0.06 - 1e-6, (k, tl.shards[k].stall_s)


def test_shard_0_gets_the_lead_of_every_later_unit_not_the_prelude(folder):
    """Before execution starts nothing overlaps a transfer: shard 0's unit is chosen for the lead a later
    unit gets from its gate (the compute of the ``ahead`` shards before it), so on a steady link its level is
    not the edit's poorest and larger than one chosen for the prelude alone (how large is the prices' call).
    Compute at a fixed speed: the later units' windows grow with the fixture's measured compute on a loaded
    machine."""
    tpl, runtime, req, raw = folder
    session = runtime.session(tpl, "sakura", Network(STEADY, "steady", 0.0, 1.0), fallbacks=False,
                              compute=quiet_compute(runtime, tpl))
    tl = session.simulate(req).timeline
    first, later = tl.units[0], [u.nbytes for u in tl.units if u.needed_by > 0]
    lead = sum(session.compute.shard_s[:2])
    assert first.deadline_t - first.request_t >= lead - 1e-9
    assert not first.requested_level, "on a steady link what was chosen arrives by its deadline"
    assert first.nbytes > min(later), (first.nbytes, later)
    assert tl.shards[0].stall_s > 0  # the start waits for it (and says so)
    paper = session.simulate(req, anytime=False).timeline.units[0]  # the paper's runtime: the prelude's window
    assert paper.deadline_t - paper.request_t < lead and paper.nbytes < first.nbytes


def test_shard_0_is_chosen_for_the_whole_hold_where_late_bytes_are_cut(folder):
    """A policy keeps a margin (γ) for bytes that come late and stall execution. Shard 0's of the progressive
    pack cannot stall it past the start-up hold (they are cut there), so they are chosen for all of it (less the
    round trip before its first byte, which SAKURA's plan counts); CacheGen's levels do not cut, and its shard 0
    keeps the margin."""
    tpl, runtime, req, raw = folder
    for system, margin in (("sakura", 1.0), ("cachegen", DEFAULT_GAMMA)):
        session = runtime.session(tpl, system, Network(STEADY, "steady", 0.0, 1.0), fallbacks=False)
        first = session.simulate(req).timeline.units[0]
        trip = session.link_model().request_overhead_s if system == "sakura" else 0.0
        assert first.window_s == pytest.approx(margin * (first.deadline_t - first.request_t) - trip), system


@pytest.mark.parametrize("clock", ["sim", "real"])
def test_shard_0_is_not_cut_before_the_deadline_it_was_chosen_for(folder, clock):
    tpl, runtime, req, raw = folder
    session = runtime.session(tpl, "sakura", Network(COLLAPSE, "collapse", 0.0, 1.0), fallbacks=False)
    tl = (session.simulate(req) if clock == "sim" else session.run(req)).timeline
    first = tl.units[0]
    assert first.requested_level, "chosen at 40 Mbps, it cannot all arrive at 2 Mbps"
    assert tl.shards[0].exec_start_t >= first.deadline_t - 1e-9


def test_the_bytes_past_a_cut_count_toward_the_links_rate(folder):
    """A cut transfer keeps its largest prefix through, but the bytes past it crossed the link too: the rate the
    device learns from it is the link's. On a steady 8 Mbps link, a plan at 4 × R̂ has most units cut; counting only
    the kept prefixes over each transfer's time read 7.2 and 7.6 Mbps on average from the third unit on (two runs),
    every later choice a size too small."""
    tpl, runtime, req, raw = folder
    session = runtime.session(tpl, "sakura", Network(STEADY, "steady", 0.0, 1.0), fallbacks=False,
                              estimator="harmonic", compute=quiet_compute(runtime, tpl),
                              policy=SakuraPolicy(plan_margin=4.0))
    units = session.simulate(req).timeline.units
    assert sum(bool(u.requested_level) for u in units) >= 3  # cut
    rates = [u.rate_mbps for u in units[2:]]  # (the first sample's active time holds the request's round trip)
    assert np.mean(rates) > 0.975 * 8.0 and max(rates) <= 8.0 * 1.001, rates


def test_a_cut_on_the_paced_link_reports_the_bytes_through_by_then():
    """The real clock's link: a transfer cut at ~0.15 s of 0.4 s keeps whole parts only, and reports the bytes
    through by the cut (the device's socket read them) beside them."""
    import threading

    from sakura.net.client import Transfer
    from sakura.net.paced import PacedLink

    class Instant:
        def fetch_timed(self, fid, ranges):
            now = time.monotonic()
            n = sum(n for _, n in ranges)
            return Transfer([b"\0" * n for _, n in ranges], n, n, now, now, now)

    link = PacedLink(Instant(), Trace.constant(8.0), 0.0)  # 1 MB/s
    cut = threading.Event()
    threading.Timer(0.15, cut.set).start()
    tr = link.receive(link.send("x", [(i * 100_000, 100_000) for i in range(4)]), cut, [1, 2, 3, 4])
    assert len(tr.parts) < 4 and tr.nbytes == 100_000 * len(tr.parts)
    assert tr.nbytes < tr.wire_bytes < tr.nbytes + 100_000  # into the next part, not through it
    assert tr.wire_bytes / (tr.t_last_byte - tr.t_request) == pytest.approx(1e6, rel=0.05)


def test_the_tcp_view_of_an_outage_holds_the_edit_past_the_links_return(folder):
    """``sakura bench --sim-link tcp``: the simulated clock over the trace as TCP sees it. An outage in mid-edit
    ends, for a transfer in flight, at the first retransmission after the link is back (0.25, 0.65 s here for
    an outage at 0.05–0.35 s), so an edit that must wait through it ends that much later than on the fluid link."""
    tpl, runtime, req, raw = folder
    outage = Trace(np.array([0.0, 0.05, 0.35, 30.0]), np.array([8.0, 0.0, 8.0]), "outage")
    # (on a loaded machine the fixture's slow shards would leave the link time to catch up after the outage)
    quiet = quiet_compute(runtime, tpl)
    ends = {}
    for name, trace in (("fluid", outage), ("tcp", outage.with_retransmission_stalls(rto_s=0.2))):
        session = runtime.session(tpl, "sakura", Network(trace, name, 0.0, 1.0), fallbacks=False, compute=quiet)
        ends[name] = session.simulate(req).timeline.latency_s
    assert ends["fluid"] > 0.35  # it waited for the link
    assert ends["tcp"] - ends["fluid"] > 0.2, ends


@pytest.mark.parametrize("clock", ["sim", "real"])
def test_the_start_up_hold_does_not_delay_a_fallback_out_of_a_dead_link(folder, clock):
    """Shard 0 waits for its chosen bytes up to its deadline, but an outage at the start is escaped as early as
    before: the executor's first look is one check after the prelude, not after the hold."""
    from sakura.online.fallback import CHECK_EVERY_S

    tpl, runtime, req, raw = folder
    dead = Trace(np.array([0.0, 2.0, 30.0]), np.array([0.0, 8.0]), "dead at the start")
    session = runtime.session(tpl, "sakura", Network(dead, "dead", 0.0, 1.0), compute=quiet_compute(runtime, tpl))
    tl = (session.simulate(req) if clock == "sim" else session.run(req)).timeline
    first = tl.fallbacks[0]
    assert first["shard"] == 0 and first["kind"] in ("recompute", "local")
    if clock == "sim":  # (the real clock's first look is as late as the machine's load makes it)
        hold = tl.units[0].deadline_t
        assert hold > session.compute.prelude_s + 2 * CHECK_EVERY_S  # (else the test could not tell)
        assert first["t"] == pytest.approx(session.compute.prelude_s + CHECK_EVERY_S)
