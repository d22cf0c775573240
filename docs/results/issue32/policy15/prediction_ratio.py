"""How far the plan's predicted error runs below the output: per workload, each SAKURA edit's masked MSE against the
FP16-cache output over the error its delivered levels were predicted to cause (the record's ``regret.error``: the
units' ``weight`` · level error, summed), at the median and p90.

    python docs/results/issue32/policy15/prediction_ratio.py RECORDS.jsonl.gz … > prediction-ratio.md
"""

import argparse
from pathlib import Path

import numpy as np

from sakura.eval.plots import load_records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("records", type=Path, nargs="+", help="bench records (records.jsonl.gz or a run folder)")
    a = ap.parse_args()
    rows = [r for f in a.records for r in load_records(f)
            if r["system"] == "sakura" and r.get("regret") and r["regret"].get("error", 0) > 0]
    print("| workload | edits | output MSE / predicted: p50 | p90 |")
    print("|---|---|---|---|")
    for wl in sorted({r["workload"] for r in rows}):
        ratio = [10 ** (-r["psnr_masked"] / 10) / r["regret"]["error"] for r in rows if r["workload"] == wl]
        p50, p90 = np.percentile(ratio, [50, 90])
        print(f"| {wl} | {len(ratio)} | {p50:.2f} | {p90:.2f} |")


if __name__ == "__main__":
    main()
