"""Per template: FP16/pack storage (v1, v2) and the top-of-frontier error per shard, v2 vs v1 (both exact)."""
import sys, json, glob, numpy as np
from pathlib import Path
from sakura.formats.pack import PackReader
out = {}
for bj in sorted(glob.glob(sys.argv[1] + "/*.build.json")):
    b = json.load(open(bj)); t = b["template_id"]
    v1, v2 = PackReader(f"{sys.argv[1]}/{t}.v1.pack"), PackReader(f"{sys.argv[1]}/{t}.pack")
    e1 = np.array([v1.frontier(s)[-1].error for s in range(v1.info.num_shards)])
    e2 = np.array([v2.frontier(s)[-1].error for s in range(v2.info.num_shards)])
    out[t] = {"fp16_over_v1": b["fp16_bytes"] / b["storage"]["sakura-v1"], "fp16_over_v2": b["fp16_bytes"] / b["storage"]["sakura"],
              "top_error_mean_v1": e1.mean(), "top_error_mean_v2": e2.mean(), "top_error_ratio_max": float((e2 / e1).max()),
              "top_rank_v2": [v2.frontier(s)[-1].r for s in (0, v2.info.num_shards - 1)],
              "header_bytes_v1": len(v1.header_bytes), "header_bytes_v2": len(v2.header_bytes)}
    print(t, json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in out[t].items()}))
json.dump(out, open(sys.argv[2], "w"), indent=1)
