"""What participants would judge: one template request's reference beside each system's pairs at every budget
level of the study's pool, labelled with bytes and masked PSNR (the labels participants never see).

    .venv/bin/python docs/results/issue31/pool_montage.py --data runs/study --unit fs-astronaut#0 [--out FILE]

Also prints, per system and level, masked PSNR over every template request of the pool (mean, min, max).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from app.study import StudyStore  # noqa: E402
from device_bridge import SYSTEMS  # noqa: E402

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="runs/study")
    ap.add_argument("--unit", default="fs-astronaut#0")
    ap.add_argument("--out", default=str(HERE / "pool_montage.png"))
    a = ap.parse_args()
    store = StudyStore(a.data)
    pool = [c for c in store.pool() if c.kind == "test"]
    systems = [s for s in SYSTEMS if any(c.system == s for c in pool)]
    for s in systems:
        for k in sorted({c.budget for c in pool if c.system == s}):
            xs = [c for c in pool if c.system == s and c.budget == k]
            ps = [c.psnr_masked for c in xs]
            print(f"{s:9s} level {k}: {len(xs)} pairs, {100 * sum(c.fraction for c in xs) / len(xs):5.2f} % of FP16, "
                  f"masked PSNR mean {sum(ps) / len(ps):5.1f} dB (min {min(ps):5.1f}, max {max(ps):5.1f})")
    t, r = a.unit.split("#")
    mine = [c for c in pool if c.template_id == t and c.request == int(r)]
    levels = max(c.budget for c in mine) + 1
    fig, axes = plt.subplots(len(systems), levels + 1, figsize=(2.3 * (levels + 1), 2.5 * len(systems)),
                             constrained_layout=True)
    for i, s in enumerate(systems):
        ref = store.image_path(mine[0].reference)
        axes[i][0].imshow(Image.open(ref))
        axes[i][0].set_title("FP16-cache output", fontsize=8)
        for k in range(levels):
            ax = axes[i][k + 1]
            c = next((c for c in mine if c.system == s and c.budget == k), None)
            if c is not None:
                ax.imshow(Image.open(store.image_path(c.image)))
                ax.set_title(f"{SYSTEMS[s].label} L{k}: {c.bytes / 1e6:.2f} MB ({100 * c.fraction:.1f} %)\n"
                             f"masked {c.psnr_masked:.1f} dB", fontsize=8)
        for ax in axes[i]:
            ax.axis("off")
    fig.suptitle(f"Study pool, {a.unit}: the pairs at each budget level (labels are never shown to participants)",
                 fontsize=9)
    fig.savefig(a.out, dpi=100)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
