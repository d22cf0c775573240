"""A real-clock edit measures the machine as well as the system (#31 item 4): its own compute is checked
against the calibration for the same work, and a run whose compute left the calibration's spread (or whose
latency came out below the oracle's floor) gets its simulated-clock latency beside the measured one."""

from __future__ import annotations

import multiprocessing
import os
from contextlib import contextmanager

from app.edit_page import EditPage
from app.edit_panels import compare_rows, machine_note
from device_bridge import EditProgress, InProcessBridge, Job, NetworkSpec
from sakura.runtime.compute import ComputeCheck, ComputeProfile
from sakura.runtime.timeline import Timeline

PROFILE = ComputeProfile([(0, 0, 2), (0, 2, 4), (1, 0, 2), (1, 2, 4)], [0.1, 0.1, 0.1, 0.2], 0.05, 1.0,
                         [0.98, 1.0, 1.03])


def timeline(clock: str, exec_s: list[float]) -> Timeline:
    tl = Timeline.for_shards("sakura", clock, PROFILE.shards)
    t = 0.05
    for j, d in enumerate(exec_s):
        tl.shards[j].exec_start_t, tl.shards[j].exec_end_t = t, t + d
        t += d + 0.3  # stalls between shards are not compute
    tl.latency_s = t
    return tl


def test_compute_outside_the_calibrations_spread_is_busy():
    quiet = ComputeCheck.of(timeline("real", [0.105, 0.098, 0.1, 0.21]), PROFILE, runs_locally=False)
    assert quiet.calibrated_s == 0.5 and abs(quiet.measured_s - 0.513) < 1e-9 and not quiet.busy
    loaded = ComputeCheck.of(timeline("real", [0.2, 0.2, 0.2, 0.4]), PROFILE, runs_locally=False)
    assert loaded.busy and abs(loaded.ratio - 2.0) < 1e-9
    assert loaded.tolerance == 0.10  # the calibration's own spread (5 %) is below the acceptance bound
    wide = ComputeProfile(PROFILE.shards, PROFILE.shard_s, 0.05, 1.0, [0.7, 1.0, 1.5])
    assert not ComputeCheck.of(timeline("real", [0.15, 0.15, 0.15, 0.3]), wide, runs_locally=False).busy
    faster = ComputeCheck.of(timeline("real", [0.05, 0.05, 0.05, 0.1]), PROFILE, runs_locally=False)
    assert faster.busy  # a run far faster than calibrated says the calibration was taken on a busy machine
    local = Timeline("local", "real", latency_s=1.5)
    assert ComputeCheck.of(local, PROFILE, runs_locally=True).busy
    assert ComputeCheck.of(timeline("sim", [0.2] * 4), PROFILE, runs_locally=False) is None  # nothing measured


def test_the_table_says_which_clock_and_why_a_row_is_suspect():
    res = {"summary": {"clock": "real", "latency_s": 0.4, "compute_s": 0.5,
                       "compute_check": ComputeCheck(1.0, 0.5, 0.1).to_dict()},
           "below_floor": 0.45, "sim_latency_s": 0.61, "metrics": {}}
    note = machine_note(res)
    assert "machine busy during the run: compute 1.00 s vs 0.50 s calibrated (2.00×" in note
    assert "below the oracle's floor (0.450 s)" in note and "simulated from the calibration: 0.610 s" in note
    row = compare_rows({"sakura": res})[0]
    assert row[1] == "real" and row[2] == 0.4 and row[3] == 0.61 and row[7] == "1.00 / 0.50" and row[-1] == note
    assert machine_note({"summary": {"clock": "sim", "latency_s": 0.5}}) == ""
    faster = {"summary": {"compute_check": ComputeCheck(0.5, 1.0, 0.1).to_dict()}}
    assert machine_note(faster).startswith("calibrated while the machine was busier: compute 0.50 s vs 1.00 s")


def _spin(stop) -> None:
    while not stop.is_set():
        pass


@contextmanager
def busy_loops(n: int):
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def test_an_edit_under_load_is_flagged_and_simulated_beside(fs_packs):
    packs, tpl = fs_packs
    with InProcessBridge(packs_dir=packs, calibration_repeats=2) as bridge:
        bridge.warmup(tpl.id)  # calibrated before the load, as the demo does behind the page
        job = Job(tpl.id, "oracle", catalog_request=0, reference_output=False,
                  network=NetworkSpec("fixed:2000", start=0.0, regime="none"))
        with busy_loops(2 * (os.cpu_count() or 2)):
            result = bridge.edit(job)
        check = result["summary"]["compute_check"]
        assert check["busy"], check  # the oracle's masked run took longer than its calibrated shards
        assert check["ratio"] > 1 + check["tolerance"]

        page = EditPage(bridge, bridge.templates())
        progress = EditProgress(system="SAKURA")
        progress.result = result
        said = list(page._check_machine({"sakura": job}, {"sakura": progress}))  # the page's status meanwhile
        assert len(said) == 1 and "simulated clock" in said[0]
        sim = result["sim_latency_s"]
        assert isinstance(sim, float) and sim < result["summary"]["latency_s"]  # the calibrated replay
        assert "machine busy" in machine_note(result) and "simulated from the calibration" in machine_note(result)


def test_a_simulated_timeline_travels_whole_and_is_drawn_from_the_result():
    tl = timeline("sim", [0.1, 0.1, 0.1, 0.2])
    tl.fallbacks.append({"kind": "local", "shard": 2, "t": 0.9, "predicted_end_s": 3.0})
    progress = EditProgress(system="IntQ")
    progress.apply({"type": "result", "summary": tl.summary(), "timeline": tl.to_dict()})
    assert progress.timeline == tl and progress.timeline.fallbacks[0]["kind"] == "local"
    broken = EditProgress(system="IntQ")
    broken.apply({"type": "result", "summary": {"latency_s": 1.0}, "timeline": {"shards": [{"layers": 3}]}})
    assert broken.result is not None and broken.timeline.latency_s == 1.0  # a malformed one is ignored
