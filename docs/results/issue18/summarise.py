"""Numbers for the issue-18 report from the Fig. 8 / Fig. 15 / packs JSON files. Usage: summarise.py [ROOT]."""
import json, glob, sys, numpy as np
ROOT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/w18"  # where the report / fig15 / packs5g runs wrote
from pathlib import Path
print("== Fig. 8 (shard 0): bytes of v2 / v1 at equal measured error, 5 levels over the overlap")
for f in sorted(glob.glob(ROOT + "/report/fig08_tradeoff_*.json")):
    d = json.load(open(f))
    def curve(pts):
        out = []
        for b, e, *_ in sorted(pts):
            if not out or e < out[-1][1]:
                out.append((b, e))
        return np.array(out)
    v1, v2 = curve(d["frontiers"]["v1"]), curve(d["frontiers"]["v2"])
    lo, hi = max(v1[:, 1].min(), v2[:, 1].min()), min(v1[:, 1].max(), v2[:, 1].max())
    levels = np.geomspace(lo, hi, 5)
    at = lambda c, e: 10 ** np.interp(np.log10(e), np.log10(c[::-1, 1]), np.log10(c[::-1, 0]))
    ratios = [at(v2, e) / at(v1, e) for e in levels]
    print(f"{d['template']}: errors {lo:.4f}..{hi:.4f}: v2/v1 bytes " + " ".join(f"{r:.2f}" for r in ratios),
          f"| top: v1 {v1[-1][0]/1e3:.0f} kB err {v1[-1][1]:.4f}, v2 {v2[-1][0]/1e3:.0f} kB err {v2[-1][1]:.4f}")
for p in sorted(glob.glob(ROOT + "/fig15*/fig15_bytes_quality.json")):
    d = json.load(open(p))
    print("== Fig. 15: SAKURA v2 vs v1 pack at equal masked PSNR (5 levels over the overlap) and equal bytes")
    for w, wd in d["workloads"].items():
        c = wd["comparison"]["sakura-v1"]["psnr_masked"]
        eq, eb = c["equal_quality"], c["equal_bytes"]
        print(w, "savings", " ".join(f"{p['saving']:.0%}@{p['quality']:.1f}dB" for p in eq["points"]), f"mean {eq['mean_saving']:.0%}",
              "| gain at equal bytes", " ".join(f"{p['gain']:+.2f}" for p in eb["points"]),
              "| top psnr_masked v2 %.2f v1 %.2f" % (wd["curves"]["sakura"][-1]["psnr_masked"], wd["curves"]["sakura-v1"][-1]["psnr_masked"]),
              "| bytes range v2 %.2f-%.2f MB v1 %.2f-%.2f MB" % (wd["curves"]["sakura"][0]["bytes"]/1e6, wd["curves"]["sakura"][-1]["bytes"]/1e6,
                                                           wd["curves"]["sakura-v1"][0]["bytes"]/1e6, wd["curves"]["sakura-v1"][-1]["bytes"]/1e6))
        # the same curves read through their upper envelopes (best masked PSNR within the bytes: a point that
        # more bytes made worse is 4-edit noise), savings at 8 masked-PSNR levels over the overlap
        env = {}
        for sysname in ("sakura", "sakura-v1"):
            pts = sorted((c["bytes"], c["psnr_masked"]) for c in wd["curves"][sysname])
            e = np.maximum.accumulate(np.array([q for _, q in pts]))
            env[sysname] = (np.array([b for b, _ in pts]), e)
        lo = max(env["sakura"][1][0], env["sakura-v1"][1][0]); hi = min(env["sakura"][1][-1], env["sakura-v1"][1][-1])
        def bytes_at(sysname, q):
            b, e = env[sysname]
            i = int(np.searchsorted(e, q))  # first point reaching q (envelope: step-wise, interpolated in log bytes)
            if i == 0: return b[0]
            f = (q - e[i - 1]) / max(e[i] - e[i - 1], 1e-9)
            return float(np.exp(np.log(b[i - 1]) + f * (np.log(b[i]) - np.log(b[i - 1]))))
        qs = np.linspace(lo, hi, 8)
        print("   envelope savings", " ".join(f"{1 - bytes_at('sakura', q) / bytes_at('sakura-v1', q):.0%}@{q:.1f}" for q in qs))
p = Path(ROOT + "/packs5g/pack_versions.json")
if p.exists():
    d = json.load(open(p))
    print("== 5G trace, v2 vs v1 pack:", d["starts"], "offsets")
    for w, wd in d["workloads"].items():
        a, b = wd["sakura"], wd["sakura-v1"]
        print(w, " ".join(f"{k} {a[k]:.3f}/{b[k]:.3f}" for k in ("latency_p50_s", "latency_p90_s", "stall_s_mean", "psnr_masked_mean", "ssim_masked_mean")),
              "MB sent %.2f/%.2f" % (a["bytes_mean"] / 1e6, b["bytes_mean"] / 1e6))
here = Path(__file__).parent
for name in ("side_by_side_before.json", "side_by_side.json"):
    p = here / name
    if not p.exists():
        continue
    d = json.load(open(p))
    print(f"== rebuild ({name}): ms best-of, allocated/v1 ratio, over eager execute ({d['execute_eager_ms_best']:.1f} ms/shard)")
    for c, row in d.items():
        if not isinstance(row, dict):
            continue
        line = [f"{c}: kB v1 {row['v1_kB']:.0f} alloc {row['v2_kB']:.0f} (rank {row['v2_rank']:.0f})"]
        for n in ("torch", "opencl"):
            line.append(f"{n} v1 {row[f'v1/{n}_ms']:.1f} alloc {row[f'v2/{n}_ms']:.1f} ms = {row[f'v2/{n}_ms'] / row[f'v1/{n}_ms']:.2f}x, "
                        f"/execute {row[f'v1/{n}_over_execute']:.0%} vs {row[f'v2/{n}_over_execute']:.0%}")
        if "v2/matmul_floor_ms" in row:
            line.append(f"matmul floor v1 {row['v1/matmul_floor_ms']:.1f} alloc {row['v2/matmul_floor_ms']:.1f} ms "
                        f"(/execute {row['v1/matmul_floor_over_execute']:.0%} vs {row['v2/matmul_floor_over_execute']:.0%})")
        print(" | ".join(line))
