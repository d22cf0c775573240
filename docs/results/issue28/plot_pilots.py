"""Draw pilots.png from pilots.json: cache sensitivity and held-out skill of each pilot.

    python docs/results/issue28/plot_pilots.py
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
data = json.loads((HERE / "pilots.json").read_text())
pilots = data["pilots"]
names = list(pilots)
templates = list(pilots[names[0]]["sensitivity"])
fig, axes = plt.subplots(1, 3, figsize=(14, 4))
for ax, metric, target in ((axes[0], "int2", 32), (axes[1], "zeroed", 20)):
    w = 0.8 / len(templates)
    for i, tid in enumerate(templates):
        ax.bar(np.arange(len(names)) + i * w, [pilots[n]["sensitivity"][tid][metric] for n in names], w, label=tid)
        ship = data["shipped_sakura_tiny_4400_steps"][metric][tid]
        ax.plot([len(names) - 0.2 + i * w], [ship], "k_", ms=12, label="shipped (4 400 steps)" if i == 0 else None)
    ax.axhline(target, color="r", ls="--", lw=1, label=f"target <= {target} dB")
    ax.set_xticks(np.arange(len(names)) + 0.4 - w / 2, names)
    ax.set_title(f"{metric} cache vs exact cache\n(masked PSNR; lower = the cache matters more)", fontsize=9)
    ax.set_ylabel("dB")
    ax.legend(fontsize=7)
ax = axes[2]
for i, task in enumerate(("fs", "vton", "mb")):
    gain = [pilots[n]["skill"][task][2] for n in names]
    ax.bar(np.arange(len(names)) + i * 0.27, gain, 0.27, label=task)
ax.axhline(5, color="r", ls="--", lw=1, label="target fs/vton: copy + 5")
ax.axhline(3, color="m", ls=":", lw=1, label="target mb: copy + 3")
ax.set_xticks(np.arange(len(names)) + 0.27, names)
ax.set_title("held-out skill\n(masked PSNR gain over copying the template)", fontsize=9)
ax.set_ylabel("dB over copy")
ax.legend(fontsize=7)
fig.suptitle("issue 28 pilots, 20 CPU-minutes each (~925 steps); black ticks at right: shipped sakura-tiny (4 400 steps)",
             fontsize=10)
fig.tight_layout()
fig.savefig(HERE / "pilots.png", dpi=100)
