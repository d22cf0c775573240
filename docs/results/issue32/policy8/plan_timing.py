"""How long one plan takes (`sakura.online.plan.plan_levels`) inside real edits: three offsets of 5G driving per
template, one torch thread, every request's plan timed.

    python docs/results/issue32/policy8/plan_timing.py --trace ../shared/traces/5g-driving-236s.csv \\
        --calibration docs/results/issue32/headline/calibration.json [--packs DIR]
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "policy3"))

from one_session import prepared, session_at  # noqa: E402

from sakura.eval import bench  # noqa: E402
from sakura.eval.bench import edit_input  # noqa: E402
from sakura.online import policies  # noqa: E402
from sakura.online.policies import PLAN_SETTINGS, SakuraPolicy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--packs", default=None)
    a = ap.parse_args()
    times: list[float] = []
    plan = policies.plan_levels

    def timed(*args, **kw):
        t = time.perf_counter()
        out = plan(*args, **kw)
        times.append(time.perf_counter() - t)
        return out

    policies.plan_levels = timed
    for workload, template in (("vton", "vton-astronaut"), ("fs", "fs-astronaut"), ("mb", "mb-coffee")):
        p, scaled = prepared(argparse.Namespace(workload=workload, template=template, trace=a.trace,
                                                calibration=a.calibration, packs=a.packs))
        times.clear()
        for start in (30.0, 60.0, 90.0):
            session = session_at(p, scaled, start, policy=SakuraPolicy(**PLAN_SETTINGS))
            session.edit(edit_input(p, 0), clock="sim", timer=bench.REBUILD_CLOCKS["cpu"])
        print(f"{template}: {len(times)} plans, {1e3 * np.median(times):.1f} ms p50, {1e3 * max(times):.1f} ms max")


if __name__ == "__main__":
    main()
