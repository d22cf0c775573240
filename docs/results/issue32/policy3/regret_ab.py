"""Paired A/B of SAKURA's regret in `sakura bench --figure regret` runs of the same offsets: per workload, on the
edits every run has, latency p50 / p90, latency / optimal at equal quality, the optimum's masked PSNR − own at
equal latency (raw and visible: each PSNR at most the display's 58.9 dB) and the mean masked PSNR (capped at the
display's too).

    python docs/results/issue32/policy3/regret_ab.py RUN [RUN ...]    # folders or records files; the first: the base
"""

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from sakura.eval.plots import load_records
from sakura.eval.regret import DISPLAY_PSNR_DB, visible_gap_db


def key(r: dict) -> tuple:
    return r["workload"], r["template"], r["request"], round(r["start_s"], 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--system", default="sakura")
    a = ap.parse_args()
    runs = [{key(r): r for r in load_records(d) if r["system"] == a.system and r.get("regret")} for d in a.runs]
    common = set(runs[0]).intersection(*runs[1:])
    by = defaultdict(list)
    for k in sorted(common):
        by[k[0]].append(k)
    print("| workload | edits | run | latency p50 / p90 (s) | latency / optimal p50 / p90 | PSNR gap p50 / p90 (dB) "
          "| visible gap p50 / p90 (dB) | mean masked PSNR, capped (dB) |\n|---|---|---|---|---|---|---|---|")
    for w, keys in by.items():
        for path, run in zip(a.runs, runs):
            rs = [run[k] for k in keys]
            lat = [r["latency_s"] for r in rs]
            ratio = [r["regret"]["latency_ratio"] for r in rs]
            gap = [r["regret"]["psnr_gap_db"] for r in rs]
            vis = [visible_gap_db(r["regret"]["optimal_psnr_masked"], r["psnr_masked"]) for r in rs]
            capped = [min(r["psnr_masked"], DISPLAY_PSNR_DB) for r in rs]
            name = path.name.split("-records")[0] if path.is_file() else path.name
            print(f"| {w} | {len(keys)} | {name} | {np.median(lat):.3f} / {np.percentile(lat, 90):.3f} | "
                  f"{np.median(ratio):.3f} / {np.percentile(ratio, 90):.3f} | {np.median(gap):.1f} / "
                  f"{np.percentile(gap, 90):.1f} | {np.median(vis):.1f} / {np.percentile(vis, 90):.1f} | "
                  f"{np.mean(capped):.2f} |")


if __name__ == "__main__":
    main()
