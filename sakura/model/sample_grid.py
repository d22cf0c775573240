"""A grid of edits for eyeballing a model: template, mask, reference or prompt, ground truth, model edit."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sakura.model.base import EditRequest
from sakura.model.edit_data import EditExample


def render_grid(adapter, examples: list[EditExample], path: Path, title: str = "", extra=None) -> None:
    """Rows: template | mask | reference or prompt | ground truth | model edit (| extra columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    extra = extra or {}
    cols = ["template", "mask", "reference / prompt", "ground truth", "model edit"] + list(extra)
    fig, axes = plt.subplots(len(examples), len(cols), figsize=(2.0 * len(cols), 2.0 * len(examples)), squeeze=False)
    for i, e in enumerate(examples):
        req = EditRequest(e.template, e.mask, e.task, e.prompt or "", e.reference, seed=0)
        out = adapter.full_edit(req).image
        panels = [e.template, e.mask, e.reference, e.target, out] + [f(e) for f in extra.values()]
        for j, (ax, im) in enumerate(zip(axes[i], panels)):
            ax.axis("off")
            if i == 0:
                ax.set_title(cols[j], fontsize=8)
            if j == 2 and im is None:
                ax.text(0.5, 0.5, f"{e.task}:\n\"{e.prompt}\"", ha="center", va="center", fontsize=8, wrap=True)
            elif im is not None:
                ax.imshow(np.clip(im, 0, 1), cmap="gray" if im.ndim == 2 else None, vmin=0, vmax=1)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
