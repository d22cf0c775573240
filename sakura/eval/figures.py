"""Each reproduced figure as a function; `sakura bench [--figure N]` dispatches here.

Every figure writes a PNG and a JSON of the numbers behind it into the bench folder.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from sakura.eval import bench
from sakura.eval import plots as P
from sakura.eval.equal_bytes import fig15_bytes_quality
from sakura.eval.estimators import fig_estimators
from sakura.eval.pack_versions import fig_pack_versions
from sakura.eval.projection import project_paper
from sakura.eval.realclock import run_bench_real
from sakura.eval.rebuild_pricing import fig_rebuild_pricing
from sakura.eval.sensitivity import fig16_mask_ratio, fig18_resolution
from sakura.eval.tails import fig_tails
from sakura.formats import FetchUnit, Level, StreamEncoding
from sakura.formats.pack import PackEncoding, PackInfo, decode_shard
from sakura.net.traces import load_trace
from sakura.offline.builder import load_importance
from sakura.offline.compress import pack_cache
from sakura.online.policies import SakuraPolicy
from sakura.quality import quality


def _dump(out: Path, name: str, data) -> Path:
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, default=float))
    return path


# -- encodings for the ablations ---------------------------------------------------------------------
class StepCoarseEncoding(PackEncoding):
    """Fig. 20's coarse granularity: one decision and one transfer per denoising step (all its shards,
    one configuration), needed before the step's first shard. An ablation of the v1 layout (one
    (r, b_A, b_B) for every shard): it streams the ``sakura-v1`` file."""

    name = "sakura-v1"

    def __init__(self, info: PackInfo):
        super().__init__(info)
        by_step: dict[int, list[int]] = {}
        for s, (step, _, _) in enumerate(info.shards):
            by_step.setdefault(step, []).append(s)
        self._groups = list(by_step.values())
        units = []
        for i, shards in enumerate(self._groups):
            common = set.intersection(*[{lv.key for lv in self._units[s].levels} for s in shards])
            levels = []
            for key in sorted(common):
                per = [next(lv for lv in self._units[s].levels if lv.key == key) for s in shards]
                levels.append(
                    Level(per[0].label, sum(lv.nbytes for lv in per), float(np.mean([lv.error for lv in per])), key)
                )
            units.append(FetchUnit(i, shards[0], f"step {i}", tuple(sorted(levels, key=lambda lv: lv.nbytes))))
        self._coarse = units

    @property
    def units(self):
        return self._coarse

    prefixes = StreamEncoding.prefixes  # the paper's per-step transfer: no anytime prefixes

    def ranges(self, unit, level):
        return [r for s in self._groups[unit.index] for r in self.info.ranges(s, *level.key)]

    def decode(self, unit, level, blobs):
        blob_map = dict(zip(self.ranges(unit, level), blobs))
        out = {}
        for s in self._groups[unit.index]:
            out.update(decode_shard(self.info, s, *level.key, blob_map))
        return out


class Fixed8Encoding(PackEncoding):
    """Fig. 21's fixed 8-bit: the same pack, but only (r, 8, 8) prefixes; rank adapts to the budget
    (an ablation of the v1 layout: it streams the ``sakura-v1`` file)."""

    name = "sakura-v1"

    def __init__(self, info: PackInfo):
        super().__init__(info)
        g = info.geometry
        ranks = list(range(g.group, g.rank + 1, g.group)) or [g.rank]
        bits = min(8, g.planes)
        self._units = [
            FetchUnit(
                u.index,
                u.needed_by,
                u.label,
                tuple(
                    Level(
                        f"r{r}/a{bits}/b{bits}", info.config_bytes(u.index, r, bits, bits), -float(r), (r, bits, bits)
                    )
                    for r in ranks
                ),
            )
            for u in self._units
        ]


class _Variant(SakuraPolicy):
    def __init__(self, name: str):
        super().__init__()
        self.name = name


# -- the figures ------------------------------------------------------------------------------------
def fig11_example_trace(cfg, out, cache, progress, say) -> list[Path]:
    """Latency of edits started every 2 s along a 60 s stretch of the trace (vton, as in the paper)."""
    workload = "vton" if "vton" in cfg.workloads else cfg.workloads[0]
    benches = bench.workload_benches(workload, cfg, cache, say)
    prepared = benches[0]
    base = load_trace(cfg.trace)
    trace = base.scaled(bench.regime_scale(prepared, base, cfg.regime, cfg.trace_scale))
    t0 = 60.0
    starts = np.arange(t0, t0 + 60, 2.0)
    task = progress.add_task("fig 11", total=len(starts)) if progress else None
    rows = []
    for i, start in enumerate(starts):
        for system in cfg.systems:
            rows.append(bench.run_one(prepared, i % len(prepared.template.eval_requests), system, trace, float(start)))
        if progress:
            progress.advance(task)
    tt = np.arange(t0, t0 + 70, 0.5)
    P.fig_example_trace(rows, tt, np.asarray(trace.rate_at(tt)), out / "fig11_example_trace.png")
    return [out / "fig11_example_trace.png", _dump(out, "fig11_example_trace", rows)]


def fig17_traces(cfg, out, cache, progress, say) -> list[Path]:
    """p50 / p90 latency under 5G, 4G+5G and WiFi (the same regime scale for all three traces)."""
    import matplotlib.pyplot as plt

    workload = cfg.workloads[0]
    benches = bench.workload_benches(workload, cfg, cache, say)
    base5g = load_trace("5g")
    scales = bench.regime_scales(benches, base5g, cfg)
    results: dict = {}
    for trace_name in ("5g", "4g5g", "wifi"):
        c = replace(cfg, trace=trace_name)

        def run(prepared, i, trace, start, name=trace_name):
            t = load_trace(name).scaled(scales[prepared.template.id])
            return [bench.run_one(prepared, i, s, t, start) for s in cfg.systems]

        rows = bench.sweep(c, workload, benches, run, progress, f"fig 17 {trace_name}")
        results[trace_name] = {s: {"p50": float(np.percentile([r["latency_s"] for r in rows if r["system"] == s], 50)),
                                   "p90": float(np.percentile([r["latency_s"] for r in rows if r["system"] == s], 90))}
                               for s in cfg.systems}
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, (name, res) in zip(axes, results.items()):
        systems = list(res)
        x = np.arange(len(systems))
        ax.bar(x - 0.2, [res[s]["p50"] for s in systems], 0.4, color=[P.COLORS[s] for s in systems])
        ax.bar(
            x + 0.2, [res[s]["p90"] for s in systems], 0.4, color=[P.COLORS[s] for s in systems], alpha=0.5, hatch="//"
        )
        ax.set_xticks(x, [P.NAMES[s] for s in systems], rotation=40, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"{workload} on {name}: p50 / p90 (s)")
    fig.tight_layout()
    fig.savefig(out / "fig17_traces.png", dpi=120)
    plt.close(fig)
    return [out / "fig17_traces.png", _dump(out, "fig17_traces", results)]


def fig20_21_ablations(cfg, out, cache, progress, say) -> list[Path]:
    """Fig. 20: per-shard vs per-step adaptation (deadline misses, stall share). Fig. 21: adaptive
    bits vs fixed 8-bit (p10 PSNR / SSIM: the low tail)."""
    res20, res21 = {}, {}
    for workload in [w for w in cfg.workloads if w != "mb-sd"] or cfg.workloads:
        benches = bench.workload_benches(workload, cfg, cache, say)

        def run(prepared, i, trace, start):
            info = PackInfo.from_bytes(prepared.header("sakura-v1"))  # the ablations are of the v1 layout
            v1 = prepared.runtime.encoding(prepared.state, "sakura-v1")
            return [bench.run_one(prepared, i, "sakura", trace, start, encoding=v1),
                    bench.run_one(prepared, i, "sakura", trace, start, policy=_Variant("sakura-coarse"),
                              encoding=StepCoarseEncoding(info)),
                    bench.run_one(prepared, i, "sakura", trace, start, policy=_Variant("sakura-fixed8"),
                              encoding=Fixed8Encoding(info))]

        rows = bench.sweep(cfg, workload, benches, run, progress, f"fig 20/21 {workload}")
        res20[workload] = {
            s: {
                "miss_rate": float(np.mean([r["deadline_misses"] / r["shards"] for r in rows if r["system"] == s])),
                "stall_share": float(
                    np.sum([r["stall_s"] for r in rows if r["system"] == s])
                    / np.sum([r["latency_s"] for r in rows if r["system"] == s])
                ),
                "p90_s": float(np.percentile([r["latency_s"] for r in rows if r["system"] == s], 90)),
            }
            for s in ("sakura", "sakura-coarse")
        }
        res21[workload] = {s: {"psnr_p10": float(np.percentile([r["psnr"] for r in rows if r["system"] == s], 10)),
                               "ssim_p10": float(np.percentile([r["ssim"] for r in rows if r["system"] == s], 10)),
                               "psnr_mean": float(np.mean([r["psnr"] for r in rows if r["system"] == s]))}
                           for s in ("sakura", "sakura-fixed8")}
    _paired_bars(res20, ("sakura", "sakura-coarse"), [("miss_rate", 100, "shards missing their deadline (%)"),
                                                       ("stall_share", 100, "stall share of latency (%)")],
                 out / "fig20_granularity.png")
    _paired_bars(res21, ("sakura", "sakura-fixed8"), [("psnr_p10", 1, "p10 PSNR (dB)"), ("ssim_p10", 1, "p10 SSIM")],
                 out / "fig21_adaptive_bits.png")
    return [out / "fig20_granularity.png", out / "fig21_adaptive_bits.png", _dump(out, "fig20", res20),
            _dump(out, "fig21", res21)]


def _paired_bars(res: dict, systems: tuple[str, str], panels: list[tuple[str, float, str]], path: Path) -> None:
    """One panel per (metric, factor, label): two systems' bars side by side for each workload."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.4))
    ws = list(res)
    x = np.arange(len(ws))
    for ax, (metric, factor, label) in zip(axes, panels):
        for j, s in enumerate(systems):
            ax.bar(x + 0.4 * j, [factor * res[w][s][metric] for w in ws], 0.4, color=P.COLORS[s], label=P.NAMES[s])
        ax.set_ylabel(label)
        ax.set_xticks(x + 0.2, ws)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig19_q_sweep(cfg, out, cache, progress, say, qs=(0.0, 0.25, 0.5, 1.0), ratios=(5, 15, 50)) -> list[Path]:
    """Importance-weighting strength: PSNR vs the FP16-cache output at 5×, 15×, 50× compression."""
    import matplotlib.pyplot as plt

    workload = cfg.workloads[0]
    benches = bench.workload_benches(workload, cfg, cache, say)
    results = {str(q): {str(r): [] for r in ratios} for q in qs}
    task = progress.add_task("fig 19", total=len(benches) * len(qs)) if progress else None
    qdir = out / "q-sweep-packs"
    qdir.mkdir(parents=True, exist_ok=True)
    for prepared in benches:
        importance = load_importance(cfg.packs, prepared.template.id)
        m = prepared.model
        fp16_cache = prepared.fp16_cache().to(torch.float16)
        shard_size = prepared.compute.shards[0][2] - prepared.compute.shards[0][1]
        for q in qs:
            path = qdir / f"{prepared.template.id}-q{q}.pack"
            info = pack_cache(path, fp16_cache, importance, q=q, max_rank=cfg.max_rank, shard_size=shard_size,
                              model_id=m.model_id, template_id=prepared.template.id)
            raw = path.read_bytes()
            for ratio in ratios:
                kv = {}
                for s in range(info.num_shards):
                    fp16_shard = 2 * 2 * (info.shards[s][2] - info.shards[s][1]) * info.geometry.n * info.geometry.d
                    fits = [c for c in info.frontier(s) if c.bytes <= fp16_shard / ratio]
                    c = min(fits, key=lambda c: c.error) if fits else min(info.frontier(s), key=lambda c: c.bytes)
                    ranges = info.ranges(s, *c.key)
                    kv.update(decode_shard(info, s, *c.key, {r: raw[r[0]:r[0] + r[1]] for r in ranges}))
                for i in range(len(prepared.template.eval_requests)):
                    req = prepared.request(i)
                    img = m.masked_edit(req, lambda s, l: kv[(s, l)]).image
                    results[str(q)][str(ratio)].append(quality(img, prepared.reference(i), req.mask)["psnr"])
            if progress:
                progress.advance(task)
    means = {q: {r: float(np.mean(v)) for r, v in rs.items()} for q, rs in results.items()}
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    x = np.arange(len(ratios))
    for j, q in enumerate(qs):
        ax.bar(x + j * 0.2, [means[str(q)][str(r)] for r in ratios], 0.2, label=f"q = {q}")
    ax.set_xticks(x + 0.3, [f"{r}×" for r in ratios])
    ax.set_ylabel("PSNR vs FP16-cache output (dB)")
    ax.set_title(f"{workload}: importance weighting strength")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "fig19_q_sweep.png", dpi=120)
    plt.close(fig)
    return [out / "fig19_q_sweep.png", _dump(out, "fig19_q_sweep", means)]


# -- dispatch ----------------------------------------------------------------------------------------
FIGURES: dict[str, Callable] = {"11": fig11_example_trace, "15": fig15_bytes_quality, "16": fig16_mask_ratio,
                                "17": fig17_traces, "18": fig18_resolution, "19": fig19_q_sweep,
                                "20": fig20_21_ablations, "21": fig20_21_ablations}
MAIN = {"12", "13", "table2"}  # drawn from the bench's summary; Fig. 15 is its own static sweep


def run(cfg: bench.BenchConfig, out: Path, *, figure: str | None = None, project: str | None = None,
        clock: str = "sim", progress=None, say=print, example_trace: bool = True) -> list[Path]:
    """The sweep and its plots (``figure`` None), or one figure. ``example_trace=False`` (``--quick``) skips
    Fig. 11, which the plain sweep draws after it (it was 12 of `--quick`'s 25 minutes under load)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cache: dict = {}
    if project:
        return project_paper(cfg, out, project, cache, progress, say)
    if clock == "real":
        summary = run_bench_real(cfg, out, progress=progress, say=say)
        return P.write_all(summary, out) + [out / "summary.json"]
    if figure is None or figure in MAIN:
        if figure and (out / "summary.json").exists():
            summary = json.loads((out / "summary.json").read_text())
        else:
            summary = bench.run_bench(cfg, out, progress=progress, say=say, benches=cache)
        written = P.write_all(summary, out) + [out / "summary.json"]
        if figure is None and example_trace:
            written += fig11_example_trace(cfg, out, cache, progress, say)
        return written
    if figure == "all":  # one process, so every figure shares the prepared templates
        written = P.write_all(bench.run_bench(cfg, out, progress=progress, say=say, benches=cache), out)
        written += project_paper(cfg, out, "flux2-klein-4b", cache, progress, say)
        for fn in (fig15_bytes_quality, fig20_21_ablations, fig19_q_sweep, fig11_example_trace, fig17_traces):
            written += fn(cfg, out, cache, progress, say)
        return written  # figures 16 and 18 build packs of their own: run them with --figure 16 / 18
    if figure == "packs":  # issue #18's v2 vs v1 pack on the trace
        return fig_pack_versions(cfg, out, cache, progress, say)
    if figure == "estimators":
        return fig_estimators(cfg, out, cache, progress, say)
    if figure == "rebuild-pricing":
        return fig_rebuild_pricing(cfg, out, cache, progress, say)
    if figure == "tails":
        return fig_tails(cfg, out, cache, progress, say)
    if figure == "regret":  # the sweep with the clairvoyant planner beside every streamed edit
        from sakura.eval.regret_figure import regret_cdfs  # (the planner's figure: only when asked for)

        cfg.regret = True
        summary = bench.run_bench(cfg, out, progress=progress, say=say, benches=cache)
        return P.write_all(summary, out) + [out / "summary.json", regret_cdfs(out / "records.jsonl", out, cfg.trace)]
    if figure not in FIGURES:
        raise KeyError(f"unknown figure {figure!r}; choose from {', '.join(sorted(MAIN | set(FIGURES)))}")
    return FIGURES[figure](cfg, out, cache, progress, say)
