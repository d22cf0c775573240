"""SAKURA's clean headline edits (no fallback, no cut) with a visible gap to the equal-latency optimum of at least
1 dB: the unit holding most of the difference in predicted error (``weight`` · level error, SAKURA's level against
the optimum's), its share of the difference, and the edit's predicted error against ``DISPLAY_MSE``.

    python docs/results/issue32/policy15/clean_gaps.py docs/results/issue32/headline PACKS > clean-gaps.md
"""

import argparse
import sys
from pathlib import Path

from sakura.eval.plots import load_records
from sakura.online.plan import DISPLAY_MSE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "headline"))
from cut_vs_reuse import TRACES, read_encoding  # noqa: E402  (the headline's traces; a pack's encoding)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path, help="a headline folder (one sub-folder per trace)")
    ap.add_argument("packs", type=Path, help="the packs the run streamed")
    a = ap.parse_args()
    encodings: dict = {}
    print("| trace | template | start (s) | visible gap (dB) | masked PSNR | predicted / `DISPLAY_MSE` "
          "| top unit | its share | SAKURA's level → the optimum's |")
    print("|---|---|---|---|---|---|---|---|---|")
    for trace in TRACES:
        for r in load_records(a.run / trace / "records.jsonl.gz"):
            gap = r.get("regret", {}).get("psnr_gap_visible_db")
            if r["system"] != "sakura" or r["fallbacks"] or r["cuts"] or gap is None or gap < 1.0:
                continue
            if r["template"] not in encodings:
                encodings[r["template"]] = read_encoding(a.packs, r["template"])
            diffs = []
            for u, ours, best in zip(encodings[r["template"]].units, r["levels"], r["regret"]["equal_latency_actions"]):
                lo = next((lv for lv in u.levels if lv.label == ours), None)
                lb = next((lv for lv in u.levels if lv.label == best), None)
                if lo is not None and lb is not None:
                    diffs.append((u.weight * (lo.error - lb.error), u.index, ours, best))
            top = max(diffs)
            share = top[0] / sum(d for d, *_ in diffs if d > 0)
            print(f"| {trace} | {r['template']} | {r['start_s']:.1f} | {gap:.1f} | {r['psnr_masked']:.1f} | "
                  f"{r['regret']['error'] / DISPLAY_MSE:.2f} | {top[1]} | {share:.2f} | {top[2]} → {top[3]} |")


if __name__ == "__main__":
    main()
