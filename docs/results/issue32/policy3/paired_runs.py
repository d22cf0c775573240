"""Two headline runs (`sweep.sh` folders, one per trace), SAKURA edit by edit on the same offsets: latency ratio
(after / before) p50 / p90, mean masked PSNR change (at most 100 dB, and at most the display's 58.9 dB), and how
many edits moved by more than 0.5 dB (capped) either way. Two bench runs of one trace (their folders or records
files, as an A/B keeps them) compare the same way.

    python docs/results/issue32/policy3/paired_runs.py BEFORE AFTER [--system sakura]
"""

import argparse
from pathlib import Path

import numpy as np

from sakura.eval.plots import load_records
from sakura.eval.regret import DISPLAY_PSNR_DB

TRACES = ("5g-walking-603s", "5g-driving-236s", "4g-driving-250s", "4g5g-mixed-600s")


def records(run: Path, trace: str, system: str) -> dict:
    folder = run / trace if trace else run
    path = folder / "records.jsonl.gz" if (folder / "records.jsonl.gz").is_file() else folder
    return {(r["workload"], r["template"], r["request"], round(r["start_s"], 3)): r
            for r in load_records(path) if r["system"] == system}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--system", default="sakura")
    a = ap.parse_args()
    print("| trace | workload | latency after / before p50 / p90 | masked PSNR Δ mean (≤ 100 dB) | capped at 58.9 dB: "
          "Δ mean | edits better / worse by > 0.5 dB (capped) |\n|---|---|---|---|---|---|")
    for trace in TRACES if (a.before / TRACES[0]).is_dir() else ("",):  # (a sweep, or one run)
        before, after = records(a.before, trace, a.system), records(a.after, trace, a.system)
        for w in dict.fromkeys(k[0] for k in before):
            keys = [k for k in before if k in after and k[0] == w]
            ratio = [after[k]["latency_s"] / before[k]["latency_s"] for k in keys]
            raw = [min(after[k]["psnr_masked"], 100) - min(before[k]["psnr_masked"], 100) for k in keys]
            capped = [min(after[k]["psnr_masked"], DISPLAY_PSNR_DB) - min(before[k]["psnr_masked"], DISPLAY_PSNR_DB)
                      for k in keys]
            print(f"| {trace} | {w} | {np.median(ratio):.3f} / {np.percentile(ratio, 90):.3f} | {np.mean(raw):+.1f} | "
                  f"{np.mean(capped):+.2f} | {sum(x > 0.5 for x in capped)} / {sum(x < -0.5 for x in capped)} |")


if __name__ == "__main__":
    main()
