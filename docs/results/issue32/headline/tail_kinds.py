"""Where SAKURA's visible quality gap to its optimum comes from: its edits split by what happened in them (a
fallback, else an anytime cut, else neither), with each kind's count and mean visible gap (each PSNR at most the
display's 58.9 dB), the clean edits' p90, and the three largest gaps with their kind.

    python docs/results/issue32/headline/tail_kinds.py docs/results/issue32/headline > tail-kinds.md
"""

import argparse
from pathlib import Path

import numpy as np

from sakura.eval.plots import load_records

TRACES = ("5g-walking-603s", "5g-driving-236s", "4g-driving-250s", "4g5g-mixed-600s")
WORKLOADS = ("fs", "vton", "mb", "mb-sd")
KINDS = ("fallback", "cut", "clean")


def kind(r: dict) -> str:
    return "fallback" if r["fallbacks"] else "cut" if r["cuts"] else "clean"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path, help="a headline folder (one sub-folder per trace)")
    a = ap.parse_args()
    print("| trace | workload | " + " | ".join(f"{k}: edits · mean gap (dB)" for k in KINDS)
          + " | clean p90 (dB) | largest three (kind) |")
    print("|---" * (len(KINDS) + 4) + "|")
    for trace in TRACES:
        rows = [r for r in load_records(a.run / trace / "records.jsonl.gz") if r["system"] == "sakura"]
        for wl in WORKLOADS:
            edits = [r for r in rows if r["workload"] == wl]
            gap = {k: [r["regret"]["psnr_gap_visible_db"] for r in edits if kind(r) == k] for k in KINDS}
            cells = [f"{len(v)} · {np.mean(v):.1f}" if v else "0 · –" for v in gap.values()]
            top = sorted(edits, key=lambda r: -r["regret"]["psnr_gap_visible_db"])[:3]
            clean_p90 = f"{np.percentile(gap['clean'], 90):.1f}" if gap["clean"] else "–"
            print(f"| {trace} | {wl} | " + " | ".join(cells) + f" | {clean_p90} | "
                  + ", ".join(f"{r['regret']['psnr_gap_visible_db']:.1f} ({kind(r)})" for r in top) + " |")


if __name__ == "__main__":
    main()
