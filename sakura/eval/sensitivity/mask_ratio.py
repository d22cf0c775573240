"""Fig. 16: the template's mask scaled about its centre until the token ratio hits 5/10/20/30/40 %."""

from __future__ import annotations

import hashlib
from pathlib import Path

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
from sakura.eval.sensitivity.variants import BASE_TEMPLATE, MASK_RATIOS, model_fingerprint, write_mask_manifest


def fig16_mask_ratio(cfg, out, cache, progress, say, ratios=MASK_RATIOS, template_id: str = BASE_TEMPLATE,
                     catalog_path=None, compute_clock: str = "cpu") -> list[Path]:
    """Fig. 16 analog: p50 / p90 latency, mean PSNR and bytes vs the mask's token ratio."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = write_mask_manifest(out, ratios, template_id, catalog_path)
    catalog = load_catalog(manifest)
    packs = out / "mask-packs"
    fresh_packs(packs, {"weights": model_fingerprint(model_for(catalog.templates[0])),
                        "manifest": hashlib.sha1(manifest.read_bytes()).hexdigest(), "max_rank": cfg.max_rank}, say)
    benches = prepare_variants(catalog, packs, cfg, cache, say, compute_clock)
    own = load_catalog(catalog_path).get(template_id).token_ratio
    reference = min(benches, key=lambda bench: abs(bench.template.token_ratio - own))
    systems = studied_systems(cfg)
    records, scale = run_variants(cfg, benches, reference, systems, progress, "fig 16 mask ratio", compute_clock)
    result = study_result(cfg, template_id, scale, reference, compute_clock, manifest, summaries(records, benches))
    png = out / "fig16_mask_ratio.png"
    plot_mask_ratio(result, systems, png)
    return [png, *write_study(out, "fig16_mask_ratio", result, records), manifest]


def plot_mask_ratio(result: dict, systems, path: Path) -> None:
    vs = sorted(result["variants"].values(), key=lambda v: v["token_ratio"])
    x = [100 * v["token_ratio"] for v in vs]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for s in systems:
        kw = dict(color=COLORS[s], marker="o", ms=4)
        axes[0].plot(x, [v["systems"][s]["latency_p50_s"] for v in vs], label=f"{NAMES[s]} p50", **kw)
        axes[0].plot(x, [v["systems"][s]["latency_p90_s"] for v in vs], ls="--", alpha=0.6, **kw)
        if s in STREAMED:
            axes[1].plot(x, [v["systems"][s]["psnr_mean"] for v in vs], label=NAMES[s], **kw)
            axes[2].plot(x, [v["systems"][s]["bytes_mean"] / 1e6 for v in vs], label=NAMES[s], **kw)
    axes[2].plot(x, [v["fp16_cache_bytes"] / 1e6 for v in vs], color=COLORS["fp16"], ls=":", label="FP16 cache")
    axes[0].set_ylabel("latency (s): p50 solid, p90 dashed")
    axes[1].set_ylabel("mean PSNR vs FP16-cache output (dB)")
    axes[2].set_ylabel("transferred (MB)")
    for ax in axes:
        ax.set_xlabel("mask ratio (% of image tokens)")
        ax.legend(fontsize=7)
    finish_figure(fig, result, "mask-ratio", path)
