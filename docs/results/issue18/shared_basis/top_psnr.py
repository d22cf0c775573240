"""Masked PSNR of each pack's top level (every shard at its largest stored level) against the FP16-cache
output, edit by edit: templates × held-out requests. Usage: top_psnr.py REQUESTS FOLDER[=LABEL] ... --
TEMPLATE ...  (each folder holds <t>.pack and <t>.v1.pack; v1 is read from the first folder)."""
import sys, json, numpy as np, torch
torch.set_num_threads(1)
from sakura.catalog import load_catalog
from sakura.eval import bench, equal_bytes
from sakura.runtime.calibration import CalibrationStore
from pathlib import Path
reqs = int(sys.argv[1])
split = sys.argv.index("--")
folders = [(a.split("=")[0], a.split("=")[-1]) for a in sys.argv[2:split]]
templates = sys.argv[split + 1:]
top = lambda u: max(u.levels, key=lambda lv: lv.nbytes)  # noqa: E731
out = {}
for t in templates:
    tpl = load_catalog().get(t)
    for i, (folder, label) in enumerate(folders):
        # as built (prepare_template would rebuild a pack whose basis is not the builder's default)
        prepared = bench.TemplateBench(tpl, Path(folder), CalibrationStore(repeats=1))
        for system in (["sakura-v1"] if i == 0 else []) + ["sakura"]:
            m = equal_bytes.measure(prepared, system, top, list(range(min(reqs, len(tpl.eval_requests)))))
            name = "v1" if system == "sakura-v1" else label
            out.setdefault(name, {})[t] = {"bytes": m["bytes"], "psnr_masked": [r["psnr_masked"] for r in m["per_request"]]}
            print(t, name, f"{m['bytes'] / 1e6:.2f} MB", "masked PSNR", np.round(out[name][t]["psnr_masked"], 2).tolist(), flush=True)
for name, per in out.items():
    allq = [q for v in per.values() for q in v["psnr_masked"]]
    print(f"{name}: mean masked PSNR {np.mean(allq):.2f} dB over {len(allq)} edits; per template",
          {t: round(float(np.mean(v["psnr_masked"])), 2) for t, v in per.items()})
json.dump(out, open("top_psnr.json", "w"), indent=1)
