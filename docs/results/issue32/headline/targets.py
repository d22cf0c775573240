"""Issue #32's targets for SAKURA on every (workload, trace) of a headline run: latency / optimal ≤ 1.10 at p50 and
≤ 1.30 at p90; the optimum's masked PSNR − SAKURA's at equal latency ≤ 1 dB at p50 and ≤ 3 dB at p90, raw and with
each PSNR counted at most at the display's 58.9 dB. Where a raw quality target is missed, the edits past it (gap above
the target) are split by SAKURA's own masked PSNR: at or above the display's (an output closer to the exact one than
8-bit rounding is: a gap no screen can show) or below it. Last column: the edits whose optimum at equal quality is
SAKURA's own schedule (the same level on every unit, no fallback), where latency / optimal is only the planner's
timing model of that schedule against the bench's clock: its spread is what the latency ratio can resolve.

    python docs/results/issue32/headline/targets.py docs/results/issue32/headline > targets.md
"""

import argparse
from pathlib import Path

import numpy as np

from sakura.eval.plots import load_records
from sakura.eval.regret import DISPLAY_PSNR_DB

TRACES = ("5g-walking-603s", "5g-driving-236s", "4g-driving-250s", "4g5g-mixed-600s")
WORKLOADS = ("fs", "vton", "mb", "mb-sd")
LATENCY_TARGET = {50: 1.10, 90: 1.30}
GAP_TARGET_DB = {50: 1.0, 90: 3.0}


def cell(records: list[dict]) -> tuple[str, bool, bool, bool]:
    """One table row's text and whether the latency, raw-quality and display-capped targets hold."""
    ratio = [r["regret"]["latency_ratio"] for r in records]
    raw = [r["regret"]["psnr_gap_db"] for r in records]
    capped = [r["regret"]["psnr_gap_visible_db"] for r in records]
    p = {name: {q: float(np.percentile(xs, q)) for q in (50, 90)}
         for name, xs in (("ratio", ratio), ("raw", raw), ("capped", capped))}
    latency_ok = all(p["ratio"][q] <= LATENCY_TARGET[q] for q in (50, 90))
    raw_ok = all(p["raw"][q] <= GAP_TARGET_DB[q] for q in (50, 90))
    capped_ok = all(p["capped"][q] <= GAP_TARGET_DB[q] for q in (50, 90))
    past = []  # the edits past each missed raw target, split by SAKURA's own PSNR against the display's
    for q in (50, 90):
        if p["raw"][q] > GAP_TARGET_DB[q]:
            beyond = [r for r in records if r["regret"]["psnr_gap_db"] > GAP_TARGET_DB[q]]
            above = sum(r["psnr_masked"] >= DISPLAY_PSNR_DB for r in beyond)
            past.append(f"p{q}: {above} above / {len(beyond) - above} below")
    same = [r["regret"]["latency_ratio"] for r in records
            if r["regret"]["optimal_actions"] == r["levels"] and not r["fallbacks"]]
    model = f"{len(same)}: {min(same):.3f} … {max(same):.3f}" if same else "0"
    text = (f"{p['ratio'][50]:.3f} / {p['ratio'][90]:.3f} | {p['raw'][50]:.1f} / {p['raw'][90]:.1f} | "
            f"{p['capped'][50]:.1f} / {p['capped'][90]:.1f} | {'; '.join(past) or '–'} | {model}")
    return text, latency_ok, raw_ok, capped_ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a headline run: one bench folder per trace")
    args = ap.parse_args()
    print(f"| trace | workload | n | latency / optimal p50 / p90 | raw gap p50 / p90 (dB) | capped gap p50 / p90 (dB) "
          f"| edits past a missed raw target: SAKURA ≥ / < {DISPLAY_PSNR_DB:.1f} dB "
          "| optimum = SAKURA's schedule: edits, latency / optimal |")
    print("|---|---|---|---|---|---|---|---|")
    met = {"latency": 0, "raw": 0, "capped": 0}
    cells = 0
    for trace in TRACES:
        folder = args.run / trace
        path = folder / "records.jsonl.gz" if (folder / "records.jsonl.gz").is_file() else folder / "records.jsonl"
        if not path.is_file():  # (a sweep still running)
            continue
        records = [r for r in load_records(path) if r["system"] == "sakura" and r.get("regret")]
        for workload in WORKLOADS:
            mine = [r for r in records if r["workload"] == workload]
            if not mine:
                continue
            text, latency_ok, raw_ok, capped_ok = cell(mine)
            cells += 1
            met["latency"] += latency_ok
            met["raw"] += raw_ok
            met["capped"] += capped_ok
            print(f"| {trace} | {workload} | {len(mine)} | {text} |")
    print(f"\nTargets met on {cells} (workload, trace): latency {met['latency']}, quality raw {met['raw']}, "
          f"quality capped at the display {met['capped']}.")


if __name__ == "__main__":
    main()
