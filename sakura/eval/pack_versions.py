"""Issue #18's before/after on a trace: SAKURA streaming its v2 pack vs the same system on the v1 pack.

Same runtime, policy, trace offsets and regime scale (the scale depends on the FP16 cache only); the
only difference is the stored file the edit streams: ``<id>.pack`` (v2: per-group bits, coded planes)
or ``<id>.v1.pack`` (uniform bits, raw planes; the ``sakura-v1`` format). Reports per workload the
latency p50 / p90, stall, bytes sent and quality (masked PSNR / SSIM vs the FP16-cache output), plus
each file's storage, and edit by edit (the same offset and request on both packs) how many the v2 pack
ends sooner, at the same time or later, by how much. ``sakura bench --figure packs``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sakura.eval import bench
from sakura.systems import OURS

VERSIONS = ("sakura", "sakura-v1")  # row name → stored format streamed (SAKURA's own policy for both)
SAME_S = 1e-3  # latencies this close count as equal (rebuilds are timed, so they jitter by about this)


def _stats(rows: list[dict]) -> dict:
    lat = [r["latency_s"] for r in rows]
    return {
        "edits": len(rows),
        "latency_p50_s": float(np.percentile(lat, 50)),
        "latency_p90_s": float(np.percentile(lat, 90)),
        "stall_s_mean": float(np.mean([r["stall_s"] for r in rows])),
        "bytes_mean": float(np.mean([r["bytes"] for r in rows])),
        "psnr_masked_mean": float(np.mean([r["psnr_masked"] for r in rows])),
        "ssim_masked_mean": float(np.mean([r["ssim_masked"] for r in rows])),
        "psnr_mean": float(np.mean([r["psnr"] for r in rows])),
    }


def paired(rows: list[dict]) -> dict:
    """Edit by edit, v2 against v1 at the same template, request and offset: how many end sooner / the
    same / later (within ``SAME_S``), the median and extreme differences, and each pair."""
    by_edit = {}
    for r in rows:
        by_edit.setdefault((r["template"], r["request"], r["start_s"]), {})[r["system"]] = r
    pairs = [(e["sakura"], e["sakura-v1"]) for e in by_edit.values() if set(VERSIONS) <= set(e)]
    delta = np.array([a["latency_s"] - b["latency_s"] for a, b in pairs])
    dpsnr = np.array([a["psnr_masked"] - b["psnr_masked"] for a, b in pairs])
    return {
        "faster": int((delta < -SAME_S).sum()),
        "same": int((abs(delta) <= SAME_S).sum()),
        "slower": int((delta > SAME_S).sum()),
        "latency_delta_median_s": float(np.median(delta)),
        "latency_delta_max_s": float(delta.max()),
        "latency_delta_min_s": float(delta.min()),
        "psnr_masked_delta_median_db": float(np.median(dpsnr)),
        "edits": [
            {
                "template": a["template"],
                "request": a["request"],
                "start_s": a["start_s"],
                "latency_s": [a["latency_s"], b["latency_s"]],
                "psnr_masked": [a["psnr_masked"], b["psnr_masked"]],
                "bytes": [a["bytes"], b["bytes"]],
                "fallbacks": [a["fallbacks"], b["fallbacks"]],
            }
            for a, b in pairs
        ],
    }


def fig_pack_versions(cfg, out: Path, cache: dict, progress, say) -> list[Path]:
    """Both packs at ``cfg.starts`` offsets of ``cfg.trace`` per workload; JSON + PNG."""

    result: dict = {"trace": cfg.trace, "starts": cfg.starts, "regime": cfg.regime, "workloads": {}}
    for workload in cfg.workloads:
        benches = bench.workload_benches(workload, cfg, cache, say)

        def run(prepared, i, trace, start):
            v1 = prepared.runtime.encoding(prepared.state, "sakura-v1")
            return [bench.run_one(prepared, i, "sakura", trace, start),
                    bench.run_one(prepared, i, "sakura", trace, start, encoding=v1, name="sakura-v1")]

        rows = bench.sweep(cfg, workload, benches, run, progress, f"packs {workload}")
        stats = {v: _stats([r for r in rows if r["system"] == v]) for v in VERSIONS}
        for v in VERSIONS:
            stats[v]["storage_bytes_mean"] = float(np.mean([
                (Path(cfg.packs) / f"{p.template.id}{'.v1' if v == 'sakura-v1' else ''}.pack").stat().st_size
                for p in benches]))
        pairs = paired(rows)
        result["workloads"][workload] = {"templates": [p.template.id for p in benches], **stats, "paired": pairs}
        a, b = stats["sakura"], stats["sakura-v1"]
        say(
            f"{workload}: p50 {a['latency_p50_s']:.2f} s (v1 {b['latency_p50_s']:.2f}), p90 {a['latency_p90_s']:.2f} s "
            f"(v1 {b['latency_p90_s']:.2f}), masked PSNR {a['psnr_masked_mean']:.2f} dB "
            f"(v1 {b['psnr_masked_mean']:.2f}), {a['bytes_mean'] / 1e6:.2f} MB sent "
            f"(v1 {b['bytes_mean'] / 1e6:.2f}); per edit sooner on {pairs['faster']}, "
            f"same on {pairs['same']}, later on {pairs['slower']} (by at most {pairs['latency_delta_max_s']:.3f} s)"
        )
    js, png = out / "pack_versions.json", out / "pack_versions.png"
    js.write_text(json.dumps(result, indent=1))
    plot_pack_versions(result, png)
    return [png, js]


def plot_pack_versions(result: dict, png: Path) -> None:
    """p50, p90 and masked PSNR per workload for both packs, and each edit's latency difference (v2 − v1)."""
    import matplotlib.pyplot as plt

    ws = list(result["workloads"])
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
    x = np.arange(len(ws))
    for ax, (key, name) in zip(axes, (("latency_p50_s", "latency p50 (s)"), ("latency_p90_s", "latency p90 (s)"),
                                      ("psnr_masked_mean", "masked PSNR vs FP16-cache output (dB)"))):
        for j, v in enumerate(VERSIONS):
            ax.bar(x + 0.38 * j, [result["workloads"][w][v][key] for w in ws], 0.38,
                   label="v2 pack" if v == OURS else "v1 pack")
        ax.set_xticks(x + 0.19, ws)
        ax.set_ylabel(name)
    axes[0].legend(fontsize=8)
    ax = axes[3]
    rng = np.random.default_rng(0)
    for i, w in enumerate(ws):
        edits = result["workloads"][w].get("paired", {}).get("edits", [])
        delta = [1e3 * (e["latency_s"][0] - e["latency_s"][1]) for e in edits]
        ax.scatter(i + rng.uniform(-0.2, 0.2, len(delta)), delta, s=9, alpha=0.7)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x, ws)
    ax.set_ylabel("per edit: v2 − v1 latency (ms)")
    fig.suptitle(f"SAKURA on the {result['trace']} trace: v2 vs v1 pack ({result['starts']} offsets per workload; "
                 "right: the same edit on both packs)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
