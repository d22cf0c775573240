"""`sakura report importance|tradeoff|q-sweep`: the offline observations behind the method.

importance (Fig. 2 analog): (a) share of the induced image error when each decile of reusable tokens,
ranked by profiled importance, is quantised to INT2 while the rest stays exact; (b) overlap of the
top-10% tokens between the profiling requests and each held-out request.
tradeoff (Fig. 8 analog): weighted reconstruction error vs bytes for one shard, per (b_A, b_B) of the
v1 pack, and the stored frontiers of the v1 and v2 packs side by side; storage per stored format.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from sakura.eval import bench
from sakura.formats import FORMATS, file_id
from sakura.formats.intq import decode_unit, encode_unit
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


def _read(packs: Path, template_id: str, fmt: str) -> tuple[bytes, PackInfo] | None:
    path = Path(packs) / f"{file_id(template_id, fmt)}.pack"
    if not path.exists():
        return None
    raw = path.read_bytes()
    return raw, PackInfo.from_bytes(raw)


def tradeoff_report(prepared: bench.TemplateBench, packs: Path, out: Path, shard: int = 0,
                    pairs=((2, 2), (3, 3), (4, 4), (2, 6), (6, 2), (8, 8))) -> dict:
    """Fig. 8 for one shard: the v1 pack's rank × precision grid and stored frontier, and the v2 pack's
    frontier (per-group bits, coded planes), every point's error measured on the decoded shard; plus
    the template's storage per stored format (Fig. 13's numbers) and FP16 / pack ratios."""
    import matplotlib.pyplot as plt

    importance = load_importance(packs, prepared.template.id)
    packs_read = {fmt: got for fmt in ("sakura-v1", "sakura") if (got := _read(packs, prepared.template.id, fmt))}
    v1 = next(((raw, info) for raw, info in packs_read.values() if info.version == 1), None)
    v2 = next(((raw, info) for raw, info in packs_read.values() if info.version == 2), None)
    units = sorted({(s, layer) for s, layer, _ in next(iter(packs_read.values()))[1].units(shard)})

    def weighted_error(raw, info, key) -> float:
        ranges = info.ranges(shard, *key)
        kv = decode_shard(info, shard, *key, {rg: raw[rg[0]:rg[0] + rg[1]] for rg in ranges})
        num = den = 0.0
        for k in units:
            w = importance[k] / importance[k].mean().clamp(min=1e-30)
            for j, x in enumerate(prepared.fp16_kv[k]):
                num += float((w[:, None] * (kv[k][j] - x) ** 2).sum())
                den += float((w[:, None] * (x - x.mean(0)) ** 2).sum())
        return num / den

    curves, frontiers = {}, {}
    if v1:
        g = v1[1].geometry
        for ba, bb in pairs:
            curves[f"{ba}/{bb}"] = [(v1[1].config_bytes(shard, r, ba, bb), weighted_error(*v1, (r, ba, bb)), r)
                                    for r in range(g.group, g.rank + 1, g.group) if max(ba, bb) <= g.planes]
    # every frontier point measured on the decoded shard the same way (a v2 pack stores estimates)
    if v1:
        frontiers["v1"] = [(c.bytes, weighted_error(*v1, c.key), c.r, c.b_a, c.b_b) for c in v1[1].frontier(shard)]
    if v2:
        frontiers["v2"] = [(c.bytes, weighted_error(*v2, c.key), c.r, c.b_a, c.b_b) for c in v2[1].frontier(shard)]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for label, pts in curves.items():
        ax.plot([p[0] / 1e3 for p in pts], [p[1] for p in pts], "-o", ms=2, lw=0.8, label=f"v1 b_A/b_B = {label}")
    for name, style in (("v1", "k--"), ("v2", "r-")):
        if name in frontiers:
            ax.plot([f[0] / 1e3 for f in frontiers[name]], [f[1] for f in frontiers[name]], style, lw=1.4,
                    label="v1 frontier (uniform bits, raw planes)" if name == "v1" else
                    "v2 frontier (per-group bits, coded planes"
                    + (", one token basis per shard)" if v2[1].a_units(shard) == 1 else ")"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes of the shard (kB)")
    ax.set_ylabel("importance-weighted relative error")
    ax.set_title(f"{prepared.template.id}, shard {shard}: rank vs precision, v1 vs v{v2[1].version if v2 else 2} pack",
                 fontsize=9)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / f"fig08_tradeoff_{prepared.template.id}.png", dpi=120)
    plt.close(fig)
    storage = {fmt: (Path(packs) / f"{file_id(prepared.template.id, fmt)}.pack").stat().st_size
               for fmt in FORMATS if (Path(packs) / f"{file_id(prepared.template.id, fmt)}.pack").exists()}
    report = {"template": prepared.template.id, "shard": shard, "curves": curves,
              "frontier": frontiers.get("v2", frontiers.get("v1", [])), "frontiers": frontiers,
              "storage": storage, "fp16_bytes": prepared.fp16_bytes,
              "fp16_over": {fmt: prepared.fp16_bytes / n for fmt, n in storage.items()}}
    (out / f"fig08_tradeoff_{prepared.template.id}.json").write_text(json.dumps(report, indent=1))
    storage_figure(packs, out)
    return report


def storage_figure(packs: Path, out: Path) -> dict:
    """Fig. 13 per template of the pack folder (its ``*.build.json``): MB on disk per stored format,
    the v1 and v2 packs side by side, and FP16 / format. Writes fig13_storage_packs.{png,json}."""
    import matplotlib.pyplot as plt

    rows = {}
    for path in sorted(Path(packs).glob("*.build.json")):
        b = json.loads(path.read_text())
        rows[b["template_id"]] = {"fp16": b["fp16_bytes"], **{k: v for k, v in b["storage"].items() if k != "fp16"}}
    if not rows:
        return {}
    fmts = [f for f in ("fp16", "intq", "cachegen", "sakura-v1", "sakura") if any(f in r for r in rows.values())]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows)), 3.6))
    x = np.arange(len(rows))
    width = 0.8 / len(fmts)
    for j, f in enumerate(fmts):
        ax.bar(x + j * width, [r.get(f, 0) / 1e6 for r in rows.values()], width,
               label={"sakura": "SAKURA v2 pack", "sakura-v1": "SAKURA v1 pack"}.get(f, f))
    ax.set_xticks(x + 0.4 - width / 2, list(rows), rotation=20, fontsize=7)
    ax.set_ylabel("storage per template (MB)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "fig13_storage_packs.png", dpi=120)
    plt.close(fig)
    data = {t: {"bytes": r, "fp16_over": {f: r["fp16"] / v for f, v in r.items() if v}} for t, r in rows.items()}
    (out / "fig13_storage_packs.json").write_text(json.dumps(data, indent=1))
    return data
