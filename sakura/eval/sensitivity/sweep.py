"""The sweep both sensitivity studies run: prepare each variant (packs, device compute), run every
system on every variant at the same trace offsets and trace scale, summarise, write the results."""

from __future__ import annotations

import json
import statistics
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch

from sakura.eval.bench import TemplateBench, prepare_template, regime_scale, run_one, summarize
from sakura.eval.plots import plt
from sakura.kvcache import shard_plan
from sakura.net.traces import load_trace
from sakura.runtime.compute import ComputeProfile, shard_times, zero_cache
from sakura.systems import COMPRESSED, SYSTEMS, UNCOMPRESSED

STUDIED = tuple(name for name in SYSTEMS if name != UNCOMPRESSED)  # FP16 is left out: Fig. 12 covers it
STREAMED = COMPRESSED  # the systems whose bytes and quality are plotted


def fresh_packs(packs: Path, stamp: dict, say) -> None:
    """Drop packs built under other weights / masks / ranks (they would silently be reused)."""
    packs.mkdir(parents=True, exist_ok=True)
    path = packs / "stamp.json"
    if path.exists() and json.loads(path.read_text()) == stamp:
        return
    stale = [p for pat in ("*.pack", "*.build.json", "*.importance.safetensors") for p in packs.glob(pat)]
    if stale:
        say(f"{packs}: packs were built for other weights or settings; rebuilding")
    for p in stale:
        p.unlink()
    path.write_text(json.dumps(stamp, indent=1))


@contextmanager
def one_torch_thread():
    """Torch on the calling thread only, so that its CPU clock counts all the work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def measure_compute_cpu(adapter, req, cache, shard_size: int, repeats: int = 3) -> ComputeProfile:
    """Like :func:`sakura.runtime.compute.measure_compute`, on the measuring thread's CPU clock with
    one torch thread: what the edit costs one core, whatever else the machine runs. Shard boundaries
    are where each (step, layer) asks the provider for its K/V, as in the wall-clock version; each
    value is the median over ``repeats`` runs after one warm-up."""
    shards = shard_plan(adapter.num_steps, adapter.num_layers, shard_size)
    inner = cache.provider()
    stamps: list[tuple[int, int, float]] = []

    def provider(step, layer):
        stamps.append((step, layer, time.thread_time()))
        return inner(step, layer)

    with one_torch_thread():
        adapter.masked_edit(req, provider)  # warm-up
        preludes, per_shard = [], []
        for _ in range(repeats):
            stamps.clear()
            t0 = time.thread_time()
            adapter.masked_edit(req, provider)
            pre, times = shard_times(stamps, t0, time.thread_time(), shards)
            preludes.append(pre)
            per_shard.append(times)
        full = []
        for _ in range(max(1, repeats - 1)):
            t0 = time.thread_time()
            adapter.full_edit(req)
            full.append(time.thread_time() - t0)
    return ComputeProfile(shards, [statistics.median(c) for c in zip(*per_shard)], statistics.median(preludes),
                          statistics.median(full))


def run_one_cpu(bench: TemplateBench, req_index: int, system: str, trace, start: float) -> dict:
    """:func:`sakura.eval.bench.run_one` with the rebuild (decode) times on the same CPU clock as the
    compute profile (thread CPU time)."""
    return run_one(bench, req_index, system, trace, start, timer=time.thread_time)


def prepare_variants(catalog, packs: Path, cfg, cache: dict, say, compute_clock: str = "cpu") -> list[TemplateBench]:
    """Every template of the derived catalog, prepared once per process (``cache``)."""
    out = []
    for tpl in catalog:
        key = ("sensitivity", str(packs), tpl.id, compute_clock)
        if key not in cache:
            bench = prepare_template(tpl, packs, cfg.max_rank, say=say, repeats=1 if compute_clock == "cpu" else 3)
            if compute_clock == "cpu":
                say(f"measuring device compute for {tpl.id} on the CPU clock")
                req = bench.request(0)
                first_shard = bench.compute.shards[0]
                # the sessions the sweep runs read the template state's profile
                bench.compute = bench.state.compute = measure_compute_cpu(
                    bench.model, req, zero_cache(bench.model, req), first_shard[2] - first_shard[1])
            cache[key] = bench
        out.append(cache[key])
    return out


def run_variants(cfg, benches: list[TemplateBench], reference: TemplateBench, systems, progress=None,
                 label: str = "sensitivity", compute_clock: str = "cpu") -> tuple[list[dict], float]:
    """Every system on every variant at the same ``cfg.starts`` offsets (same request per offset) and
    the same trace scale. Returns the records and the scale."""
    base = load_trace(cfg.trace)
    scale = regime_scale(reference, base, cfg.regime, cfg.trace_scale)
    trace = base.scaled(scale)
    starts = np.random.default_rng(cfg.seed).uniform(0, base.duration, size=cfg.starts)
    task = progress.add_task(label, total=len(benches) * len(starts)) if progress else None
    one = run_one_cpu if compute_clock == "cpu" else run_one
    records = []
    with one_torch_thread() if compute_clock == "cpu" else nullcontext():
        for bench in benches:
            for k, start in enumerate(starts):
                i = k % len(bench.template.eval_requests)
                for system in systems:
                    r = one(bench, i, system, trace, float(start))
                    r["variant"] = bench.template.id
                    records.append(r)
                if progress:
                    progress.advance(task)
    return records, scale


def summaries(records: list[dict], benches: list[TemplateBench]) -> dict:
    """Per variant: its geometry, cache and storage sizes, compute, and each system's summary."""
    out = {}
    for bench in benches:
        rs = [r for r in records if r["variant"] == bench.template.id]
        storage = {**bench.storage, "fp16": bench.fp16_bytes}
        m = bench.model
        req = bench.request(0)
        masked = int(m.token_mask(req.mask).sum())
        ref = m.reference_tokens(req)
        out[bench.template.id] = {
            "resolution": m.codec.resolution, "image_tokens": m.codec.num_tokens, "masked_tokens": masked,
            "token_ratio": masked / m.codec.num_tokens, "reference_tokens": 0 if ref is None else int(ref.shape[0]),
            "fp16_cache_bytes": bench.fp16_bytes, "storage_bytes": dict(bench.storage),
            "masked_s": bench.compute.masked_s, "local_full_s": bench.compute.local_full_s,
            # device memory is Fig. 12's business (and the CPU-clock replay does not track rebuilt bytes)
            "systems": {system: {k: x for k, x in summ.items() if k != "device_peak_cache_bytes"}
                        for system, summ in summarize(rs, storage).items()},
        }
    return out


def studied_systems(cfg) -> list[str]:
    chosen = [s for s in cfg.systems if s in STUDIED]
    return chosen or list(STUDIED)


def study_result(cfg, template_id: str, scale: float, reference: TemplateBench, compute_clock: str,
                 manifest: Path, variants: dict) -> dict:
    """The figure's JSON: the sweep's settings and every variant's summary."""
    return {"template": template_id, "trace": cfg.trace, "starts": cfg.starts, "regime": cfg.regime,
            "trace_scale": scale, "reference_variant": reference.template.id, "max_rank": cfg.max_rank,
            "compute_clock": compute_clock, "manifest": str(manifest), "variants": variants}


def write_study(out: Path, name: str, result: dict, records: list[dict]) -> list[Path]:
    """``<name>.json`` (the result) and ``<name>_records.jsonl`` (one line per edit)."""
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=1, default=float))
    rec_path = out / f"{name}_records.jsonl"
    rec_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return [path, rec_path]


def finish_figure(fig, result: dict, kind: str, path: Path) -> None:
    """The studies' shared title line, layout and save."""
    fig.suptitle(f"{result['template']}: {kind} sensitivity ({result['trace']}, {result['starts']} offsets, "
                 f"trace scale {result['trace_scale']:.3g})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
