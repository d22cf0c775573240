"""The README's numbers table (and its ratios) from a `sakura bench` run's summary.json.

    python docs/results/readme_table.py runs/bench/summary.json
"""

from __future__ import annotations

import json
import sys

from sakura.systems import FLOOR, OURS, SYSTEMS, label


def fmt_psnr(x: float) -> str:
    return "∞" if x >= 100.0 else f"{x:.1f}"


def main(path: str) -> None:
    summary = json.load(open(path))
    think = summary["config"].get("think_time")
    print("| workload | system | p50 | p90 | stall | MB sent | PSNR | PSNR mask | SSIM mask | stored MB | "
          "fallbacks / edit |\n|---|---|---|---|---|---|---|---|---|---|---|")
    ratios: dict[str, dict[str, float]] = {}
    for workload, rows in summary["workloads"].items():
        regime = rows.get("regime", {})
        mask = regime.get("mask_ratio")
        first = True
        names = [n for n in SYSTEMS if n in rows] + [n for n in rows if n not in SYSTEMS and n != "regime"]
        for name in names:
            r = rows[name]
            head = f"{workload}" + (f" ({100 * mask:.1f}% tokens)" if mask else "") if first else ""
            first = False
            fired = ", ".join(f"{k} {v:.2f}" for k, v in sorted((r.get("fallbacks_mean") or {}).items()) if v) or "–"
            stored = f"{r['storage_bytes'] / 1e6:.1f}" if name in SYSTEMS else "(same pack)"
            title = label(name) + (f" ({think:g} s think)" if name not in SYSTEMS and think else "")
            print(f"| {head} | {title} | {r['latency_p50_s']:.3f} | {r['latency_p90_s']:.3f} | "
                  f"{r['stall_s_mean']:.3f} | {r['bytes_mean'] / 1e6:.2f} | {fmt_psnr(r['psnr_mean'])} | "
                  f"{fmt_psnr(r['psnr_masked_mean'])} | {r['ssim_masked_mean']:.4f} | {stored} | {fired} |")
        ours, floor, local = rows[OURS], rows[FLOOR], rows.get("local")
        ratios[workload] = {
            "Local p50 / SAKURA p50": local["latency_p50_s"] / ours["latency_p50_s"] if local else float("nan"),
            "SAKURA p90 / Local p90": ours["latency_p90_s"] / local["latency_p90_s"] if local else float("nan"),
            "SAKURA p90 / Oracle p90": ours["latency_p90_s"] / floor["latency_p90_s"],
            "SAKURA p50 / Oracle p50": ours["latency_p50_s"] / floor["latency_p50_s"],
            "SAKURA / Oracle per edit, p50 (paired)": ours.get("over_oracle_p50", float("nan")),
        }
        prefetch = rows.get(f"{OURS}+prefetch")
        if prefetch:
            ratios[workload]["SAKURA+prefetch p90 / Oracle p90"] = prefetch["latency_p90_s"] / floor["latency_p90_s"]
        for other in ("cachegen", "intq"):
            if other in rows:
                p90 = rows[other]["latency_p90_s"]
                ratios[workload][f"{label(other)} p90 / SAKURA p90"] = p90 / ours["latency_p90_s"]
        if "cachegen" in rows:
            cg = rows["cachegen"]
            ratios[workload]["masked PSNR SAKURA − CacheGen (dB)"] = ours["psnr_masked_mean"] - cg["psnr_masked_mean"]
            ratios[workload]["bytes CacheGen / SAKURA"] = cg["bytes_mean"] / ours["bytes_mean"]
        if "fp16" in rows:
            ratios[workload]["storage FP16 / SAKURA"] = rows["fp16"]["storage_bytes"] / ours["storage_bytes"]
        ratios[workload]["SAKURA edits with a fallback"] = ours.get("fallback_rate", float("nan"))
    workloads = list(ratios)
    print(f"\n| ratio | {' | '.join(workloads)} |\n|---|{'---|' * len(workloads)}")
    for key in next(iter(ratios.values())):
        def cell(x: float) -> str:
            if key.endswith("fallback"):
                return f"{100 * x:.0f}%"
            return f"{x:+.1f}" if "(dB)" in key else f"{x:.2f}"

        print(f"| {key} | " + " | ".join(cell(ratios[w].get(key, float("nan"))) for w in workloads) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
