"""A/B: the same edits with the rebuild rate known from the start (prior = the rate the edit itself
learnt in a first pass) vs unknown (prior 0, today)."""
import sys, json, numpy as np, torch
torch.set_num_threads(1)
from pathlib import Path
from sakura.eval import bench as B
from sakura.net.traces import load_trace
from sakura.online import monitor as M
B.use_rebuild_clock("cpu")
edits = json.load(open("/work/runs/packs40b/pack_versions.json"))["workloads"]
cfg = B.BenchConfig(packs=Path("/work/packs10"), trace="5g", starts=40, calibration_file=Path.home() / ".cache/sakura/calibration.json")
base = load_trace("5g"); cache = {}
learnt = {}
orig_init = M.RuntimeMonitor.__init__
def init(self, *a, **k):
    orig_init(self, *a, **k)
    self.rebuild = M.RebuildRate(PRIOR[0])
    LAST[0] = self
M.RuntimeMonitor.__init__ = init
PRIOR, LAST = [0.0], [None]
for workload in sys.argv[1].split(","):
    prepared_all = B.workload_benches(workload, cfg, cache, lambda s: None)
    scales = B.regime_scales(prepared_all, base, cfg)
    sel = [e for e in edits[workload]["paired"]["edits"] if e["latency_s"][0] - e["latency_s"][1] > float(sys.argv[2])]
    for e in sel:
        p = next(p for p in prepared_all if p.template.id == e["template"])
        tr = base.scaled(scales[p.template.id])
        v1 = p.runtime.encoding(p.state, "sakura-v1")
        out = []
        for kw in ({}, {"encoding": v1, "name": "sakura-v1"}):
            PRIOR[0] = 0.0
            a = B.run_one(p, e["request"], "sakura", tr, e["start_s"], **kw)
            PRIOR[0] = LAST[0].rebuild.s_per_work
            b = B.run_one(p, e["request"], "sakura", tr, e["start_s"], **kw)
            out.append((round(a["latency_s"], 3), round(b["latency_s"], 3), round(a["psnr_masked"], 1), round(b["psnr_masked"], 1), f"{PRIOR[0]:.2e}"))
        print(workload, e["template"], e["request"], round(e["start_s"], 1), "sweep", [round(x, 3) for x in e["latency_s"]], "v2 (no prior, prior, psnr, psnr)", out[0], "v1", out[1], flush=True)
