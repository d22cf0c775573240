"""Paper-scale projection (a *projection*, not a measurement): the paper's model geometry and phone
timings, with the compression ratios and rank–precision frontiers measured on our model.

FLUX.2-klein-4B: 24 heads × 128 (d = 3072), 5 double + 20 single blocks, 4 steps, 1024 image tokens
at 512². Phone: 13 s full generation, 2.26 s with reuse at a 10% mask (paper §3.1, §6). Each
system's stored levels are our measured ones with bytes scaled to the projected shard size; rebuild
runs on the phone GPU and is taken as hidden (the paper's pipeline); compute per shard is uniform.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sakura.eval.bench import WORKLOADS, BenchConfig, TemplateBench, workload_benches
from sakura.eval.plots import COLORS, NAMES, plt
from sakura.formats import FetchUnit, Level, StreamEncoding
from sakura.kvcache import shard_plan
from sakura.model.geometry import GEOMETRIES
from sakura.net.traces import Trace, load_trace, paper_regime_scale
from sakura.online.policies import get_policy
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.sim import LinkModel, simulate, simulate_masked
from sakura.runtime.timeline import Timeline
from sakura.systems import SYSTEMS


@dataclass(frozen=True)
class PaperSetting:
    name: str
    heads: int
    head_dim: int
    layers: int
    steps: int
    tokens: int
    shard_layers: int
    local_full_s: float
    masked_s_at_10pct: float
    paper_speedup_vs_cachegen: float  # p90 (paper: "1.82× lower latency than CacheGen")
    paper_speedup_vs_local: float  # p50 (paper: 3.27×)


_KLEIN = GEOMETRIES["flux2-klein-4b"]  # the model's dims live in one registry (sakura.model.geometry)
SETTINGS = {_KLEIN.name: PaperSetting(_KLEIN.name, _KLEIN.heads, _KLEIN.head_dim, _KLEIN.num_layers,
                                      _KLEIN.codec.num_steps, _KLEIN.codec.num_tokens, 5, 13.0, 2.26, 1.82, 3.27)}


class ProjectedEncoding(StreamEncoding):
    """Our measured levels for a shard, bytes scaled to the projected shard size. Per-edit side data
    (CacheGen's tables of a level, fetched with its first use) is scaled by ``side_factor`` and priced
    the way the base encoding prices it."""

    def __init__(self, base: StreamEncoding, proj_shards: list, factor: float, side_factor: float):
        self.name = base.name
        self._shards = proj_shards
        nb = len(base.shards)
        self._units = []
        for p in range(len(proj_shards)):
            b = min(nb - 1, p * nb // len(proj_shards))
            for u in (u for u in base.units if u.needed_by == b):
                levels = tuple(Level(lv.label, int(lv.nbytes * factor), lv.error, lv.key) for lv in u.levels)
                self._units.append(FetchUnit(len(self._units), p, f"shard {p} ({u.label})", levels))
        first = base.units[0]
        self._side = {lv.label: int((p.nbytes - lv.nbytes) * side_factor)
                      for lv, p in zip(first.levels, base.fresh().priced(first).levels)}
        self._requested: set[str] = set()

    def fresh(self):
        new = copy.copy(self)
        new._requested = set()
        return new

    @property
    def units(self):
        return self._units

    @property
    def shards(self):
        return self._shards

    def priced(self, unit):
        levels = tuple(lv if lv.label in self._requested else
                       Level(lv.label, lv.nbytes + self._side.get(lv.label, 0), lv.error, lv.key) for lv in unit.levels)
        return FetchUnit(unit.index, unit.needed_by, unit.label, levels)

    def ranges(self, unit, level):
        """One stand-in range of the level's (priced) bytes: the link only needs its length."""
        self._requested.add(level.label)
        return [(0, level.nbytes)]

    def decode(self, unit, level, blobs):
        return {}


def project_paper(cfg: BenchConfig, out: Path, name: str, cache: dict, progress, say) -> list[Path]:
    if name not in SETTINGS:
        raise KeyError(f"unknown projection {name!r}; choose from {', '.join(SETTINGS)}")
    setting = SETTINGS[name]
    base_trace = load_trace(cfg.trace)
    results: dict = {"setting": setting.__dict__, "label": "PROJECTION (not a measurement)", "workloads": {}}
    for workload in [w for w in cfg.workloads if WORKLOADS[w][1] == "sakura-tiny"] or cfg.workloads:
        benches = workload_benches(workload, cfg, cache, say)
        results["workloads"][workload] = _project_workload(setting, cfg, benches, base_trace, progress,
                                                           f"projection {workload}")
    path = out / f"projection_{name}.json"
    path.write_text(json.dumps(results, indent=1))
    png = out / f"projection_{name}.png"
    _plot(results, name, png)
    return [path, png]


def _project_workload(setting: PaperSetting, cfg: BenchConfig, benches: list[TemplateBench], base_trace: Trace,
                      progress, label: str) -> dict:
    """Every system at ``cfg.starts`` offsets of the trace, on the paper's geometry and phone timings."""
    ratio = float(np.mean([bench.template.token_ratio for bench in benches]))
    n = int(round((1 - ratio) * setting.tokens))
    fp16_bytes = 2 * setting.steps * setting.layers * n * setting.heads * setting.head_dim * 2
    masked_s = min(setting.local_full_s, setting.masked_s_at_10pct * ratio / 0.10)
    proj_shards = shard_plan(setting.steps, setting.layers, setting.shard_layers)
    compute = ComputeProfile(proj_shards, [masked_s / len(proj_shards)] * len(proj_shards), 0.0,
                             setting.local_full_s)
    scale = paper_regime_scale(base_trace, fp16_bytes, setting.local_full_s) if cfg.regime == "paper" else 1.0
    trace = base_trace.scaled(scale)
    starts = np.random.default_rng(cfg.seed).uniform(0, base_trace.duration, size=cfg.starts)
    lat: dict[str, list[float]] = {s: [] for s in cfg.systems}
    nbytes: dict[str, list[float]] = {s: [] for s in cfg.systems}
    task = progress.add_task(label, total=len(starts)) if progress else None
    for k, start in enumerate(starts):
        bench = benches[k % len(benches)]
        for system in cfg.systems:
            tl = _projected_timeline(setting, bench, system, compute, fp16_bytes, LinkModel(trace, float(start)))
            lat[system].append(tl.latency_s)
            nbytes[system].append(tl.bytes_total)
        if progress:
            progress.advance(task)
    summ = {s: {"latency_p50_s": float(np.percentile(v, 50)), "latency_p90_s": float(np.percentile(v, 90)),
                "bytes_mean": float(np.mean(nbytes[s]))} for s, v in lat.items()}
    return {"fp16_cache_bytes": fp16_bytes, "masked_s": masked_s, "trace_scale": scale, "token_mask_ratio": ratio,
            "systems": summ, "ratios": _ratios(summ),
            "paper": {"cachegen_over_sakura": setting.paper_speedup_vs_cachegen,
                      "local_over_sakura": setting.paper_speedup_vs_local}}


def _projected_timeline(setting: PaperSetting, bench: TemplateBench, system: str, compute: ComputeProfile,
                        fp16_bytes: int, link: LinkModel) -> Timeline:
    spec = SYSTEMS[system]
    if spec.runs_locally:
        return Timeline(system, "sim", latency_s=compute.local_full_s)
    if spec.holds_cache:
        return simulate_masked(system, compute)
    m = bench.model
    factor = (fp16_bytes / len(compute.shards)) / (bench.fp16_bytes / len(bench.compute.shards))
    side_factor = (setting.layers * setting.heads * setting.head_dim) / (m.num_layers * m.heads * m.head_dim)
    enc = ProjectedEncoding(bench.runtime.encoding(bench.state, spec.format), compute.shards, factor, side_factor)
    tl, _ = simulate(enc, get_policy(system), compute, link, None, rebuild_model=lambda u, lv: 0.0)
    return tl


def _ratios(summ: dict) -> dict:
    ratios = {}
    if "sakura" in summ:
        sk = summ["sakura"]
        if "cachegen" in summ:
            ratios["cachegen_p90_over_sakura"] = summ["cachegen"]["latency_p90_s"] / sk["latency_p90_s"]
        if "local" in summ:
            ratios["local_p50_over_sakura"] = summ["local"]["latency_p50_s"] / sk["latency_p50_s"]
        if "intq" in summ:
            ratios["intq_p90_over_sakura"] = summ["intq"]["latency_p90_s"] / sk["latency_p90_s"]
    return ratios


def _plot(results: dict, name: str, png: Path) -> None:
    workloads = results["workloads"]
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 3.6), squeeze=False)
    for ax, (w, r) in zip(axes[0], workloads.items()):
        systems = list(r["systems"])
        x = np.arange(len(systems))
        ax.bar(x - 0.2, [r["systems"][s]["latency_p50_s"] for s in systems], 0.4, color=[COLORS[s] for s in systems])
        ax.bar(x + 0.2, [r["systems"][s]["latency_p90_s"] for s in systems], 0.4, color=[COLORS[s] for s in systems],
               alpha=0.5, hatch="//")
        ax.set_xticks(x, [NAMES[s] for s in systems], rotation=40, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"PROJECTION {name}: {w}\np50 / p90 latency (s)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
