"""Figures and tables of `sakura bench` (matplotlib PNGs and a Markdown summary)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sakura.systems import COMPRESSED, STREAMING, SYSTEMS, VARIANTS, color, label  # noqa: E402

# Plot order: every system, then the ablation variants (all from the one registry).
COLORS = {name: color(name) for name in [*SYSTEMS, *VARIANTS]}
NAMES = {name: label(name) for name in [*SYSTEMS, *VARIANTS]}


def load_records(out: Path) -> list[dict]:
    """A bench run's records: its output folder, or a records file (``.jsonl``, or ``.jsonl.gz`` as kept in
    docs/results)."""
    path = out / "records.jsonl" if out.is_dir() else out
    text = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _systems(ws: dict) -> list[str]:
    return [s for s in NAMES if s in ws]


def fig_latency(summary: dict, records: list[dict], path: Path) -> None:
    """Fig. 12 analog: p50 / p90 latency per workload, and the latency CDF."""
    workloads = list(summary["workloads"])
    fig, axes = plt.subplots(1, len(workloads) + 1, figsize=(4.2 * (len(workloads) + 1), 3.6))
    for ax, w in zip(axes, workloads):
        ws = summary["workloads"][w]
        systems = _systems(ws)
        x = np.arange(len(systems))
        p50 = [ws[s]["latency_p50_s"] for s in systems]
        p90 = [ws[s]["latency_p90_s"] for s in systems]
        ax.bar(x - 0.2, p50, 0.4, color=[COLORS[s] for s in systems], label="p50")
        ax.bar(x + 0.2, p90, 0.4, color=[COLORS[s] for s in systems], alpha=0.5, hatch="//", label="p90")
        ax.set_xticks(x, [NAMES[s] for s in systems], rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{w}: latency (s)")
        ax.set_yscale("log")
        if w == workloads[0]:
            ax.legend(fontsize=8)
    ax = axes[-1]
    for s in NAMES:
        lat = np.sort([r["latency_s"] for r in records if r["system"] == s])
        if len(lat):
            ax.plot(lat, np.linspace(0, 1, len(lat)), color=COLORS[s], label=NAMES[s])
    ax.set_xscale("log")
    ax.set_xlabel("latency (s), all workloads")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig_storage(summary: dict, path: Path) -> None:
    """Fig. 13 analog: per-template storage of each system's stored cache."""
    workloads = list(summary["workloads"])
    systems = list(reversed(STREAMING))  # FP16 first, SAKURA last
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(workloads), 3.4))
    width = 0.8 / len(systems)
    for i, s in enumerate(systems):
        vals = [summary["workloads"][w].get(s, {}).get("storage_bytes", 0) / 1e6 for w in workloads]
        ax.bar(np.arange(len(workloads)) + i * width, vals, width, color=COLORS[s], label=NAMES[s])
    ax.set_xticks(np.arange(len(workloads)) + 0.4 - width / 2, workloads)
    ax.set_ylabel("stored per template (MB)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig_bytes_quality(records: list[dict], path: Path) -> None:
    """The bench's own edits: bytes each one sent (what the link allowed) vs its masked PSNR. Fig. 15
    itself is the static sweep over each system's whole range (:func:`fig_quality_vs_bytes`)."""
    workloads = sorted({r["workload"] for r in records})
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.6), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        for s in COMPRESSED:
            rs = [r for r in records if r["workload"] == w and r["system"] == s]
            if rs:
                ax.scatter([r["bytes"] / 1e6 for r in rs], [r["psnr_masked"] for r in rs], s=10,
                           color=COLORS[s], label=NAMES[s], alpha=0.7)
        ax.set_xlabel("bytes transferred (MB)")
        ax.set_ylabel("masked PSNR vs FP16-cache output (dB)")
        ax.set_title(f"{w}: bench edits")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig_quality_vs_bytes(data: dict, path: Path) -> None:
    """Fig. 15: masked PSNR and masked SSIM vs bytes sent (log x), one row per workload; each system
    over its whole byte range (``sakura.eval.equal_bytes``); the dashed line is the FP16 cache."""
    workloads = list(data["workloads"])
    fig, axes = plt.subplots(len(workloads), 2, figsize=(10, 3.4 * len(workloads)), squeeze=False)
    for row, w in zip(axes, workloads):
        wd = data["workloads"][w]
        for ax, metric, name in zip(row, ("psnr_masked", "ssim_masked"), ("masked PSNR (dB)", "masked SSIM")):
            for s, pts in wd["curves"].items():
                ax.plot([p["bytes"] / 1e6 for p in pts], [p[metric] for p in pts], "-o", ms=4, color=COLORS[s],
                        label=NAMES[s])
                rungs = [p for p in pts if p.get("ladder")]  # points above the allocated levels (pack v3)
                if rungs:
                    ax.plot([p["bytes"] / 1e6 for p in rungs], [p[metric] for p in rungs], "^", ms=9, mfc="none",
                            color=COLORS[s], label=f"{NAMES[s]}: ladder rungs")
            ax.axvline(wd["fp16_bytes"] / 1e6, color="#868e96", ls="--", lw=1, label="FP16 cache")
            ax.set_xscale("log")
            ax.set_xlabel("bytes sent per edit (MB, log)")
            ax.set_ylabel(f"{name} vs FP16-cache output")
            ax.set_title(f"{w} ({', '.join(wd['templates'])}): {name}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
        row[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig_example_trace(rows: list[dict], trace_t: np.ndarray, trace_mbps: np.ndarray, path: Path) -> None:
    """Fig. 11 analog: latency of edits started along a stretch of the trace, with its bandwidth."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax2 = ax.twinx()
    ax2.fill_between(trace_t, trace_mbps, step="post", color="#dee2e6", alpha=0.8)
    ax2.set_ylabel("bandwidth (Mbps, scaled)")
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)
    for s in NAMES:
        rs = sorted((r for r in rows if r["system"] == s), key=lambda r: r["start_s"])
        if rs:
            ax.plot(
                [r["start_s"] for r in rs], [r["latency_s"] for r in rs], "-o", ms=3, color=COLORS[s], label=NAMES[s]
            )
    ax.set_xlabel("edit start time in the trace (s)")
    ax.set_ylabel("latency (s)")
    ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary_markdown(summary: dict) -> str:
    lines = ["# sakura bench summary", ""]
    for w, ws in summary["workloads"].items():
        reg = ws["regime"]
        lines += [
            f"## {w}",
            "",
            f"templates {', '.join(reg['templates'])}; mask (tokens) {100 * reg['mask_ratio']:.1f}%; "
            f"trace {reg['trace']} ×{reg['trace_scale']:.3g} (median {reg['trace_median_mbps_scaled']:.1f} Mbps); "
            f"local full {reg['local_full_s']:.3f} s; masked compute {reg['masked_s']:.3f} s; "
            f"FP16 cache {reg['fp16_cache_bytes'] / 1e6:.1f} MB = "
            f"{reg['fp16_transfer_s_at_median']:.2f} s at the median",
            "",
            "| system | p50 (s) | p90 (s) | stall (s) | MB sent | PSNR | SSIM | PSNR mask | SSIM mask | storage MB "
            "| miss rate |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for s in _systems(ws):
            r = ws[s]
            lines.append(
                f"| {NAMES[s]} | {r['latency_p50_s']:.3f} | {r['latency_p90_s']:.3f} | {r['stall_s_mean']:.3f} | "
                f"{r['bytes_mean'] / 1e6:.2f} | {r['psnr_mean']:.2f} | {r['ssim_mean']:.4f} | "
                f"{r['psnr_masked_mean']:.2f} | {r['ssim_masked_mean']:.4f} | {r['storage_bytes'] / 1e6:.1f} | "
                f"{r['deadline_miss_rate']:.2f} |"
            )
        if "sakura" in ws:
            sk = ws["sakura"]
            ratios = []
            for other, key in (("local", "latency_p50_s"), ("cachegen", "latency_p90_s"), ("intq", "latency_p90_s"),
                               ("oracle", "latency_p50_s")):
                if other in ws:
                    ratios.append(f"{other} {key.split('_')[1]} / SAKURA = {ws[other][key] / sk[key]:.2f}×")
            lines += ["", "; ".join(ratios)]
            paired = [f"{NAMES[s]} {ws[s]['over_oracle_p50']:.3f} / {ws[s]['over_oracle_p90']:.3f}"
                      for s in _systems(ws) if s.startswith("sakura") and "over_oracle_p50" in ws[s]]
            if paired:
                lines += ["", "each edit over the oracle's at the same offset, p50 / p90: " + "; ".join(paired)]
        lines.append("")
    return "\n".join(lines + table2_markdown(summary))


def table2_markdown(summary: dict) -> list[str]:
    """Table 2 analog: mean quality vs the FP16-cache output per system and workload, whole image and
    masked region side by side, with the bytes each system sent on the bench's link."""
    workloads = list(summary["workloads"])
    systems = [s for s in NAMES if any(s in summary["workloads"][w] for w in workloads)]
    lines = ["## Table 2: mean quality vs the FP16-cache output", "",
             "Each cell: PSNR / masked PSNR (dB) · SSIM / masked SSIM · MB sent on the bench's link.", "",
             "| system | " + " | ".join(workloads) + " |", "|---|" + "---|" * len(workloads)]
    for s in systems:
        cells = []
        for w in workloads:
            r = summary["workloads"][w].get(s)
            cells.append("–" if r is None else
                         f"{r['psnr_mean']:.2f} / {r['psnr_masked_mean']:.2f} · {r['ssim_mean']:.5f} / "
                         f"{r['ssim_masked_mean']:.5f} · {r['bytes_mean'] / 1e6:.2f}")
        lines.append(f"| {NAMES[s]} | " + " | ".join(cells) + " |")
    return lines + [""]


def write_all(summary: dict, out: Path) -> list[Path]:
    records = load_records(out)
    paths = [out / "fig12_latency.png", out / "fig13_storage.png", out / "bench_bytes_quality.png"]
    fig_latency(summary, records, paths[0])
    fig_storage(summary, paths[1])
    fig_bytes_quality(records, paths[2])
    (out / "summary.md").write_text(summary_markdown(summary))
    return paths + [out / "summary.md"]
