"""Grids of edits for eyeballing a model: synthetic held-out edits (template, mask, reference or prompt,
ground truth, model edit) and catalog edits (template with its mask, each request and its output)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sakura.editing import edit_request
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
    _save(fig, path, title)


def render_catalog_edits(adapter, templates, path: Path, title: str = "", per_template: int = 3) -> None:
    """One row per template: the template with its mask outlined, then for its first evaluation
    requests (held out of profiling) the reference or prompt and the model's full edit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from skimage.segmentation import find_boundaries

    if not templates:
        return
    c = adapter.codec
    cols = 1 + 2 * per_template
    fig, axes = plt.subplots(len(templates), cols, figsize=(1.9 * cols, 2.0 * len(templates)), squeeze=False)
    for i, tpl in enumerate(templates):
        img, mask = tpl.image(c.resolution), tpl.mask(c.resolution)
        outlined = img.copy()
        outlined[find_boundaries(mask, mode="outer")] = (1.0, 0.1, 0.6)
        panels = [(outlined, tpl.id)]
        for r in tpl.eval_requests[:per_template]:
            req = edit_request(tpl, r, resolution=c.resolution, ref_size=c.ref_size)
            label = f'"{req.prompt}"' if req.reference is None else str(r)
            panels += [(req.reference, label), (adapter.full_edit(req).image, "edit")]
        for ax, (im, label) in zip(axes[i], panels):
            ax.axis("off")
            if im is None:
                ax.text(0.5, 0.5, label, ha="center", va="center", fontsize=9, wrap=True)
            else:
                ax.imshow(np.clip(im, 0, 1))
                ax.set_title(label, fontsize=7)
    _save(fig, path, title)


def _save(fig, path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
