"""Rebuild (torch, OpenCL) per shard for the v1 and v2 packs of a template, interleaved in one process,
against the eager execute time of the same process (1 torch thread). Best of N per shard.
Usage: side_by_side.py PACKS TEMPLATE REPEATS [OUT.json]"""
import sys, json, time, statistics, numpy as np, torch
torch.set_num_threads(1)
from sakura.catalog import load_catalog
from sakura.editing import edit_request, model_for
from sakura.formats.pack import PackReader
from sakura.eval.device_bench import measure_execute
from sakura.runtime.reconstruct import get_reconstructor
packs, tid, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = sys.argv[4] if len(sys.argv) > 4 else "side_by_side.json"
v1, v2 = PackReader(f"{packs}/{tid}.v1.pack"), PackReader(f"{packs}/{tid}.pack")
recs = {n: get_reconstructor(n) for n in ("torch", "opencl")}
cfgs = [(128, 8, 8), (64, 4, 4), (32, 3, 2)]
S = v1.info.num_shards
res = {}
for c in cfgs:
    keys = {"v1": [v1.info.level_for(s, *c) for s in range(S)], "v2": [v2.info.level_for(s, *c) for s in range(S)]}
    blobs = {"v1": [v1.read(s, *keys["v1"][s]) for s in range(S)], "v2": [v2.read(s, *keys["v2"][s]) for s in range(S)]}
    infos = {"v1": v1.info, "v2": v2.info}
    best = {(v, n): [1e9] * S for v in infos for n in recs}
    for n, rec in recs.items():
        for v in infos:
            rec.rebuild(infos[v], 0, *keys[v][0], blobs[v][0])  # warm-up
    for _ in range(reps):
        for s in range(S):
            for n, rec in recs.items():
                for v in infos:
                    t = time.perf_counter(); rec.rebuild(infos[v], s, *keys[v][s], blobs[v][s])
                    best[(v, n)][s] = min(best[(v, n)][s], time.perf_counter() - t)
    res["r%d-a%d-b%d" % c] = {f"{v}/{n}_ms": 1e3 * float(np.mean(best[(v, n)])) for v, n in best}
    res["r%d-a%d-b%d" % c].update({f"{v}_kB": float(np.mean([sum(map(len, b.values())) for b in blobs[v]])) / 1e3 for v in infos},
                                  v2_rank=float(np.mean([next(f.r for f in v2.frontier(s) if f.key == keys["v2"][s]) for s in range(S)])))
    # the floor no decoder can beat: A·B + μ alone (random factors of the same rank), best of as many calls
    g = v1.info.geometry
    U = len(v1.info.units(0))
    for v, r in (("v1", c[0]), ("v2", round(res["r%d-a%d-b%d" % c]["v2_rank"]))):
        a, b, m = torch.randn(U, g.n, r), torch.randn(U, r, g.d), torch.randn(U, 1, g.d)
        floor = 1e9
        for _ in range(reps * S):
            t = time.perf_counter(); torch.baddbmm(m, a, b); floor = min(floor, time.perf_counter() - t)
        res["r%d-a%d-b%d" % c][f"{v}/matmul_floor_ms"] = 1e3 * floor
tpl = load_catalog().get(tid)
model = model_for(tpl, None)
req = edit_request(tpl, tpl.eval_requests[0], resolution=model.codec.resolution, ref_size=model.codec.ref_size)
kv = {}
for s in range(S):
    kv.update(recs["torch"].rebuild(v1.info, s, 64, 4, 4, v1.read(s, 64, 4, 4)))
ex = measure_execute(["eager"], model, req, 2, lambda st, l: kv[(st, l)], reps, print)
execute = float(np.mean(ex.min_ms["eager"]))
res["execute_eager_ms_best"] = execute
for c, row in res.items():
    if isinstance(row, dict):
        row.update({k.replace("_ms", "_over_execute"): v / execute for k, v in list(row.items()) if k.endswith("_ms")})
print(json.dumps(res, indent=1))
json.dump(res, open(out, "w"), indent=1)
