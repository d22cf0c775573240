"""The README's headline tables from one `sakura bench --figure regret` run per trace (issue #32 item 5).

    python docs/results/headline_table.py [--plot OUT.png] RUN_DIR [RUN_DIR ...]    # each holds a summary.json

Table 1: per workload and system, p50 / p90 latency and mean masked PSNR on each trace. Table 2: each streaming
system against its own clairvoyant optimum: latency / optimal latency at equal quality (p50 / p90) and the optimum's
masked PSNR minus the system's at equal latency (p50 / p90).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sakura.systems import SYSTEMS, label

TRACE_NAMES = {"5g-walking": "5G walking", "5g-driving": "5G driving", "4g-driving": "4G driving",
               "4g5g-mixed": "4G+5G mixed", "5g": "5G synthetic"}


def trace_name(summary: dict) -> str:
    stem = Path(summary["config"]["trace"]).stem
    return next((v for k, v in TRACE_NAMES.items() if stem.startswith(k)), stem)


def psnr(x: float) -> str:
    return "∞" if x >= 100.0 else f"{x:.1f}"


def plot(runs: list[dict], names: list[str], out: Path) -> None:
    """One panel per workload: each system's p50 (dot) and p90 (the whisker's end) on each trace, log scale."""
    workloads = list(dict.fromkeys(w for s in runs for w in s["workloads"]))
    fig, axes = plt.subplots(1, len(workloads), figsize=(3.6 * len(workloads) + 1.5, 3.8), sharey=True,
                             squeeze=False)
    for ax, w in zip(axes[0], workloads):
        systems = [n for n in SYSTEMS if any(n in s["workloads"].get(w, {}) for s in runs)]
        width = 0.8 / len(systems)
        for k, name in enumerate(systems):
            xs, p50, p90 = [], [], []
            for i, s in enumerate(runs):
                r = s["workloads"].get(w, {}).get(name)
                if r:
                    xs.append(i + (k - (len(systems) - 1) / 2) * width)
                    p50.append(r["latency_p50_s"])
                    p90.append(r["latency_p90_s"])
            dots = ax.scatter(xs, p50, s=18, label=label(name), zorder=3)
            ax.vlines(xs, p50, p90, color=dots.get_facecolor()[0], lw=1.5)
            ax.scatter(xs, p90, marker="_", color=dots.get_facecolor()[0], s=40)
        ax.set_xticks(range(len(names)), [n.replace(" ", "\n", 1) for n in names], fontsize=8)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_title(w)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("latency (s): p50 dot, p90 tick")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center right")
    fig.suptitle("p50 / p90 latency per trace (held-out halves, paper regime, simulated clock)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 1.3 / fig.get_figwidth(), 1))
    fig.savefig(out, dpi=130)
    print(f"wrote {out}")


def visible(regret: dict) -> str:
    """The visible gap's p50 / p90 (summaries from before it was recorded: nothing)."""
    v = regret.get("psnr_gap_visible_db") or {}
    return "" if v.get("p50") is None else f" · {v['p50']:.1f} / {v['p90']:.1f}"


def main(dirs: list[str], plot_to: str | None = None, regret_systems: list[str] | None = None) -> None:
    runs = [json.loads((Path(d) / "summary.json").read_text()) for d in dirs]
    names = [trace_name(s) for s in runs]
    if plot_to:
        plot(runs, names, Path(plot_to))
    workloads = list(dict.fromkeys(w for s in runs for w in s["workloads"]))
    head = "| workload | system | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names)
    print("p50 / p90 latency (s) · mean masked PSNR (dB)\n\n" + head)
    for w in workloads:
        systems = [n for n in SYSTEMS if any(n in s["workloads"].get(w, {}) for s in runs)]
        for i, name in enumerate(systems):
            cells = []
            for s in runs:
                r = s["workloads"].get(w, {}).get(name)
                cells.append("–" if r is None else f"{r['latency_p50_s']:.2f} / {r['latency_p90_s']:.2f} · "
                             f"{psnr(r['psnr_masked_mean'])}")
            print(f"| {w if i == 0 else ''} | {label(name)} | " + " | ".join(cells) + " |")
    print("\nlatency / optimal at equal quality, p50 / p90 · optimum's masked PSNR − own at equal latency, "
          "p50 / p90 (dB) · the same with each PSNR at most the display's 58.9 dB, p50 / p90\n\n" + head)
    for w in workloads:
        systems = [n for n in (regret_systems or [*SYSTEMS, "sakura+perfect"])
                   if any((s["workloads"].get(w, {}).get(n) or {}).get("regret") for s in runs)]
        for i, name in enumerate(systems):
            cells = []
            for s in runs:
                g = (s["workloads"].get(w, {}).get(name) or {}).get("regret")
                cells.append("–" if not g else f"{g['latency_over_optimal']['p50']:.3f} / "
                             f"{g['latency_over_optimal']['p90']:.3f} · {g['psnr_gap_db']['p50']:.1f} / "
                             f"{g['psnr_gap_db']['p90']:.1f}" + visible(g))
            title = "SAKURA, true future rates" if name == "sakura+perfect" else label(name)
            print(f"| {w if i == 0 else ''} | {title} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="bench output folders (summary.json)")
    parser.add_argument("--plot", help="also draw p50/p90 per system and trace to this PNG")
    parser.add_argument("--regret-systems", help="comma-separated rows of the regret table (default: every system)")
    args = parser.parse_args()
    main(args.runs, args.plot, args.regret_systems.split(",") if args.regret_systems else None)
