"""SAKURA's regret split into the estimator's and the policy's share, before and after a change, from two sets of
`sakura bench --figure regret` runs (one folder per trace in each). Latency: the summary's `regret_decomposition`
(ratio − ratio with the true future rates = the estimator's; ratio with true rates − 1 = the policy's). Quality:
the optimum's masked PSNR − SAKURA's at equal latency (p50), for SAKURA and for SAKURA with the true future rates
(what would remain with a perfect estimator: the policy's).

Usage: python decomposition.py BEFORE_DIR AFTER_DIR [TRACE …]"""

import json
import sys
from pathlib import Path

TRACES = ("5g-walking-603s", "5g-driving-236s", "4g-driving-250s", "4g5g-mixed-600s", "5g-synthetic")


def row(run: Path, workload: str) -> str:
    path = run / "summary.json"
    if not path.is_file():
        return "– | – | – | –"
    ws = json.loads(path.read_text())["workloads"].get(workload)
    if not ws or "regret_decomposition" not in ws:
        return "– | – | – | –"
    d = ws["regret_decomposition"]
    own = ws["sakura"]["regret"]["psnr_gap_db"]["p50"]
    perfect = ws["sakura+perfect"]["regret"]["psnr_gap_db"]["p50"]
    return f"{d['estimator']['p50']:+.3f} | {d['policy']['p50']:+.3f} | {own:.1f} | {perfect:.1f}"


def main(before: Path, after: Path, traces) -> None:
    print("| trace | workload | run | latency: estimator p50 | latency: policy p50 | PSNR gap p50 (dB) | "
          "with true rates (dB) |")
    print("|---|---|---|---|---|---|---|")
    for trace in traces:
        for workload in ("fs", "vton", "mb", "mb-sd"):
            for name, root in (("before", before), ("after", after)):
                cells = row(root / trace, workload)
                if cells.startswith("–"):
                    continue
                print(f"| {trace} | {workload} | {name} | {cells} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:] or TRACES)
