"""Numbers for the issue-18 report from the Fig. 8 / Fig. 15 / packs JSON files."""
import json, glob, sys, numpy as np
from pathlib import Path
print("== Fig. 8 (shard 0): bytes of v2 / v1 at equal measured error, 5 levels over the overlap")
for f in sorted(glob.glob("/tmp/w18/report/fig08_tradeoff_*.json")):
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
p = Path("/tmp/w18/fig15/fig15_bytes_quality.json")
if p.exists():
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
p = Path("/tmp/w18/packs5g/pack_versions.json")
if p.exists():
    d = json.load(open(p))
    print("== 5G trace, v2 vs v1 pack:", d["starts"], "offsets")
    for w, wd in d["workloads"].items():
        a, b = wd["sakura"], wd["sakura-v1"]
        print(w, " ".join(f"{k} {a[k]:.3f}/{b[k]:.3f}" for k in ("latency_p50_s", "latency_p90_s", "stall_s_mean", "psnr_masked_mean", "ssim_masked_mean")),
              "MB sent %.2f/%.2f" % (a["bytes_mean"] / 1e6, b["bytes_mean"] / 1e6))
