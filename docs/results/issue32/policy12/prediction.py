"""How well a schedule's predicted masked MSE matches the measured masked PSNR of held-out edits, per template:
the shard's weight × the pack's error (before) against each level's own measured output MSE (the header's
``level_output_mse``), summed over the edit's units. SAKURA edits without fallbacks or cuts, output ≤ 90 dB.

    python docs/results/issue32/policy12/prediction.py PACKS RECORDS_DIR...
"""

import gzip
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from sakura.formats import FORMATS


def records(folder: Path):
    for name in ("records.jsonl.gz", "records.jsonl"):
        path = folder / name
        if path.is_file():
            with (gzip.open(path, "rt") if name.endswith(".gz") else open(path)) as f:
                yield from (json.loads(line) for line in f if line.strip())
            return


def main(packs: str, *folders: str) -> None:
    fmt = FORMATS["sakura"]
    tables = {}
    residuals = defaultdict(lambda: ([], []))
    for folder in folders:
        for r in records(Path(folder)):
            if r["system"] != "sakura" or r.get("fallbacks") or r.get("cuts") or r["psnr_masked"] > 90:
                continue
            tid = r["template"]
            if tid not in tables:
                path = Path(packs) / f"{tid}.pack"
                raw = fmt.encoding_cls(fmt.open(path), level_output_mse=False)
                table = raw.level_output_mse()
                tables[tid] = None if table is None else [
                    ({lv.label: u.weight * lv.error for lv in u.levels}, dict(zip((lv.label for lv in u.levels), row)))
                    for u, row in zip(raw.units, table)]
            if tables[tid] is None:
                continue
            before = sum(tables[tid][k][0][label] for k, label in enumerate(r["levels"]))
            after = sum(tables[tid][k][1][label] for k, label in enumerate(r["levels"]))
            for out, mse in zip(residuals[tid], (before, after)):
                out.append(r["psnr_masked"] + 10 * math.log10(mse))
    print("| template | edits | measured − predicted dB, weight × error: mean / sd | per-level output MSE: mean / sd |")
    print("|---|---|---|---|")
    for tid, (before, after) in sorted(residuals.items()):
        b, a = np.array(before), np.array(after)
        print(f"| {tid} | {len(b)} | {b.mean():+.2f} / {b.std():.2f} | {a.mean():+.2f} / {a.std():.2f} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
