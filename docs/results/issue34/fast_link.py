"""Issue #34's checks on a bench run's records (simulated clock): per workload, SAKURA against FP16 with masked
PSNR capped at 90 dB, and which ladder rungs SAKURA used.

    python docs/results/issue34/fast_link.py RUN/records.jsonl

Prints per workload and system: edits, latency p50 / mean, mean masked PSNR (each edit capped at 90 dB), mean
MB sent; then, per workload, SAKURA's latency over FP16's (p50 and mean) and its capped PSNR minus FP16's,
with the issue's bounds (≤ 1.05×, ≥ −1 dB); then SAKURA's fetch units by kind: allocated levels, residual
rungs (res1..res8), exact rung.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import numpy as np

CAP = 90.0


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r.get("workload") or r["template"].split("-")[0], r["system"]), []).append(r)
    print("| workload | system | edits | latency p50 s | latency mean s | masked PSNR (capped 90) dB | MB sent |")
    print("|---|---|---|---|---|---|---|")
    stats = {}
    for (w, s), rs in sorted(groups.items()):
        lat = np.array([r["latency_s"] for r in rs])
        psnr = float(np.mean([min(CAP, r["psnr_masked"]) for r in rs]))
        stats[(w, s)] = (float(np.median(lat)), float(lat.mean()), psnr)
        print(f"| {w} | {s} | {len(rs)} | {np.median(lat):.3f} | {lat.mean():.3f} | {psnr:.2f} | "
              f"{np.mean([r['bytes'] for r in rs]) / 1e6:.2f} |")
    workloads = sorted({w for w, _ in stats})
    if any((w, "fp16") in stats and (w, "sakura") in stats for w in workloads):
        print("\n| workload | SAKURA / FP16 latency p50 | mean | SAKURA − FP16 masked PSNR dB | ≤ 1.05× and ≥ −1 dB |")
        print("|---|---|---|---|---|")
        for w in workloads:
            if (w, "fp16") in stats and (w, "sakura") in stats:
                (sp, sm, sq), (fp, fm, fq) = stats[(w, "sakura")], stats[(w, "fp16")]
                ok = sp <= 1.05 * fp and sm <= 1.05 * fm and sq >= fq - 1
                print(f"| {w} | {sp / fp:.3f} | {sm / fm:.3f} | {sq - fq:+.2f} | {'yes' if ok else 'NO'} |")
    print("\n| workload | SAKURA fetch units | allocated levels | residual rungs | exact rung | rungs used |")
    print("|---|---|---|---|---|---|")
    for w in workloads:
        rs = groups.get((w, "sakura"), [])
        kinds = Counter(g for r in rs for g in (r.get("rungs") or [""] * len(r["levels"])))
        total = sum(kinds.values())
        res = sum(n for k, n in kinds.items() if k.startswith("res"))
        used = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()) if k)
        print(f"| {w} | {total} | {kinds.get('', 0)} | {res} | {kinds.get('exact', 0)} | {used or '–'} |")


if __name__ == "__main__":
    main(sys.argv[1])
