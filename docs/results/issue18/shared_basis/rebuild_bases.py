"""Rebuild (torch, OpenCL) per shard: v1 pack vs v2 with one token basis per unit vs v2 with one per
shard, interleaved in one process, against the eager execute of the same process (1 torch thread),
best of N per shard. Each v1 configuration (r, b_A, b_B) is matched two ways: the largest v2 level
within its bytes (equal bytes) and the smallest v2 level whose stored error is at most its error
(equal error); v1 itself takes its frontier level within the bytes of (r, b_A, b_B). Usage: rebuild_bases.py UNIT_PACKS SHARED_PACKS TEMPLATE REPEATS OUT.json"""
import sys, json, time, numpy as np, torch
torch.set_num_threads(1)
from sakura.catalog import load_catalog
from sakura.editing import edit_request, model_for
from sakura.formats.pack import PackReader
from sakura.eval.device_bench import measure_execute
from sakura.runtime.reconstruct import get_reconstructor
unit_dir, shared_dir, tid, reps, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
packs = {"v1": PackReader(f"{shared_dir}/{tid}.v1.pack"), "v2-unit": PackReader(f"{unit_dir}/{tid}.pack"),
         "v2-shared": PackReader(f"{shared_dir}/{tid}.pack")}
recs = {n: get_reconstructor(n) for n in ("torch", "opencl")}
S = packs["v1"].info.num_shards
v1 = packs["v1"].info


def v1_key(s, c):
    """v1's frontier level within the bytes of ``c`` (``c`` itself when it is on the frontier)."""
    budget = v1.config_bytes(s, *c)
    return max((f for f in v1.frontier(s) if f.bytes <= budget), key=lambda f: f.bytes).key


def equal_error(info, s, c):
    err = next(f.error for f in v1.frontier(s) if f.key == v1_key(s, c))
    return min((f for f in info.frontier(s) if f.error <= err), key=lambda f: f.bytes, default=info.frontier(s)[-1]).key


res = {}
for c in [(128, 8, 8), (64, 4, 4), (32, 3, 2)]:
    for rule in ("equal_bytes", "equal_error"):
        keys = {v: [v1_key(s, c) if v == "v1" else (p.info.level_for(s, *c) if rule == "equal_bytes" else equal_error(p.info, s, c))
                    for s in range(S)] for v, p in packs.items()}
        blobs = {v: [p.read(s, *keys[v][s]) for s in range(S)] for v, p in packs.items()}
        best = {(v, n): [1e9] * S for v in packs for n in recs}
        for n, rec in recs.items():
            for v, p in packs.items():
                rec.rebuild(p.info, 0, *keys[v][0], blobs[v][0])  # warm-up
        for _ in range(reps):
            for s in range(S):
                for n, rec in recs.items():
                    for v, p in packs.items():
                        t = time.perf_counter()
                        rec.rebuild(p.info, s, *keys[v][s], blobs[v][s])
                        best[(v, n)][s] = min(best[(v, n)][s], time.perf_counter() - t)
        row = {f"{v}/{n}_ms": 1e3 * float(np.mean(best[(v, n)])) for v, n in best}
        for v, p in packs.items():
            row[f"{v}_kB"] = float(np.mean([sum(map(len, b.values())) for b in blobs[v]])) / 1e3
            fr = [{f.key: f for f in p.info.frontier(s)}[keys[v][s]] for s in range(S)]
            row[f"{v}_rank"] = float(np.mean([f.r for f in fr]))
            row[f"{v}_error"] = float(np.mean([f.error for f in fr]))
        res["r%d-a%d-b%d/%s" % (*c, rule)] = row
tpl = load_catalog().get(tid)
model = model_for(tpl, None)
req = edit_request(tpl, tpl.eval_requests[0], resolution=model.codec.resolution, ref_size=model.codec.ref_size)
kv = {}
for s in range(S):
    kv.update(recs["torch"].rebuild(v1, s, 64, 4, 4, packs["v1"].read(s, 64, 4, 4)))
ex = measure_execute(["eager"], model, req, 2, lambda st, l: kv[(st, l)], reps, print)
execute = float(np.mean(ex.min_ms["eager"]))
res["execute_eager_ms_best"] = execute
for row in res.values():
    if isinstance(row, dict):
        row.update({k.replace("_ms", "_over_execute"): v / execute for k, v in list(row.items()) if k.endswith("_ms")})
print(json.dumps(res, indent=1))
json.dump(res, open(out, "w"), indent=1)
