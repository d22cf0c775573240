"""SAKURA's headline edits, unit by unit: the error of the level each unit was delivered at (after any anytime cut)
against the error of the reuse option for it (its layers' K/V of one step earlier, as kept: the pack's
``build.step_error`` plus the error of the level the previous step's unit came at), both in the pack's priced
metric. Where reuse is lower, a zero-byte option was better than what the unit received.

    python docs/results/issue32/headline/cut_vs_reuse.py docs/results/issue32/headline PACKS > cut-vs-reuse.md
"""

import argparse
from pathlib import Path

from sakura.eval.plots import load_records
from sakura.formats import encoding_from_header
from sakura.formats.container import header_size

TRACES = ("5g-walking-603s", "5g-driving-236s", "4g-driving-250s", "4g5g-mixed-600s")


def read_encoding(packs: Path, template_id: str):
    with open(packs / f"{template_id}.pack", "rb") as f:
        first8 = f.read(8)
        return encoding_from_header("sakura", first8 + f.read(header_size(first8) - 8))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path, help="a headline folder (one sub-folder per trace)")
    ap.add_argument("packs", type=Path, help="the packs the run streamed")
    a = ap.parse_args()
    encodings: dict = {}
    print("| trace | workload | edit kind | units with a previous step | reuse lower | reuse ≥ 5× lower |")
    print("|---|---|---|---|---|---|")
    worst = []
    for trace in TRACES:
        tally: dict = {}
        for r in load_records(a.run / trace / "records.jsonl.gz"):
            if r["system"] != "sakura":
                continue
            if r["template"] not in encodings:
                encodings[r["template"]] = read_encoding(a.packs, r["template"])
            enc = encodings[r["template"]]
            g = enc.info.geometry
            per_step = g.num_layers // g.shard_size
            error = {}
            for u, label in zip(enc.units, r["levels"]):
                level = next((lv for lv in u.levels if lv.label == label), None)
                error[u.index] = None if level is None else level.error
            kind = "fallback" if r["fallbacks"] else "cut" if r["cuts"] else "clean"
            t = tally.setdefault((r["workload"], kind), [0, 0, 0])
            for u in enc.units:
                step, kept, got = enc.step_error(u), error.get(u.index - per_step), error.get(u.index)
                if step is None or kept is None or got is None:
                    continue
                reuse = step + kept
                t[0] += 1
                t[1] += reuse < got
                t[2] += 5 * reuse < got
                if 5 * reuse < got:
                    worst.append(f"{trace} {r['template']} start {r['start_s']:.1f} ({kind}): unit {u.index} "
                                 f"{r['levels'][u.index]} error {got:.3g}, reuse {reuse:.3g}; edit "
                                 f"{r['psnr_masked']:.1f} dB, visible gap {r['regret']['psnr_gap_visible_db']:.1f} dB")
        for (wl, kind), (n, lower, much) in sorted(tally.items()):
            print(f"| {trace} | {wl} | {kind} | {n} | {lower} | {much} |")
    print()
    print("Units whose reuse was ≥ 5× lower than what they received:")
    print()
    print("\n".join(f"- {w}" for w in worst) or "- none")


if __name__ == "__main__":
    main()
