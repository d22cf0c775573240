"""`sakura bench --figure tails`: the latency tail with and without anytime shards and fallbacks.

The same edits (templates, requests, start offsets, regime scale) on every measured trace (``../shared/
traces`` or ``SAKURA_TRACES_DIR``; the synthetic profiles without them) for each workload, with:

* ``sakura`` — the runtime as it ships: anytime shards and fallbacks;
* ``sakura-no-fallback`` — anytime shards, always wait;
* ``sakura-paper`` — the paper's runtime: whole configurations, always wait;
* ``local`` and ``oracle`` — the two bounds.

Writes ``tails.png`` (latency CDFs, one panel per workload × trace), ``tails.json`` and ``tails.md``
(p50 / p90 per variant, fallbacks per edit, masked PSNR with and without fallbacks).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sakura.eval import bench
from sakura.eval.estimators import default_traces
from sakura.eval.summary_stats import edit_key, fallback_stats, paired_over_oracle
from sakura.systems import FLOOR

VARIANTS = {"sakura": {}, "sakura-no-fallback": {"fallbacks": False},
            "sakura-paper": {"fallbacks": False, "anytime": False}}
BOUNDS = ("local", "oracle")


def _edits(prepared, i, trace, start) -> list[dict]:
    rows = [bench.run_one(prepared, i, "sakura", trace, start, name=name, **kw) for name, kw in VARIANTS.items()]
    return rows + [bench.run_one(prepared, i, s, trace, start) for s in BOUNDS]


def _stats(rows: list[dict], oracle: dict) -> dict:
    lat = [r["latency_s"] for r in rows]
    return {"p50_s": float(np.percentile(lat, 50)), "p90_s": float(np.percentile(lat, 90)),
            "max_s": float(np.max(lat)), "bytes_mean": float(np.mean([r["bytes"] for r in rows])),
            "psnr_masked_median": float(np.median([r["psnr_masked"] for r in rows])),
            **paired_over_oracle(rows, oracle), **fallback_stats(rows), "latency_s": lat}


def fig_tails(cfg, out: Path, cache: dict, progress, say, traces: list[str] | None = None) -> list[Path]:
    traces = traces or default_traces()
    results: dict = {}
    for workload in cfg.workloads:
        benches = bench.workload_benches(workload, cfg, cache, say)
        for spec in traces:
            name = Path(spec).stem if Path(spec).suffix else spec
            rows = bench.sweep(cfg, workload, benches, _edits, progress, f"tails {workload} {name}", trace_spec=spec)
            oracle = {edit_key(r): r["latency_s"] for r in rows if r["system"] == FLOOR}
            results.setdefault(workload, {})[name] = {v: _stats([r for r in rows if r["system"] == v], oracle)
                                                      for v in (*VARIANTS, *BOUNDS)}
    data = {"starts": cfg.starts, "regime": cfg.regime, "workloads": results, "checks": checks(results)}
    (out / "tails.json").write_text(json.dumps(data, indent=1))
    (out / "tails.md").write_text(table(results))
    plot(results, out / "tails.png", cfg.starts)
    for line in data["checks"]:
        say(line)
    return [out / "tails.png", out / "tails.json", out / "tails.md"]


def checks(results: dict) -> list[str]:
    """Where shipped SAKURA stands against the tail targets: p90 ≤ local p90, p50 ≤ 1.05× oracle."""
    lines = []
    for workload, by_trace in results.items():
        for trace, r in by_trace.items():
            s, loc, orc = r["sakura"], r["local"], r["oracle"]
            lines.append(
                f"{workload} {trace}: sakura p90 {s['p90_s']:.2f} s vs local {loc['p90_s']:.2f} s "
                f"({'ok' if s['p90_s'] <= loc['p90_s'] else 'OVER'}), p90/oracle {s['p90_s'] / orc['p90_s']:.2f}, "
                f"p50/oracle {s['p50_s'] / orc['p50_s']:.2f} (each edit over its oracle: p50 "
                f"{s.get('over_oracle_p50', float('nan')):.3f}, p90 {s.get('over_oracle_p90', float('nan')):.2f})"
            )
    return lines


def table(results: dict) -> str:
    head = ("| workload | trace | variant | p50 s | p90 s | max s | MB | fallbacks/edit (reuse, local) | edits with "
            "fallbacks | masked PSNR with / without fallbacks (dB) |\n|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for workload, by_trace in results.items():
        for trace, r in by_trace.items():
            for v, s in r.items():
                fb = s["fallbacks_mean"]
                fmt = lambda x: "–" if x is None else f"{x:.1f}"  # noqa: E731
                rows.append(f"| {workload} | {trace} | {v} | {s['p50_s']:.2f} | {s['p90_s']:.2f} | {s['max_s']:.2f} | "
                            f"{s['bytes_mean'] / 1e6:.3f} | {fb.get('reuse', 0):.2f}, {fb.get('local', 0):.2f} | "
                            f"{100 * s['fallback_rate']:.0f}% | {fmt(s['psnr_masked_with_fallbacks'])} / "
                            f"{fmt(s['psnr_masked_without_fallbacks'])} |")
    return head + "\n".join(rows) + "\n"


def plot(results: dict, path: Path, starts: int) -> None:
    import matplotlib.pyplot as plt

    workloads = list(results)
    traces = list(next(iter(results.values())))
    fig, axes = plt.subplots(len(workloads), len(traces), figsize=(3.2 * len(traces), 2.6 * len(workloads)),
                             squeeze=False, sharey=True)
    styles = {"sakura": ("C3", "-"), "sakura-no-fallback": ("C1", "--"), "sakura-paper": ("C5", ":"),
              "local": ("k", "-."), "oracle": ("C2", "-")}
    for a, workload in enumerate(workloads):
        for b, trace in enumerate(traces):
            ax = axes[a][b]
            for v, s in results[workload][trace].items():
                lat = np.sort(s["latency_s"])
                color, ls = styles.get(v, ("C0", "-"))
                ax.step(lat, np.arange(1, len(lat) + 1) / len(lat), where="post", color=color, ls=ls, label=v, lw=1.3)
            ax.axhline(0.9, color="0.7", lw=0.6)
            ax.set_title(f"{workload} · {trace}", fontsize=8)
            if b == 0:
                ax.set_ylabel("CDF of edits")
            if a == len(workloads) - 1:
                ax.set_xlabel("latency (s)")
    axes[0][0].legend(fontsize=6, loc="lower right")
    fig.suptitle(f"latency tails, {starts} offsets per trace (paper regime)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
