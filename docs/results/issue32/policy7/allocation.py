"""Where the clairvoyant optimum spends its bytes against SAKURA's, shard by shard: per workload, over the edits of
a `sakura bench --figure regret` run, the mean extra bytes of the optimum's equal-latency schedule and each side's
mean weighted error per shard (stored error × the shard's output weight, `sakura.offline.output_weights`). Only
edits whose both schedules stream every shard are counted (issue #32, session 27).

    python docs/results/issue32/policy7/allocation.py RECORDS [--packs DIR]
"""

import argparse
from pathlib import Path

import numpy as np

from sakura.eval.plots import load_records
from sakura.formats import FORMATS
from sakura.places import default_packs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("records", type=Path)
    ap.add_argument("--packs", default=None)
    a = ap.parse_args()
    packs, fmt, encodings = Path(a.packs or default_packs()), FORMATS["sakura"], {}
    records = [r for r in load_records(a.records) if r["system"] == "sakura" and r.get("regret")]
    for workload in sorted({r["workload"] for r in records}):
        extra, own, best = [], [], []
        for r in (r for r in records if r["workload"] == workload):
            if r["template"] not in encodings:
                encodings[r["template"]] = fmt.encoding_cls(fmt.open(packs / f"{fmt.file_id(r['template'])}.pack"))
            units = encodings[r["template"]].units
            plan = r["regret"]["equal_latency_actions"]
            levels = [{lv.label: lv for lv in u.levels} for u in units]
            if len(plan) != len(units) or not all(a in lv and b in lv for lv, a, b in zip(levels, r["levels"], plan)):
                continue
            extra.append([lv[b].nbytes - lv[a].nbytes for lv, a, b in zip(levels, r["levels"], plan)])
            own.append([u.weight * lv[a].error for u, lv, a in zip(units, levels, r["levels"])])
            best.append([u.weight * lv[b].error for u, lv, b in zip(units, levels, plan)])
        if not extra:
            continue
        extra, own, best = np.array(extra), np.array(own), np.array(best)
        print(f"{workload}: {len(extra)} edits; the optimum's extra bytes per edit {extra.sum(1).mean() / 1e3:+.0f} kB")
        print("  extra kB per shard:       " + " ".join(f"{x:+5.0f}" for x in extra.mean(0) / 1e3))
        print("  weighted error, SAKURA:   " + " ".join(f"{x:5.1f}" for x in own.mean(0) * 1e7) + "  (×1e-7)")
        print("  weighted error, optimum:  " + " ".join(f"{x:5.1f}" for x in best.mean(0) * 1e7))


if __name__ == "__main__":
    main()
