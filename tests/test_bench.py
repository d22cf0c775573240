"""`sakura bench` end to end on a tiny sweep: the summary contract, figures, and the projection."""

import gzip
import json
import math

import numpy as np
import pytest

from sakura.eval import bench, figures
from sakura.eval.plots import load_records
from sakura.eval.projection import project_paper
from sakura.eval.regret import DISPLAY_PSNR_DB, regret_stats, visible_gap_db
from sakura.net.traces import Trace, TraceError, load_trace


def test_bench_summary_contract_and_figures(fs_workload_packs, tmp_path):
    packs, _ = fs_workload_packs
    # one calibration file for both runs below (the projection reads what the sweep measured), two masked runs
    # per template: the regime and the summary are computed from whatever was measured
    calibration = {"calibration_file": tmp_path / "calibration.json", "repeats": 2}
    cfg = bench.BenchConfig(workloads=("fs",), systems=("sakura", "intq", "cachegen", "fp16", "local", "oracle"),
                            starts=2, packs=packs, max_rank=32, **calibration)
    cache: dict = {}
    written = figures.run(cfg, tmp_path, figure="12", progress=None, say=lambda s: None)
    summary = json.loads((tmp_path / "summary.json").read_text())
    fs = summary["workloads"]["fs"]
    for system in cfg.systems:
        for key in ("latency_p50_s", "latency_p90_s", "stall_s_mean", "bytes_mean", "psnr_mean", "ssim_mean",
                    "psnr_masked_mean", "storage_bytes", "device_peak_cache_bytes", "device_peak_rss_bytes"):
            assert key in fs[system], (system, key)
    for key in ("local_full_s", "fp16_transfer_s_at_median", "trace_scale"):
        assert fs["regime"][key] > 0
    # the paper regime: FP16 transfer at the median / local generation = 23 / 13 (per template; the
    # block reports means over the workload's templates, hence the small tolerance)
    assert abs(fs["regime"]["fp16_transfer_s_at_median"] / fs["regime"]["local_full_s"] / (23 / 13) - 1) < 0.03
    assert fs["oracle"]["psnr_mean"] == 100.0 and fs["oracle"]["bytes_mean"] == 0
    fp16 = fs["fp16"]  # exact wherever the edit streamed it all (a local fallback may cut a slow FP16 edit short)
    assert (
        fp16["psnr_masked_without_fallbacks"] in (None, 100.0)
        and fp16["bytes_mean"] <= fs["regime"]["fp16_cache_bytes"]
    )
    assert (fp16["bytes_mean"] == fs["regime"]["fp16_cache_bytes"]) == (fp16["fallback_rate"] == 0)
    assert set(fs["sakura"]["fallbacks_mean"]) <= {"reuse", "recompute", "local"}
    # (what FP16 streams when it streams it all: a recompute or local fallback can cut its bytes below SAKURA's)
    assert fs["sakura"]["bytes_mean"] < fs["regime"]["fp16_cache_bytes"]
    assert fs["sakura"]["storage_bytes"] < fs["fp16"]["storage_bytes"]
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == 2 * len(cfg.systems)
    assert all(p.exists() for p in written)
    assert "| SAKURA |" in (tmp_path / "summary.md").read_text()
    # the paper-scale projection reuses the prepared templates and labels itself as one
    paths = project_paper(bench.BenchConfig(workloads=("fs",), systems=("sakura", "local"), starts=2, packs=packs,
                                            max_rank=32, **calibration), tmp_path, "flux2-klein-4b", cache, None,
                          lambda s: None)
    proj = json.loads(paths[0].read_text())
    assert proj["label"].startswith("PROJECTION")
    assert proj["workloads"]["fs"]["systems"]["local"]["latency_p50_s"] == 13.0


def test_bench_regret_against_each_systems_clairvoyant_optimum(fs_workload_packs, tmp_path):
    packs, template = fs_workload_packs
    # the builder measured the per-level errors of the formats whose stored ones only order their levels
    assert all((packs / f"{template.id}.{fmt}.errors.json").is_file() for fmt in ("intq", "cachegen"))
    cfg = bench.BenchConfig(workloads=("fs",), systems=("sakura", "intq", "cachegen"), starts=1, packs=packs,
                            max_rank=32, calibration_file=tmp_path / "calibration.json", repeats=2, regret_budget_s=5.0,
                            window_rule=True)
    written = figures.run(cfg, tmp_path, figure="regret", progress=None, say=lambda s: None)
    fs = json.loads((tmp_path / "summary.json").read_text())["workloads"]["fs"]
    rows = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert {r["system"] for r in rows} == {"sakura", "intq", "cachegen", "sakura+perfect", "sakura+rule"}
    for r in rows:
        g = r["regret"]
        assert g["optimal_latency_s"] > 0
        assert g["latency_ratio"] == pytest.approx(r["latency_s"] / g["optimal_latency_s"])
        assert g["exact"] or g["gap"] >= 0  # a solve that stopped early says how far from proven it is
        assert g["quality_source"] == "replayed" and g["equal_quality_psnr_masked"] is not None
        # with no bound on any unit the edit can only be as fast or faster; (b)'s schedule is kept per shard
        assert 0 < g["fastest_latency_s"] <= g["optimal_latency_s"] + 1e-9
        assert len(g["equal_latency_actions"]) == r["shards"]
        assert g["psnr_gap_visible_db"] == pytest.approx(
            min(g["optimal_psnr_masked"], DISPLAY_PSNR_DB) - min(r["psnr_masked"], DISPLAY_PSNR_DB))
    for system in ("sakura", "intq", "cachegen", "sakura+perfect", "sakura+rule"):
        reg = fs[system]["regret"]
        assert set(reg["latency_over_optimal"]) == {"p50", "p90"} and set(reg["psnr_gap_db"]) == {"p50", "p90"}
        assert reg["psnr_gap_visible_db"]["p90"] <= max(0.0, reg["psnr_gap_db"]["p90"]) + 1e-9
    assert set(fs["regret_decomposition"]) >= {"estimator", "policy", "psnr_gain_db"}
    assert (tmp_path / "fig_regret.png") in written and (tmp_path / "fig_regret.png").is_file()


def test_the_visible_gap_counts_no_difference_above_the_displays_rounding():
    assert DISPLAY_PSNR_DB == pytest.approx(58.92, abs=0.01)  # rounding to 8 bits: RMS 1/√12 of a level
    assert visible_gap_db(100.0, 70.0) == 0.0  # both closer to the reference than the display shows
    assert visible_gap_db(62.8, 54.9) == pytest.approx(DISPLAY_PSNR_DB - 54.9)
    assert visible_gap_db(45.0, 48.0) == pytest.approx(-3.0)
    assert math.isnan(visible_gap_db(None, 50.0))
    # summaries of records from before the field derive it from the two PSNRs
    rows = [{"regret": {"latency_ratio": 1.0, "psnr_gap_db": 30.0, "optimal_psnr_masked": 100.0, "error_gap": 0.0,
                        "exact": True, "gap": 0.0, "planner_s": 1.0}, "psnr_masked": 70.0},
            {"regret": {"latency_ratio": 1.0, "psnr_gap_db": 4.0, "optimal_psnr_masked": 50.0, "error_gap": 0.0,
                        "exact": True, "gap": 0.0, "planner_s": 1.0}, "psnr_masked": 46.0}]
    for r in rows:
        r["regret"]["psnr_masked"] = r["psnr_masked"]
    stats = regret_stats(rows)
    assert stats["psnr_gap_visible_db"]["p50"] == pytest.approx(2.0)  # the median of 0 and 4
    assert stats["psnr_gap_db"]["p50"] == pytest.approx(17.0)


def test_pack_versions_pairs_each_edit_with_its_v1_twin():
    from sakura.eval.pack_versions import paired

    def row(system, start, latency, psnr):
        return {"template": "t", "request": 0, "system": system, "start_s": start, "latency_s": latency,
                "psnr_masked": psnr, "bytes": 1, "fallbacks": {}}

    rows = [row("sakura", 1.0, 0.50, 60), row("sakura-v1", 1.0, 0.60, 55),  # sooner
            row("sakura", 2.0, 0.9004, 61), row("sakura-v1", 2.0, 0.9, 56),  # the same, within 1 ms
            row("sakura-v1", 3.0, 1.0, 50), row("sakura", 3.0, 1.25, 49),  # later, rows in either order
            row("sakura", 4.0, 9.0, 1)]  # no twin: left out
    p = paired(rows)
    assert (p["faster"], p["same"], p["slower"]) == (1, 1, 1) and len(p["edits"]) == 3
    assert p["latency_delta_max_s"] == pytest.approx(0.25) and p["latency_delta_min_s"] == pytest.approx(-0.1)
    assert p["psnr_masked_delta_median_db"] == 5
    assert p["edits"][2]["latency_s"] == [1.25, 1.0]


def test_start_offsets_come_from_the_asked_part_of_the_trace():
    trace = load_trace("5g")
    parts = {}
    for part in ("all", "first", "second"):
        cfg = bench.BenchConfig(starts=200, trace_part=part)
        parts[part] = bench.start_offsets(np.random.default_rng(0), trace, cfg)
    half = trace.duration / 2
    assert parts["first"].max() < half <= parts["second"].min()
    assert parts["all"].min() < half <= parts["all"].max()
    with pytest.raises(KeyError):
        bench.start_offsets(np.random.default_rng(0), trace, bench.BenchConfig(trace_part="middle"))


def test_outage_offsets_start_each_edit_just_before_a_dead_stretch():
    trace = Trace(np.array([0.0, 10.0, 11.0, 50.0, 52.0, 100.0]), np.array([20.0, 0.0, 20.0, 0.0, 20.0]))
    assert trace.dead_stretches() == [(10.0, 11.0), (50.0, 52.0)]
    starts = bench.start_offsets(np.random.default_rng(0), trace, bench.BenchConfig(starts=40, trace_part="outages"))
    before = np.array([10.0, 50.0] * 20) - starts
    assert ((before > 0) & (before <= bench.OUTAGE_LEAD_S)).all()
    with pytest.raises(TraceError, match="no dead stretch"):
        bench.start_offsets(np.random.default_rng(0), Trace.constant(5.0), bench.BenchConfig(trace_part="outages"))


def test_the_link_check_compares_every_run_with_the_kernel_link_on_the_edits_that_cross_an_outage():
    from sakura.eval.realclock import link_check, link_table

    def rec(start, latency, outage=0.0):
        return {"workload": "fs", "template": "t", "request": 0, "system": "sakura", "start_s": start,
                "latency_s": latency, "bytes": 1, "levels": ["a"], "outage_s": outage}

    starts = [0.0, 1.0, 2.0, 3.0]
    runs = {"sim": [rec(s, 1.0) for s in starts], "sim-tcp": [rec(s, 1.0 if s else 2.0) for s in starts],
            "kernel": [rec(s, 1.0, 0.0) for s in starts[1:]] + [rec(0.0, 2.5, 0.4)]}
    check = link_check(runs)["fs"]["sakura"]
    assert check["kernel"]["trough_edits"] == 1 and check["sim"]["trough_ratio_to_kernel"] == pytest.approx(0.4)
    assert check["sim-tcp"]["trough_ratio_to_kernel"] == pytest.approx(0.8)
    assert check["sim"]["p90_ratio_to_kernel"] < check["sim-tcp"]["p90_ratio_to_kernel"] <= 1.0
    assert "| fs | sakura | sim-tcp |" in link_table({"fs": {"sakura": check}})


def test_records_load_from_a_run_folder_or_a_kept_records_file(tmp_path):
    rows = [{"system": "sakura", "latency_s": 0.3}, {"system": "fp16", "latency_s": 1.4}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "records.jsonl").write_text(text)
    (tmp_path / "kept.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    assert load_records(tmp_path) == load_records(tmp_path / "kept.jsonl.gz") == rows
