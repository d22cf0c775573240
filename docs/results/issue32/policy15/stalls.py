"""One headline edit of SAKURA on the simulated clock as the bench runs it, printing at every request the unit, the
stall budget left, the level asked for and the stall planned for it: where an edit's stall budget went.

    python docs/results/issue32/policy15/stalls.py fs fs-grace-hopper 0 354.4601696116715 \
        ../shared/traces/5g-walking-603s.csv --packs PACKS --calibration docs/results/issue32/headline/calibration.json
"""

import argparse
from pathlib import Path

import torch

from sakura.eval import bench
from sakura.eval.bench import BenchConfig, edit_input, regime_scales, workload_benches
from sakura.net.traces import load_trace
from sakura.online import policies
from sakura.runtime.session import Network


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("template")
    ap.add_argument("request", type=int)
    ap.add_argument("start", type=float, help="the record's start_s")
    ap.add_argument("trace", type=Path)
    ap.add_argument("--packs", type=Path, required=True)
    ap.add_argument("--calibration", type=Path, required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = BenchConfig(workloads=(a.workload,), systems=("sakura",), trace=str(a.trace), packs=a.packs,
                      calibration_file=a.calibration)
    prepared = {p.template.id: p for p in workload_benches(a.workload, cfg, {}, lambda *_: None)}
    base = load_trace(str(a.trace))
    scaled = base.scaled(regime_scales(list(prepared.values()), base, cfg)[a.template])
    choose = policies.SakuraPolicy.choose

    def printed(self, unit, now, deadline, monitor, horizon=None):
        d = choose(self, unit, now, deadline, monitor, horizon)
        if horizon is not None:
            print(f"unit {unit.index:2d} at {now * 1e3:6.1f} ms: budget left {horizon.stall_budget_s * 1e3:4.1f} ms, "
                  f"asks {d.level.label:22s} stall {d.stall_s * 1e3:4.1f} ms")
        return d

    policies.SakuraPolicy.choose = printed
    session = prepared[a.template].session("sakura", Network(scaled, scaled.name, a.start, scale=1.0))
    report = session.edit(edit_input(prepared[a.template], a.request), clock="sim", timer=bench.REBUILD_CLOCKS["cpu"],
                          with_reference=False)
    print(f"latency {report.timeline.latency_s:.4f} s")


if __name__ == "__main__":
    main()
