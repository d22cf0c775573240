"""Does the pack's error metric price a reuse like a compressed level? Over SAKURA's edits of bench runs with
regret records, fit masked PSNR = a + b · 10·log10(estimated error) on the edits without fallbacks, and report how far
the edits with a reuse sit from that fit (negative: the reuse cost more than its estimated error says).

    python docs/results/issue32/policy2/reuse_metric.py docs/results/issue32/headline/session21/*/records.jsonl.gz
"""

import ast
import gzip
import json
import sys
from collections import defaultdict

import numpy as np


def main() -> None:
    rows = defaultdict(list)  # workload -> (reuses, estimated error, masked PSNR)
    for path in sys.argv[1:]:
        for line in gzip.open(path, "rt"):
            r = json.loads(line)
            if r["system"] != "sakura" or not r.get("regret") or r.get("psnr_masked") is None:
                continue
            regret = ast.literal_eval(r["regret"]) if isinstance(r["regret"], str) else r["regret"]
            fb = r["fallbacks"]
            if "local" in fb or "recompute" in fb or not regret["error"] > 0:
                continue
            rows[r["workload"]].append((fb.get("reuse", 0), regret["error"], min(r["psnr_masked"], 100.0)))
    print("| workload | edits without / with a reuse | fit on those without | reuse edits vs the fit, median (dB) |")
    print("|---|---|---|---|")
    for w, v in rows.items():
        clean = np.array([(e, p) for n, e, p in v if n == 0])
        reuse = [(n, e, p) for n, e, p in v if n > 0]
        a, b = np.linalg.lstsq(np.vstack([np.ones(len(clean)), 10 * np.log10(clean[:, 0])]).T, clean[:, 1],
                               rcond=None)[0]
        off = [p - (a + b * 10 * np.log10(e)) for _, e, p in reuse]
        print(f"| {w} | {len(clean)} / {len(reuse)} | {a:.1f} {b:+.2f}·10log10(err) | "
              f"{np.median(off) if off else float('nan'):+.1f} |")


if __name__ == "__main__":
    main()
