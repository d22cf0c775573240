"""The README's issue-#18 numbers from this folder's files: Fig. 15 edit-by-edit savings vs the v1 pack
(and the baselines), the 5G trace run, the rebuild side by side. Usage: summarise.py (in this folder)."""
import json
from pathlib import Path

here = Path(__file__).parent
fig15 = json.loads((here / "fig15_bytes_quality.json").read_text())
for w, d in fig15["workloads"].items():
    for other, by_metric in d["comparison"].items():
        c = by_metric["psnr_masked"]
        p = c["paired"]
        bands = ", ".join(f"{k} {v['median']:.0%} (p25 {v['p25']:.0%})" for k, v in p["bands"].items())
        eq = c["equal_quality"]
        print(f"fig15 {w} vs {other}: pooled {eq['mean_saving']:.0%} fewer bytes at equal masked PSNR; "
              f"edit by edit ({p['edits']} edits) median per third: {bands}")
packs = json.loads((here / "pack_versions.json").read_text())
for w, d in packs.get("workloads", packs).items():
    print("5g", w, json.dumps(d)[:300])
rb = here / "rebuild_bases.json"
if rb.exists():
    r = json.loads(rb.read_text())
    ex = r["execute_eager_ms_best"]
    for cfg, row in r.items():
        if isinstance(row, dict):
            print(f"rebuild {cfg}: " + ", ".join(f"{v} {row[f'{v}/torch_ms']:.2f}/{row[f'{v}/opencl_ms']:.2f} ms "
                                                 f"({row[f'{v}/torch_ms'] / ex:.0%} of execute, r {row[f'{v}_rank']:.0f}, "
                                                 f"{row[f'{v}_kB']:.0f} kB, err {row[f'{v}_error']:.3f})"
                                                 for v in ("v1", "v2-unit", "v2-shared")))
    print(f"execute (eager, best) {ex:.1f} ms per shard")
