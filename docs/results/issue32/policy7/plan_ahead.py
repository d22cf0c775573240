"""Would a plan made at the edit's start, on the rate the device predicts, find the clairvoyant optimum's trade?
For each SAKURA edit of a `sakura bench --figure regret` run: the planner's least-error schedule within the run's
latency on a *constant* link at the device's first rate estimate × γ (what SAKURA knows at 0 s), then that schedule's
latency on the true link (the planner's model) and its replayed masked PSNR; beside SAKURA's own and the clairvoyant
optimum's at equal latency (from the record). Open loop: nothing is re-planned as rates are learnt (issue #32,
session 27).

    python docs/results/issue32/policy7/plan_ahead.py RECORDS --trace ../shared/traces/5g-driving-236s.csv \\
        --calibration docs/results/issue32/headline/calibration.json [--workloads fs,vton,mb] [--packs DIR] \\
        [--margin 0.8]
"""

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "policy3"))

from one_session import prepared, session_at  # noqa: E402

from sakura.eval import bench  # noqa: E402
from sakura.eval.bench import edit_input  # noqa: E402
from sakura.eval.optimal import least_error  # noqa: E402
from sakura.eval.plan_model import STREAM, evaluate  # noqa: E402
from sakura.eval.plots import load_records  # noqa: E402
from sakura.eval.regret import format_inputs, plan_problem, replay_output  # noqa: E402
from sakura.net.traces import Trace  # noqa: E402
from sakura.online.policies import DEFAULT_GAMMA  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("records", type=Path)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--workloads", default="fs,vton,mb")
    ap.add_argument("--packs", default=None)
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per solve")
    ap.add_argument("--margin", type=float, default=DEFAULT_GAMMA, help="the predicted rate's share of the first "
                    "estimate (SAKURA's γ by default)")
    a = ap.parse_args()
    rows, cache = [], {}
    for r in load_records(a.records):
        if r["system"] != "sakura" or r["workload"] not in a.workloads.split(",") or not r.get("regret"):
            continue
        key = (r["workload"], r["template"])
        if key not in cache:
            cache[key] = prepared(argparse.Namespace(workload=r["workload"], template=r["template"], trace=a.trace,
                                                     calibration=a.calibration, packs=a.packs))
        p, scaled = cache[key]
        session = session_at(p, scaled, r["start_s"])
        report = session.edit(edit_input(p, r["request"]), clock="sim", timer=bench.REBUILD_CLOCKS["cpu"])
        inputs = format_inputs(p, "sakura", lambda msg: None)
        true = plan_problem(session, inputs)
        seen = Trace.constant(session.initial_bps / 1e6 * a.margin)
        predicted = replace(true, link=replace(true.link, trace=seen, start_s=0.0))
        plan = least_error(predicted, report.timeline.latency_s, budget_s=a.budget)
        if plan.schedule is None or any(x.kind != STREAM for x in plan.schedule.actions):
            print(f"{r['template']} #{r['request']} @{r['start_s']:.1f}: no streamed plan on the predicted link")
            continue
        on_true = evaluate(true, plan.schedule.actions)
        image = replay_output(session, report.request, true, plan.schedule)
        psnr = float(session.quality(image, report.request, r["request"])["psnr_masked"])
        row = (r["workload"], report.timeline.latency_s, report.quality["psnr_masked"], on_true.latency_s, psnr,
               r["regret"]["optimal_psnr_masked"])
        rows.append(row)
        print(f"{r['template']} #{r['request']} @{r['start_s']:.1f}: SAKURA {row[1]:.3f} s {row[2]:.1f} dB · "
              f"plan ahead {row[3]:.3f} s {row[4]:.1f} dB · optimum at SAKURA's latency {row[5]:.1f} dB", flush=True)
    for w in a.workloads.split(","):
        x = np.array([row[1:] for row in rows if row[0] == w])
        if len(x):
            print(f"{w}: {len(x)} edits; latency plan / SAKURA p50 {np.median(x[:, 2] / x[:, 0]):.3f} p90 "
                  f"{np.percentile(x[:, 2] / x[:, 0], 90):.3f}; masked PSNR − SAKURA's p50 "
                  f"{np.median(x[:, 3] - x[:, 1]):+.1f} dB (capped at 58.9: "
                  f"{np.median(np.minimum(x[:, 3], 58.9) - np.minimum(x[:, 1], 58.9)):+.2f}); optimum − SAKURA p50 "
                  f"{np.median(x[:, 4] - x[:, 1]):+.1f} dB")


if __name__ == "__main__":
    main()
