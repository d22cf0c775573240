"""Paired A/B of two bench runs of the same offsets (same seed, trace, --trace-part): per workload and system,
latency p50/p90, masked PSNR mean/p10, edits with a reuse / a local fallback, and the paired differences.

    python docs/results/issue32/policy2/ab.py BEFORE AFTER [--system sakura]      (folders or records files)
"""

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from sakura.eval.plots import load_records


def key(r: dict) -> tuple:
    return r["workload"], r["template"], r["request"], round(r["start_s"], 4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--system", default="sakura")
    a = ap.parse_args()
    runs = [{key(r): r for r in load_records(d) if r["system"] == a.system} for d in (a.before, a.after)]
    common = sorted(set(runs[0]) & set(runs[1]))
    by = defaultdict(list)
    for k in common:
        by[k[0]].append((runs[0][k], runs[1][k]))
    print("| workload | edits | run | latency p50 / p90 (s) | masked PSNR mean / p10 (dB) | reuse / local edits |")
    print("|---|---|---|---|---|---|")
    for w, pairs in by.items():
        for i, name in enumerate(("before", "after")):
            lat = np.array([p[i]["latency_s"] for p in pairs])
            psnr = np.array([min(p[i]["psnr_masked"], 100.0) for p in pairs])
            reuse = sum("reuse" in p[i]["fallbacks"] for p in pairs)
            local = sum("local" in p[i]["fallbacks"] for p in pairs)
            print(f"| {w} | {len(pairs)} | {name} | {np.median(lat):.3f} / {np.percentile(lat, 90):.3f} | "
                  f"{psnr.mean():.1f} / {np.percentile(psnr, 10):.1f} | {reuse} / {local} |")
        d_lat = np.array([p[1]["latency_s"] / p[0]["latency_s"] for p in pairs])
        d_psnr = np.array([min(p[1]["psnr_masked"], 100.0) - min(p[0]["psnr_masked"], 100.0) for p in pairs])
        print(f"| {w} | | after / before | ratio p50 {np.median(d_lat):.3f}, p90 {np.percentile(d_lat, 90):.3f} | "
              f"Δ mean {d_psnr.mean():+.1f}, worst {d_psnr.min():+.1f}, best {d_psnr.max():+.1f} | |")


if __name__ == "__main__":
    main()
