"""One headline edit of SAKURA run as the bench runs it (simulated clock, rebuilds on the CPU clock, the calibration
replayed) and measured against its optimum, once per value of ``PREDICTION_SLACK`` (the stall's display floor):
what the floor alone does to that edit.

    python docs/results/issue32/policy15/one_edit_slack.py fs fs-grace-hopper 0 380.936 \
        ../shared/traces/4g5g-mixed-600s.csv --packs PACKS --slack 1,2 \
        --calibration docs/results/issue32/headline/calibration.json
"""

import argparse
from pathlib import Path

import torch

from sakura.eval import bench
from sakura.eval.bench import BenchConfig, regime_scales, run_one, workload_benches
from sakura.net.traces import load_trace
from sakura.online import plan
from sakura.runtime.session import DeviceRuntime


def headline_edit(extra=lambda ap: None):
    """The arguments naming one headline edit (``extra`` adds more), and its template's bench on the trace scaled
    to the paper's regime, as the bench prepares them: (args, the template's bench, the scaled trace)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("template")
    ap.add_argument("request", type=int)
    ap.add_argument("start", type=float, help="the record's start_s")
    ap.add_argument("trace", type=Path)
    ap.add_argument("--packs", type=Path, required=True)
    ap.add_argument("--calibration", type=Path, required=True)
    extra(ap)
    a = ap.parse_args()
    torch.set_num_threads(1)
    bench.use_rebuild_clock("cpu")
    cfg = BenchConfig(workloads=(a.workload,), systems=("sakura",), trace=str(a.trace), packs=a.packs,
                      calibration_file=a.calibration)
    prepared = {p.template.id: p for p in workload_benches(a.workload, cfg, {}, lambda *_: None)}
    base = load_trace(str(a.trace))
    return a, prepared[a.template], base.scaled(regime_scales(list(prepared.values()), base, cfg)[a.template])


def main() -> None:
    def extra(ap):
        ap.add_argument("--slack", default="1,2", help="values of PREDICTION_SLACK, comma-separated")
        ap.add_argument("--no-prior", action="store_true", help="rebuilds predicted free until the edit times one "
                        "(as before the device's calibration timed them, policy16)")

    a, prepared, scaled = headline_edit(extra)
    if a.no_prior:
        DeviceRuntime.rebuild_prior = lambda *_, **__: 0.0
    for slack in (float(s) for s in a.slack.split(",")):
        plan.UNSEEN_PREDICTED_MSE = plan.DISPLAY_MSE / slack
        row = run_one(prepared, a.request, "sakura", scaled, a.start, regret_budget_s=5,
                      say=lambda *_: None)
        g = row["regret"]
        print(f"slack {slack:g}: latency {row['latency_s']:.4f} s ({g['latency_ratio']:.3f} × optimal), masked PSNR "
              f"{row['psnr_masked']:.2f} dB, the optimum at equal latency {g['optimal_psnr_masked']:.2f} "
              f"(visible gap {g['psnr_gap_visible_db']:.2f}); levels {' · '.join(row['levels'])}")


if __name__ == "__main__":
    main()
