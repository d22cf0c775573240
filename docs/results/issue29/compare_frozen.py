"""Two `sakura bench` runs on one frozen set of packs and calibration, simulated clock, `--rebuild-clock tick`:
are they the same edit for edit? Prints per system the p50 / p90 latency and mean bytes of each run, and
every edit whose latency, levels, bytes, fallbacks or quality differ.

    python docs/results/issue29/compare_frozen.py BEFORE/records.jsonl AFTER/records.jsonl
"""

from __future__ import annotations

import json
import sys

import numpy as np

FIELDS = ("latency_s", "stall_s", "bytes", "levels", "cuts", "fallbacks", "psnr_masked", "ssim_masked")


def load(path: str) -> dict:
    rows = [json.loads(line) for line in open(path)]
    return {(r.get("workload"), r["template"], r["request"], r["system"], round(r["start_s"], 6)): r for r in rows}


def table(rows: dict, title: str) -> None:
    print(f"\n{title}\n| workload | system | p50 s | p90 s | mean MB | masked PSNR dB |\n|---|---|---|---|---|---|")
    groups: dict = {}
    for (w, _, _, s, _), r in rows.items():
        groups.setdefault((w, s), []).append(r)
    for (w, s), rs in sorted(groups.items()):
        lat = [r["latency_s"] for r in rs]
        print(f"| {w} | {s} | {np.percentile(lat, 50):.4f} | {np.percentile(lat, 90):.4f} | "
              f"{np.mean([r['bytes'] for r in rs]) / 1e6:.4f} | {np.mean([r['psnr_masked'] for r in rs]):.3f} |")


def main(before: str, after: str) -> int:
    a, b = load(before), load(after)
    table(a, f"before ({before}, {len(a)} edits)")
    table(b, f"after ({after}, {len(b)} edits)")
    missing = sorted(set(a) ^ set(b))
    differ = [(k, f) for k in sorted(set(a) & set(b)) for f in FIELDS if a[k].get(f) != b[k].get(f)]
    print(f"\n{len(set(a) & set(b))} edits in both runs, {len(missing)} in one only, "
          f"{len({k for k, _ in differ})} differing ({len(differ)} fields)")
    for k, f in differ[:40]:
        print(f"  {k}: {f} {a[k].get(f)!r} -> {b[k].get(f)!r}")
    return 1 if missing or differ else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
