"""Table + figure of the wait-rule A/B (rule_ab.py's jsonl files in this folder)."""
import json
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

here = Path(__file__).parent
workloads = ("fs", "vton", "mb", "mb-sd")
variants = [("old", "sakura"), ("new", "sakura"), ("old", "sakura-v1"), ("new", "sakura-v1")]
summary, lines = {}, ["| workload | pack | rule | p50 s | p90 s | mean s | max s | masked PSNR dB | edits whose fallbacks changed |",
                      "|---|---|---|---|---|---|---|---|---|"]
for w in workloads:
    rows = [json.loads(x) for x in (here / f"ab_{w}.jsonl").read_text().splitlines()]
    by = {(r["rule"], r["system"], r["template"], r["start_s"]): r for r in rows}
    for rule, system in variants:
        sel = [r for r in rows if r["rule"] == rule and r["system"] == system]
        lat = np.array([r["latency_s"] for r in sel])
        changed = sum(by[("old", system, r["template"], r["start_s"])]["fallbacks"] != r["fallbacks"] for r in sel)
        s = {"p50": float(np.percentile(lat, 50)), "p90": float(np.percentile(lat, 90)), "mean": float(lat.mean()),
             "max": float(lat.max()), "psnr_masked": float(np.mean([r["psnr_masked"] for r in sel])), "edits": len(sel),
             "changed": changed if rule == "new" else 0}
        summary[f"{w}/{system}/{rule}"] = s
        lines.append(f"| {w} | {'v2 (session 8)' if system == 'sakura' else 'v1'} | {rule} | {s['p50']:.3f} | {s['p90']:.3f} | "
                     f"{s['mean']:.3f} | {s['max']:.2f} | {s['psnr_masked']:.2f} | {s['changed'] if rule == 'new' else ''} |")
(here / "summary.json").write_text(json.dumps(summary, indent=1))
(here / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
fig, axes = plt.subplots(1, 4, figsize=(13, 3.4))
for ax, w in zip(axes, workloads):
    vals = [summary[f"{w}/{s}/{r}"]["p90"] for r, s in variants]
    ax.bar(range(4), vals, color=["#c44", "#e99", "#448", "#99c"])
    ax.set_xticks(range(4), [f"{'v2' if s == 'sakura' else 'v1'}\n{r} rule" for r, s in variants], fontsize=8)
    ax.set_title(f"{w}: p90 latency, 5G, 40 offsets", fontsize=9)
    ax.set_ylabel("s")
fig.suptitle("Wait rule: a wait counts as quality-free only for a prefix 2x better than a reuse", fontsize=10)
fig.tight_layout()
fig.savefig(here / "wait_rule_p90.png", dpi=110)
