"""`sakura bench --figure regret`: CDFs of each streaming system's regret against its clairvoyant optimum."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

PANELS = (("latency_ratio", "latency / optimal latency at equal quality"),
          ("psnr_gap_db", "optimal masked PSNR − the system's, at equal latency (dB)"),
          ("psnr_gap_visible_db", "the same, each PSNR at most the display's (58.9 dB)"))
VARIANT_STYLES = {"perfect": "--", "rule": ":"}  # line style of a variant row (sakura+perfect, sakura+rule)


def regret_cdfs(records: Path, out: Path, trace: str = "") -> Path:
    """One row of panels per workload: the CDF over edits of each system's latency ratio and PSNR gap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sakura.eval import plots as P  # (matplotlib: only when the figure is drawn)

    rows = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("regret")]
    workloads = sorted({r["workload"] for r in rows}) or ["(none)"]
    fig, axes = plt.subplots(len(workloads), len(PANELS), figsize=(5 * len(PANELS), 3.2 * len(workloads)),
                             squeeze=False)
    for i, w in enumerate(workloads):
        mine = [r for r in rows if r["workload"] == w]
        for ax, (key, label) in zip(axes[i], PANELS):
            for system in sorted({r["system"] for r in mine}):
                xs = np.sort([r["regret"][key] for r in mine
                              if r["system"] == system and r["regret"].get(key) is not None])
                if len(xs):
                    # (a variant, sakura+perfect or sakura+rule: its system's colour, dashed or dotted)
                    _, plus, variant = system.partition("+")
                    style = VARIANT_STYLES.get(variant, "--") if plus else "-"
                    ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=P.NAMES.get(system, system),
                            color=P.COLORS.get(system.split("+")[0]), linestyle=style)
            ax.set_xlabel(label, fontsize=8)
            ax.set_ylabel("share of edits")
            ax.set_title(f"{w} on {Path(trace).name}" if trace else w, fontsize=9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "fig_regret.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
