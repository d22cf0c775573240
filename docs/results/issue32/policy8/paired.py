"""Paired, edit by edit: one system's rows of a `sakura bench` run against another's (same offsets): latency ratio
p50 / p90, masked PSNR Δ (each at most the display's 58.9 dB: mean; raw: p50), edits better / worse by > 0.5 dB.

    python docs/results/issue32/policy8/paired.py RUN BASE_SYSTEM SYSTEM    # e.g. ab/plan-…gz sakura sakura+plan
"""

import argparse
from pathlib import Path

import numpy as np

from sakura.eval.plots import load_records
from sakura.eval.regret import DISPLAY_PSNR_DB


def rows(path: Path, system: str) -> dict:
    return {(r["workload"], r["template"], r["request"], round(r["start_s"], 3)): r
            for r in load_records(path) if r["system"] == system}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("base")
    ap.add_argument("system")
    a = ap.parse_args()
    base, mine = rows(a.run, a.base), rows(a.run, a.system)
    for w in dict.fromkeys(k[0] for k in base):
        ks = [k for k in base if k in mine and k[0] == w]
        ratio = [mine[k]["latency_s"] / base[k]["latency_s"] for k in ks]
        capped = [min(mine[k]["psnr_masked"], DISPLAY_PSNR_DB) - min(base[k]["psnr_masked"], DISPLAY_PSNR_DB)
                  for k in ks]
        raw = [mine[k]["psnr_masked"] - base[k]["psnr_masked"] for k in ks]
        print(f"{w}: {len(ks)} edits; latency ×{np.median(ratio):.3f} p50, ×{np.percentile(ratio, 90):.3f} p90; "
              f"capped Δ {np.mean(capped):+.2f} dB mean, raw Δ {np.median(raw):+.2f} dB p50; "
              f"better / worse {sum(c > .5 for c in capped)} / {sum(c < -.5 for c in capped)}")


if __name__ == "__main__":
    main()
