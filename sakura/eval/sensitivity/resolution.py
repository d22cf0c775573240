"""Fig. 18: the embedded Flux2 model at 192², 256², 384² (576 / 1024 / 2304 image tokens), with the
growth factors between resolutions (see :func:`sakura.eval.sensitivity.variants.resolution_variant`)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
from matplotlib.ticker import FuncFormatter

from sakura.catalog import load_catalog
from sakura.editing import model_for
from sakura.eval.plots import COLORS, NAMES, plt
from sakura.eval.sensitivity.sweep import (
    STREAMED,
    finish_figure,
    fresh_packs,
    prepare_variants,
    run_variants,
    studied_systems,
    study_result,
    summaries,
    write_study,
)
from sakura.eval.sensitivity.variants import (
    BASE_TEMPLATE,
    RESOLUTIONS,
    model_fingerprint,
    resolution_model_paths,
    save_resolution_models,
    write_resolution_manifest,
)


def fig18_resolution(cfg, out, cache, progress, say, resolutions=RESOLUTIONS, template_id: str = BASE_TEMPLATE,
                     catalog_path=None, compute_clock: str = "cpu") -> list[Path]:
    """Fig. 18 analog: p50 latency, transferred bytes and PSNR at three resolutions of the embedded
    Flux2 model, with the growth factors between them."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base_tpl = load_catalog(catalog_path).get(template_id)
    base_model = model_for(base_tpl)
    stamp = {"weights": model_fingerprint(base_model), "resolutions": list(resolutions), "max_rank": cfg.max_rank}
    models = resolution_model_paths(out, base_model, base_tpl.model, resolutions)
    stamp_path = out / "resolution-models" / "stamp.json"
    saved = all(Path(m, "sakura.json").is_file() for r, m in models.items() if r != base_model.codec.resolution)
    if not (saved and stamp_path.is_file() and json.loads(stamp_path.read_text()) == stamp):
        say(f"saving resolution variants of {base_tpl.model}: {list(resolutions)}")
        save_resolution_models(out, base_model, base_tpl.model, resolutions)
        stamp_path.parent.mkdir(parents=True, exist_ok=True)
        stamp_path.write_text(json.dumps(stamp, indent=1))
    packs = out / "resolution-packs"
    manifest = write_resolution_manifest(out, models, template_id, catalog_path)
    catalog = load_catalog(manifest)
    fresh_packs(packs, {**stamp, "manifest": hashlib.sha1(manifest.read_bytes()).hexdigest()}, say)
    benches = prepare_variants(catalog, packs, cfg, cache, say, compute_clock)
    native = base_model.codec.resolution
    reference = min(benches, key=lambda bench: abs(bench.model.codec.resolution - native))
    systems = studied_systems(cfg)
    records, scale = run_variants(cfg, benches, reference, systems, progress, "fig 18 resolution", compute_clock)
    variants = summaries(records, benches)
    result = study_result(cfg, template_id, scale, reference, compute_clock, manifest, variants)
    result["growth"] = growth_factors({v["resolution"]: v for v in variants.values()}, systems)
    png = out / "fig18_resolution.png"
    plot_resolution(result, systems, png)
    return [png, *write_study(out, "fig18_resolution", result, records), manifest]


def growth_factors(by_res: dict[int, dict], systems) -> dict:
    """Ratios between resolutions: every pair of consecutive ones, and smallest → largest."""
    rs = sorted(by_res)
    pairs = list(zip(rs, rs[1:])) + ([(rs[0], rs[-1])] if len(rs) > 2 else [])
    out = {}
    for a, b in pairs:
        va, vb = by_res[a], by_res[b]
        g = {"pixels": (b / a) ** 2, "image_tokens": vb["image_tokens"] / va["image_tokens"],
             "fp16_cache_bytes": vb["fp16_cache_bytes"] / va["fp16_cache_bytes"],
             "masked_compute_s": vb["masked_s"] / va["masked_s"],
             "local_full_s": vb["local_full_s"] / va["local_full_s"]}
        for s in systems:
            sa, sb = va["systems"].get(s), vb["systems"].get(s)
            if sa and sb:
                g[s] = {"latency_p50": sb["latency_p50_s"] / sa["latency_p50_s"],
                        "latency_p90": sb["latency_p90_s"] / sa["latency_p90_s"],
                        "bytes": (sb["bytes_mean"] / sa["bytes_mean"]) if sa["bytes_mean"] else None,
                        "psnr_delta_db": sb["psnr_mean"] - sa["psnr_mean"]}
        out[f"{a}->{b}"] = g
    return out



def plot_resolution(result: dict, systems, path: Path) -> None:
    vs = sorted(result["variants"].values(), key=lambda v: v["resolution"])
    x = np.arange(len(vs))
    labels = [f"{v['resolution']}²\n({v['image_tokens']} tok)" for v in vs]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for s in systems:
        kw = dict(color=COLORS[s], marker="o", ms=4, label=NAMES[s])
        axes[0].plot(x, [v["systems"][s]["latency_p50_s"] for v in vs], **kw)
        if s in STREAMED:
            axes[1].plot(x, [v["systems"][s]["bytes_mean"] / 1e6 for v in vs], **kw)
            axes[2].plot(x, [v["systems"][s]["psnr_mean"] for v in vs], **kw)
    axes[1].plot(x, [v["fp16_cache_bytes"] / 1e6 for v in vs], color=COLORS["fp16"], ls=":", label="FP16 cache")
    axes[0].set_ylabel("p50 latency (s)")
    axes[1].set_ylabel("transferred (MB)")
    for ax in axes[:2]:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(  # label 2× and 5× only
            lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v)), 6) in (2, 5) else ""))
    axes[2].set_ylabel("mean PSNR vs FP16-cache output (dB)")
    for ax in axes:
        ax.set_xticks(x, labels, fontsize=8)
        ax.legend(fontsize=7)
    finish_figure(fig, result, "resolution", path)

