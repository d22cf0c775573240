"""`sakura report importance|tradeoff|q-sweep`: the offline observations behind the method.

importance (Fig. 2 analog): (a) share of the induced image error when each decile of reusable tokens,
ranked by profiled importance, is quantised to INT2 while the rest stays exact; (b) overlap of the
top-10% tokens between the profiling requests and each held-out request.
tradeoff (Fig. 8 analog): weighted reconstruction error vs bytes for one shard, per (b_A, b_B), and
the stored frontier.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from sakura.eval import bench
from sakura.formats.intq import decode_unit, encode_unit
from sakura.formats import file_id
from sakura.formats.pack import PackInfo, decode_shard
from sakura.offline.builder import load_importance, profile_importance


def _int2_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x with ``rows`` replaced by their INT2 (per-channel min/max over those rows) reconstruction."""
    y = x.clone()
    sub = x[rows]
    y[rows] = decode_unit(encode_unit(sub, 2), sub.shape[0], sub.shape[1], 2).to(x.dtype)
    return y


def importance_report(prepared: bench.TemplateBench, packs: Path, out: Path) -> dict:
    import matplotlib.pyplot as plt

    importance = load_importance(packs, prepared.template.id)
    exact = prepared.fp16_kv
    keys = sorted(exact)
    deciles = {key: torch.argsort(importance[key], descending=True).chunk(10) for key in keys}
    errs = []
    for k in range(10):
        kv = {key: (_int2_rows(exact[key][0], deciles[key][k]), _int2_rows(exact[key][1], deciles[key][k]))
              for key in keys}
        e = 0.0
        for i in range(len(prepared.template.eval_requests)):
            req = prepared.request(i)
            img = prepared.model.masked_edit(req, lambda s, l: kv[(s, l)]).image
            e += float(np.mean((img - prepared.reference(i)) ** 2))
        errs.append(e)
    share = (np.array(errs) / max(sum(errs), 1e-30)).tolist()
    # (b) top-10% overlap, profiling (summed) vs each held-out request
    cache = prepared.fp16_cache()
    overlaps, mass = [], []
    for i, r in enumerate(prepared.template.eval_requests):
        held = profile_importance(prepared.model, prepared.template, cache, requests=[r])
        for key in keys:
            top = max(1, len(importance[key]) // 10)
            a = set(torch.topk(importance[key], top).indices.tolist())
            b = set(torch.topk(held[key], top).indices.tolist())
            overlaps.append(len(a & b) / top)
            s = held[key]
            mass.append(float(torch.topk(s, top).values.sum() / s.sum().clamp(min=1e-30)))
    report = {"template": prepared.template.id, "decile_error_share": share,
              "top10_overlap_mean": float(np.mean(overlaps)),
              "top10_mass_share_mean": float(np.mean(mass))}
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    axes[0].bar(np.arange(1, 11), [100 * s for s in share], color="#d6336c")
    axes[0].set_xlabel("token decile by profiled importance (1 = most attended)")
    axes[0].set_ylabel("share of induced image error (%)")
    axes[0].set_title("INT2 on one decile at a time")
    axes[1].hist(overlaps, bins=20, color="#1c7ed6")
    axes[1].set_xlabel("top-10% overlap, profiling vs held-out request")
    axes[1].set_title(f"mean overlap {report['top10_overlap_mean']:.2f}")
    fig.tight_layout()
    fig.savefig(out / f"fig02_importance_{prepared.template.id}.png", dpi=120)
    plt.close(fig)
    (out / f"fig02_importance_{prepared.template.id}.json").write_text(json.dumps(report, indent=1))
    return report


def tradeoff_report(prepared: bench.TemplateBench, packs: Path, out: Path, shard: int = 0,
                    pairs=((2, 2), (3, 3), (4, 4), (2, 6), (6, 2), (8, 8))) -> dict:
    import matplotlib.pyplot as plt

    raw = (Path(packs) / f"{file_id(prepared.template.id, 'sakura')}.pack").read_bytes()
    info = PackInfo.from_bytes(raw)
    importance = load_importance(packs, prepared.template.id)
    g = info.geometry
    ranks = list(range(g.group, g.rank + 1, g.group))
    units = sorted({(s, layer) for s, layer, _ in info.units(shard)})

    def weighted_error(kv) -> float:
        num = den = 0.0
        for key in units:
            w = importance[key] / importance[key].mean().clamp(min=1e-30)
            for j, x in enumerate(prepared.fp16_kv[key]):
                xh = kv[key][j]
                num += float((w[:, None] * (xh - x) ** 2).sum())
                den += float((w[:, None] * (x - x.mean(0)) ** 2).sum())
        return num / den

    curves = {}
    for ba, bb in pairs:
        pts = []
        for r in ranks:
            if ba > g.planes or bb > g.planes:
                continue
            ranges = info.ranges(shard, r, ba, bb)
            kv = decode_shard(info, shard, r, ba, bb, {rg: raw[rg[0]:rg[0] + rg[1]] for rg in ranges})
            pts.append((info.config_bytes(shard, r, ba, bb), weighted_error(kv), r))
        curves[f"{ba}/{bb}"] = pts
    frontier = [(c.bytes, c.error, c.r, c.b_a, c.b_b) for c in info.frontier(shard)]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for label, pts in curves.items():
        ax.plot([p[0] / 1e3 for p in pts], [p[1] for p in pts], "-o", ms=2, label=f"b_A/b_B = {label}")
    ax.plot([f[0] / 1e3 for f in frontier], [f[1] for f in frontier], "k--", lw=1, label="stored frontier")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes of the shard (kB)")
    ax.set_ylabel("importance-weighted relative error")
    ax.set_title(f"{prepared.template.id}, shard {shard}: rank vs precision")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"fig08_tradeoff_{prepared.template.id}.png", dpi=120)
    plt.close(fig)
    report = {"template": prepared.template.id, "shard": shard, "curves": curves, "frontier": frontier}
    (out / f"fig08_tradeoff_{prepared.template.id}.json").write_text(json.dumps(report, indent=1))
    return report
