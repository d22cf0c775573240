"""`sakura bench --figure estimators`: which rate estimator gives SAKURA the lower tail.

The same SAKURA edits (same templates, requests, start offsets and regime scale) with each of the
monitor's estimators (:data:`sakura.online.monitor.ESTIMATORS`) over every trace given: by default
the measured traces in ``../shared/traces`` (or ``SAKURA_TRACES_DIR``) when that folder exists, else
the synthetic profiles. Writes ``estimators.png`` / ``estimators.json``: p50 / p90 per trace and
estimator, and the estimator with the lower p90 on most traces.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from sakura.eval import bench
from sakura.online.monitor import ESTIMATORS


def default_traces() -> list[str]:
    folder = Path(os.environ.get("SAKURA_TRACES_DIR", Path(__file__).resolve().parents[3] / "shared" / "traces"))
    found = sorted(str(p) for p in folder.glob("*.csv")) if folder.is_dir() else []
    return found or ["5g", "4g5g", "wifi"]


def fig_estimators(cfg, out: Path, cache: dict, progress, say, traces: list[str] | None = None,
                   system: str = "sakura") -> list[Path]:
    import matplotlib.pyplot as plt

    traces = traces or default_traces()
    workload = "fs" if "fs" in cfg.workloads else cfg.workloads[0]
    benches = bench.workload_benches(workload, cfg, cache, say)
    results: dict = {}
    for spec in traces:
        name = Path(spec).stem if Path(spec).suffix else spec

        def run(prepared, i, trace, start):
            return [bench.run_one(prepared, i, system, trace, start, estimator=e, name=e) for e in ESTIMATORS]

        rows = bench.sweep(cfg, workload, benches, run, progress, f"estimators {name}", trace_spec=spec)
        results[name] = {e: {"p50_s": float(np.percentile([r["latency_s"] for r in rows if r["system"] == e], 50)),
                             "p90_s": float(np.percentile([r["latency_s"] for r in rows if r["system"] == e], 90)),
                             "psnr_masked_mean": float(np.mean([r["psnr_masked"] for r in rows if r["system"] == e])),
                             "bytes_mean": float(np.mean([r["bytes"] for r in rows if r["system"] == e]))}
                         for e in ESTIMATORS}
    wins = {e: sum(min(res, key=lambda k: res[k]["p90_s"]) == e for res in results.values()) for e in ESTIMATORS}
    data = {"workload": workload, "system": system, "starts": cfg.starts, "traces": results, "p90_wins": wins,
            "better": max(wins, key=wins.get)}
    (out / "estimators.json").write_text(json.dumps(data, indent=1))
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(results), 3.4))
    x = np.arange(len(results))
    width = 0.8 / len(ESTIMATORS)
    for k, e in enumerate(ESTIMATORS):
        ax.bar(x + (k - (len(ESTIMATORS) - 1) / 2) * width, [r[e]["p90_s"] for r in results.values()], width, label=e)
    ax.set_xticks(x, list(results), rotation=15, fontsize=8)
    ax.set_ylabel(f"{system} p90 latency (s)")
    ax.set_title(f"rate estimators, {workload}, {cfg.starts} offsets per trace")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "estimators.png", dpi=120)
    plt.close(fig)
    say(f"estimators: lower p90 on {wins} traces → {data['better']}")
    return [out / "estimators.png", out / "estimators.json"]
