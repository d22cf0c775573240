import json, numpy as np, torch
torch.set_num_threads(1)
from pathlib import Path
from sakura.eval import bench as B
from sakura.net.traces import load_trace
B.use_rebuild_clock("cpu")
cfg = B.BenchConfig(packs=Path("/tmp/s8/final"), trace="5g", starts=40, calibration_file=Path.home() / ".cache/sakura/calibration.json")
base = load_trace("5g"); cache = {}
prepared_all = B.workload_benches("fs", cfg, cache, print)
scales = B.regime_scales(prepared_all, base, cfg)
starts = np.random.default_rng(0).uniform(0, base.duration, size=40)
rows = []
for prepared, ri, start in B.offset_plan(prepared_all, starts):
    tr = base.scaled(scales[prepared.template.id])
    v1 = prepared.runtime.encoding(prepared.state, "sakura-v1")
    for system in ("sakura", "sakura-v1"):
        r = B.run_one(prepared, ri, "sakura", tr, start, **({"encoding": v1, "name": "sakura-v1"} if system == "sakura-v1" else {}))
        rows.append(r)
        print(system, prepared.template.id, ri, round(start, 1), round(r["latency_s"], 3), round(r["stall_s"], 3), r["fallbacks"], round(r["psnr_masked"], 1), flush=True)
Path("/tmp/s8/fs_tail.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
