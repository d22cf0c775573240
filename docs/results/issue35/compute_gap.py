"""Where the simulated clock and the real ones differ: per workload and system, over the edits no run fell back
on, the median of latency − stall (the edit's own work: prelude, shard execution, rebuilds not hidden by a
transfer) and the p90 of the stall (execution waiting for the cache), on each of the four links.

    python docs/results/issue35/compute_gap.py --sim RUN --sim-tcp RUN --paced RUN --kernel RUN
"""

import argparse
from pathlib import Path

import numpy as np

from sakura.eval.plots import load_records
from sakura.eval.realclock import LINK_RUNS


def main() -> None:
    ap = argparse.ArgumentParser()
    for run in LINK_RUNS:
        ap.add_argument(f"--{run}", type=Path, required=run == "kernel")
    a = vars(ap.parse_args())
    names = [run for run in LINK_RUNS if a[run.replace("-", "_")] is not None]
    runs = {run: {(r["workload"], r["template"], r["request"], r["system"], round(r["start_s"], 6)): r
                  for r in load_records(a[run.replace("-", "_")])} for run in names}
    print("| workload | system | edits | latency − stall, median (s): " + " / ".join(names)
          + " | stall p90 (s): " + " / ".join(names) + " |")
    print("|---|---|---|---|---|")
    for w, s in sorted({k[0::3][:2] for k in runs["kernel"]}, key=lambda ws: (ws[0], ws[1])):
        keys = [k for k in runs["kernel"] if (k[0], k[3]) == (w, s) and all(k in runs[n] and not runs[n][k]["fallbacks"]
                                                                           for n in names)]
        if not keys:
            continue
        own = [np.median([runs[n][k]["latency_s"] - runs[n][k]["stall_s"] for k in keys]) for n in names]
        stall = [np.percentile([runs[n][k]["stall_s"] for k in keys], 90) for n in names]
        print(f"| {w} | {s} | {len(keys)} | {' / '.join(f'{x:.3f}' for x in own)} | "
              f"{' / '.join(f'{x:.3f}' for x in stall)} |")


if __name__ == "__main__":
    main()
