"""Experiment (not in the product): separate K, V factors per cache unit (today, mode sep) vs one weighted
factorisation of [K | V] per layer (kv) or of the whole shard [K0 | V0 | K1 | V1] (all), each with the same
greedy allocation and chunk coding; prints (bytes, exact tradeoff metric per K/V unit, decoded rank) along
each path. Usage: joint_factors.py TEMPLATE SHARDS MODE (packs folder /tmp/w18c/packs: fp16 + importance)."""
import sys, numpy as np, torch
torch.set_num_threads(1)
from dataclasses import replace
from sakura.formats.fp16 import Fp16Info, decode
from sakura.formats.allocated import encode_chunks
from sakura.formats.pack import PackReader
from sakura.offline.builder import load_importance
from sakura.offline.compress import quantize_factors
from sakura.offline.lowrank import weighted_lowrank, normalized_importance
from sakura.offline.allocate import UnitModel, shard_table, greedy_order
from sakura.kvcache import shard_units
tid, shards, mode = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3]
P = "/tmp/w18c/packs"
f, info = Fp16Info.open(f"{P}/{tid}.fp16.pack")
geo = PackReader(f"{P}/{tid}.pack").info.geometry
imp = load_importance(P, tid)
for shard in shards:
    kv = decode(info, shard, f.read_ranges(info.ranges(shard)))
    layers = sorted(kv)
    # the "units" to factorise: list of (x, importance, [(col0, col1) per original K/V unit])
    if mode == "sep":
        jobs = [(kv[l][i], imp.get(l)) for l in layers for i in (0, 1)]
    elif mode == "kv":
        jobs = [(torch.cat(kv[l], 1), imp.get(l)) for l in layers]
    else:  # all: layers share importance? use the mean of the layers' importances
        ims = [imp.get(l) for l in layers]
        jobs = [(torch.cat([t for l in layers for t in kv[l]], 1), sum(normalized_importance(i, kv[layers[0]][0].shape[0]) for i in ims) / len(ims))]
    d = jobs[0][0].shape[1]
    g2 = replace(geo, heads=d // geo.head_dim, max_rank=256, rank=256)
    qfs, models, parts = [], [], []
    for x, im in jobs:
        qf = quantize_factors(weighted_lowrank(x, im, q=0.5, max_rank=256), im)
        qfs.append(qf); models.append(UnitModel(x, im, qf))
    sizes = {ref: len(b) for ref, (b, _) in encode_chunks(qfs, g2).items()}
    table, base = shard_table(models, geo.group)
    order, points = greedy_order(table, base, sizes)
    nb = np.cumsum([len(jobs) * d * 2] + [sizes[r] for r in order])
    # exact per-original-unit metric at ~14 points
    out = []
    idx = np.unique(np.geomspace(1, len(points), 16).astype(int) - 1)
    for i in idx:
        k = points[i][0]
        bits = np.zeros((2, 256), np.int64)
        for ref in order[:k]:
            bits[ref.factor, ref.group * 8:(ref.group + 1) * 8] += 1
        keep = np.flatnonzero((bits[0] > 0) & (bits[1] > 0))
        errs = []
        for ji, ((x, im), qf) in enumerate(zip(jobs, qfs)):
            xd = x.double().numpy()
            xh = np.broadcast_to(qf.mean.astype(np.float64), xd.shape).copy()
            for c in keep:
                xh += np.outer(qf.a_hat(bits[0, c])[c], qf.b_hat(bits[1, c])[c])
            for c0 in range(0, d, geo.d):  # per original K / V unit
                lay = layers[(ji * d + c0) // (2 * geo.d)]
                w = normalized_importance(imp.get(lay), xd.shape[0]).double().numpy()
                xs, hs = xd[:, c0:c0 + geo.d], xh[:, c0:c0 + geo.d]
                cen = xs - xs.mean(0)
                errs.append(float((w[:, None] * (xs - hs) ** 2).sum() / (w[:, None] * cen ** 2).sum()))
        out.append((int(nb[k]), round(float(np.mean(errs)), 4), len(keep)))
    print(mode, shard, out, flush=True)
