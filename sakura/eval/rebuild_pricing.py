"""`sakura bench --figure rebuild-pricing`: does pricing the rebuild into the deadline pay?

The same edits (templates, requests, start offsets, regime scale) with SAKURA's rule as the paper
states it (a level fits when its bytes arrive within the window: rebuild taken as free) and with each
level's predicted rebuild taken off its window (the default: ``SakuraPolicy(price_rebuild=True)``),
and CacheGen with and without the same pricing (its decode priced by bytes). Writes
``rebuild_pricing.{png,json}``: p50 / p90 latency, mean stall, masked PSNR and bytes per workload.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sakura.eval import bench
from sakura.online.policies import CacheGenPolicy, SakuraPolicy

VARIANTS = {  # row name -> (system, policy)
    "sakura": ("sakura", lambda: SakuraPolicy(price_rebuild=True)),
    "sakura (rebuild free)": ("sakura", lambda: SakuraPolicy(price_rebuild=False)),
    "cachegen": ("cachegen", lambda: CacheGenPolicy(price_rebuild=False)),
    "cachegen (decode priced)": ("cachegen", lambda: CacheGenPolicy(price_rebuild=True)),
}


def summarize(rows: list[dict]) -> dict:
    lat = [r["latency_s"] for r in rows]
    return {"p50_s": float(np.percentile(lat, 50)), "p90_s": float(np.percentile(lat, 90)),
            "stall_s_mean": float(np.mean([r["stall_s"] for r in rows])),
            "psnr_masked_mean": float(np.mean([r["psnr_masked"] for r in rows])),
            "bytes_mean": float(np.mean([r["bytes"] for r in rows])), "edits": len(rows)}


def fig_rebuild_pricing(cfg, out: Path, cache: dict, progress, say) -> list[Path]:
    import matplotlib.pyplot as plt

    results: dict = {}
    for workload in cfg.workloads:
        benches = bench.workload_benches(workload, cfg, cache, say)

        def run(prepared, i, trace, start):
            return [bench.run_one(prepared, i, system, trace, start, policy=make(), name=name)
                    for name, (system, make) in VARIANTS.items()]

        rows = bench.sweep(cfg, workload, benches, run, progress, f"rebuild pricing {workload}")
        results[workload] = {name: summarize([r for r in rows if r["system"] == name]) for name in VARIANTS}
    data = {"trace": cfg.trace, "starts": cfg.starts, "workloads": results}
    (out / "rebuild_pricing.json").write_text(json.dumps(data, indent=1))

    fig, axes = plt.subplots(1, 2, figsize=(3 + 2.2 * len(results), 3.6))
    x = np.arange(len(results))
    width = 0.8 / len(VARIANTS)
    for k, name in enumerate(VARIANTS):
        at = x + (k - (len(VARIANTS) - 1) / 2) * width
        axes[0].bar(at, [r[name]["p90_s"] for r in results.values()], width, label=name)
        axes[0].scatter(at, [r[name]["p50_s"] for r in results.values()], color="k", s=8, zorder=3)
        axes[1].bar(at, [r[name]["psnr_masked_mean"] for r in results.values()], width, label=name)
    for ax, label in zip(axes, ("latency p90 (bars), p50 (dots), s", "masked PSNR vs FP16-cache output, dB")):
        ax.set_xticks(x, list(results))
        ax.set_ylabel(label, fontsize=8)
    axes[1].set_ylim(bottom=min(r[n]["psnr_masked_mean"] for r in results.values() for n in VARIANTS) - 5)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"pricing the rebuild into the deadline ({cfg.trace}, {cfg.starts} offsets per workload)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "rebuild_pricing.png", dpi=120)
    plt.close(fig)
    for workload, res in results.items():
        say(f"rebuild pricing {workload}: " + ", ".join(f"{n} p50 {r['p50_s']:.2f} p90 {r['p90_s']:.2f} "
                                                         f"{r['psnr_masked_mean']:.1f} dB" for n, r in res.items()))
    return [out / "rebuild_pricing.png", out / "rebuild_pricing.json"]
