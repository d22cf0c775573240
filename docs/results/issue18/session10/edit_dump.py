"""Replay one edit on both packs and print its per-unit timeline (mb-coffee req 4 at 16.99 s)."""
import sys, numpy as np, torch
torch.set_num_threads(1)
from pathlib import Path
from sakura.eval import bench as B
from sakura.net.traces import load_trace
B.use_rebuild_clock("cpu")
workload, tpl, req, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
cfg = B.BenchConfig(packs=Path("/work/packs10"), trace="5g", starts=40, calibration_file=Path.home() / ".cache/sakura/calibration.json")
base = load_trace("5g"); cache = {}
prepared_all = B.workload_benches(workload, cfg, cache, lambda s: None)
scales = B.regime_scales(prepared_all, base, cfg)
prepared = next(p for p in prepared_all if p.template.id == tpl)
tr = base.scaled(scales[tpl])
print("trace Mbps around start:", [round(tr.rate_at(start + t), 1) if hasattr(tr, "rate_at") else None for t in np.arange(0, 0.8, 0.05)])
v1 = prepared.runtime.encoding(prepared.state, "sakura-v1")
import sakura.eval.bench as bb
for name, kw in (("v2", {}), ("v1", {"encoding": v1, "name": "sakura-v1"})):
    captured = {}
    orig = bb.record
    def rec(prepared, i, system, start, tl, out, _o=orig):
        captured["tl"] = tl
        return _o(prepared, i, system, start, tl, out)
    bb.record = rec
    r = B.run_one(prepared, req, "sakura", tr, start, **kw)
    bb.record = orig
    tl = captured["tl"]
    print(f"== {name}: latency {r['latency_s']:.3f} stall {r['stall_s']:.3f} bytes {r['bytes']} psnr_m {r['psnr_masked']:.2f}")
    for u, s in zip(tl.units, tl.shards):
        print(f"  u{u.unit:2d} {u.level:>14s} {u.nbytes:7d}B bud {u.budget_bytes:8.0f} win {u.window_s:.3f} rate {u.rate_mbps:6.1f} "
              f"req {u.request_t:.3f} arr {u.arrival_t if u.arrival_t is None else round(u.arrival_t,3)} reb {u.rebuild_done_t if u.rebuild_done_t is None else round(u.rebuild_done_t,3)} "
              f"need {u.needed_t:.3f} | exec {s.exec_start_t:.3f}-{s.exec_end_t:.3f} stall {s.stall_s*1e3:.1f}ms")
