"""A/B of the fallback's wait rule: wait counts as quality-free only when its smallest prefix is no
worse than a reuse (step error from the FP16 cache, as a pack built with it will carry)."""
import json, sys, numpy as np, torch
torch.set_num_threads(1)
from pathlib import Path
from sakura.eval import bench as B
from sakura.net.traces import load_trace
from sakura.offline.builder import load_importance
from sakura.offline.lowrank import normalized_importance
from sakura.formats import pack as P
B.use_rebuild_clock("cpu")
packs = Path(sys.argv[1]); wl = sys.argv[2]; n = int(sys.argv[3]); out = Path(sys.argv[4])
cfg = B.BenchConfig(packs=packs, trace="5g", starts=n, calibration_file=Path("/tmp/s9/cal.json"))
base = load_trace("5g"); cache = {}
prepared_all = B.workload_benches(wl, cfg, cache, lambda s: None)
scales = B.regime_scales(prepared_all, base, cfg)
step_err = {}
for p in prepared_all:
    kv, imp = p.fp16_kv, load_importance(packs, p.template.id)
    errs = []
    for s, l0, l1 in p.compute.shards:
        if s == 0:
            errs.append(None); continue
        e = []
        for l in range(l0, l1):
            for i in (0, 1):
                x = kv[(s, l)][i].double(); y = kv[(s - 1, l)][i].double()
                w = normalized_importance(imp.get((s, l)), x.shape[0]).double()[:, None]
                e.append(float((w * (x - y) ** 2).sum() / (w * (x - x.mean(0)) ** 2).sum()))
        errs.append(float(np.mean(e)))
    step_err[p.template.id] = errs
    print(p.template.id, [None if e is None else round(e, 3) for e in errs], flush=True)
orig = P.PackEncoding.step_error
starts = np.random.default_rng(0).uniform(0, base.duration, size=n)
rows = []
for prepared, ri, start in B.offset_plan(prepared_all, starts):
    tr = base.scaled(scales[prepared.template.id])
    v1 = prepared.runtime.encoding(prepared.state, "sakura-v1")
    for rule in ("old", "new"):
        P.PackEncoding.step_error = orig if rule == "old" else (lambda self, u, e=step_err[prepared.template.id]: e[u.index])
        for system in ("sakura", "sakura-v1"):
            kw = {"encoding": v1, "name": "sakura-v1"} if system == "sakura-v1" else {}
            r = B.run_one(prepared, ri, "sakura", tr, start, **kw)
            r["rule"] = rule
            rows.append(r)
            print(rule, system, prepared.template.id, ri, round(start, 1), round(r["latency_s"], 3), r["fallbacks"], round(r["psnr_masked"], 1), flush=True)
out.write_text("\n".join(json.dumps(r) for r in rows))
for rule in ("old", "new"):
    for system in ("sakura", "sakura-v1"):
        sel = [r for r in rows if r["rule"] == rule and r["system"] == system]
        lat = [r["latency_s"] for r in sel]
        print(rule, system, "p50 %.3f p90 %.3f mean %.3f max %.3f psnr_m %.2f" % (np.percentile(lat, 50), np.percentile(lat, 90), np.mean(lat), max(lat), np.mean([r["psnr_masked"] for r in sel])))
