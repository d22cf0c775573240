"""Rebuild only the SAKURA v2 pack (auto basis, with v1 beside it for the check) of each template in FOLDER;
the baselines' files stay. The build report keeps the other formats' storage/seconds from before."""
import json, sys, time, torch
torch.set_num_threads(1)
from pathlib import Path
from sakura.catalog import load_catalog
from sakura.offline.builder import build_template
out = Path(sys.argv[1])
for t in sys.argv[2:]:
    before = json.loads((out / f"{t}.build.json").read_text())
    t0 = time.time()
    r = build_template(load_catalog().get(t), out, encodings=("sakura", "sakura-v1"),
                       progress=lambda m: print(t, m, f"{time.time()-t0:.0f}s", flush=True))
    after = json.loads((out / f"{t}.build.json").read_text())
    after["storage"] = {**before["storage"], **after["storage"]}
    after["seconds"] = {**before["seconds"], **after["seconds"]}
    (out / f"{t}.build.json").write_text(json.dumps(after, indent=1))
    print(t, "kept", r.top_basis, r.top_share, r.top_psnr_gap_db, "tried", r.top_tried, "fp16/sakura",
          round(r.fp16_bytes / r.storage["sakura"], 2), flush=True)
