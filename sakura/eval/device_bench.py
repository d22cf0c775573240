"""``sakura bench-device``: per shard, rebuild (torch vs OpenCL) against execute (eager vs ExecuTorch).

For one catalog template: capture its cache, write a real progressive pack — v1 (``layout="uniform"``, the
default) or v2 as the builder writes it (``layout="allocated"``, ``basis`` shard / unit:
:func:`sakura.offline.builder.pack_options`) — or use a built one. A v2 pack's configs are its levels at
the v1 config's bytes (``PackInfo.level_for``); the report's ``levels`` say which level (chunks, rank,
mean planes, bytes) each config read on each shard. Then per shard measure

* bytes of each configuration and the receive time at ``--mbps``;
* rebuild time of each reconstructor (median of ``repeats``) for each configuration;
* execute time of each executor (median over ``repeats`` full masked runs, after a warm-up);
* the rebuild / execute ratio (target ≤ 10 %) and the share of rebuild hidden behind execution
  when rebuilding shard p+1 overlaps executing shard p (the paper's GPU ∥ NPU pipeline), both as
  computed from the per-shard times and as *measured* with a rebuild thread beside the executor;
* the decoded rank at which rebuild would reach the budget (``rank_at_budget``: a line fitted to the
  configs' rebuild times against their levels' ranks) — what ``sakura build --rebuild-rank`` caps a
  pack at so that every level stays within it on this device;
* how far the ExecuTorch image is from the eager one.

JSON report (tables and command: ``device_bench_cli``; the pack: ``device_bench_pack``; rows, summary and
the rank at the budget: ``device_bench_report``). Numbers are this host's (CPU-only; "GPU" and "NPU"
share its cores): pipelined runs bound separate engines from below.

The model is the template's own, a model folder (``--model``), or a seeded random-weight model of a
named geometry built in memory (``--geometry flux2-klein-4b --geometry-layers 1,3``,
:mod:`sakura.model.geometry`): a real model's block dimensions and token count with fewer blocks, for
times at its size only. The report's ``geometry`` block records d, heads, layers and token counts.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from sakura.catalog import load_catalog
from sakura.cli.errors import UserError
from sakura.eval.device_bench_pack import open_pack
from sakura.eval.device_bench_report import config_key, level_rows, shard_rows, summarise

DEFAULT_CONFIGS = ("R,8,8", "64,4,4", "32,3,2")
LAYOUTS = ("uniform", "allocated")  # the pack bench-device builds: v1, or v2 as `sakura build` writes it
BENCH_BASES = ("shard", "unit")  # v2's token basis: one per shard (shared by its K/V units) or one per unit


def parse_configs(specs: Sequence[str], rank: int, group: int) -> list[tuple[int, int, int]]:
    """``"r,b_a,b_b"`` strings (``R`` = the stored rank) → valid configurations, clipped to the rank."""
    out = []
    for spec in specs:
        parts = [p.strip() for p in str(spec).split(",")]
        if len(parts) != 3:
            raise ValueError(f"configuration {spec!r}: expected r,b_a,b_b")
        r = rank if parts[0].upper() == "R" else min(int(parts[0]), rank)
        if r != rank:
            r -= r % group
        cfg = (r, int(parts[1]), int(parts[2]))
        if cfg not in out:
            out.append(cfg)
    return out


def _median_ms(xs: Sequence[float]) -> float:
    return 1e3 * statistics.median(xs)


def _pipelined(run_factory, plan, rebuild_fn, layer_ranges) -> tuple[float, float]:
    """Wall time of one masked run with a rebuild thread one shard ahead (bounded: 2 shards), and the
    time the executor waited for K/V. Returns (seconds, stall seconds)."""
    run = run_factory()
    ready: dict[int, dict] = {}
    cond = threading.Condition()
    errors: list[BaseException] = []

    def producer():
        try:
            for p in range(len(plan)):
                with cond:
                    cond.wait_for(lambda: len(ready) < 2)
                kv = rebuild_fn(p)
                with cond:
                    ready[p] = kv
                    cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors.append(e)
            with cond:
                cond.notify_all()

    t0 = time.perf_counter()
    stall = 0.0
    th = threading.Thread(target=producer, daemon=True)
    th.start()
    p = 0
    for step in range(run.num_steps):
        run.begin_step(step)
        for l0, l1 in layer_ranges:
            w0 = time.perf_counter()
            with cond:
                cond.wait_for(lambda: p in ready or errors)
                if errors:
                    raise errors[0]
                kv = ready.pop(p)
                cond.notify_all()
            stall += time.perf_counter() - w0
            run.run_shard(step, l0, l1, kv)
            p += 1
        run.end_step(step)
    run.result()
    th.join()
    return time.perf_counter() - t0, stall


def bench_device(template_id: str, *, catalog: str | Path | None = None, shard_size: int = 2, max_rank: int = 128,
                 configs: Sequence[str] = DEFAULT_CONFIGS, executors: Sequence[str] = ("eager", "executorch"),
                 reconstructors: Sequence[str] = ("torch", "opencl"), repeats: int = 3, mbps: float = 50.0,
                 pack: str | Path | None = None, importance: bool = False, model_path: str | Path | None = None,
                 random_cache: bool = False, geometry=None, geometry_layers: tuple[int, int] | str | None = None,
                 threads: int | None = None, layout: str = "uniform", basis: str = "shard",
                 rebuild_rank: int | None = None, log: Callable[[str], None] = print) -> dict:
    """Run the benchmark and return its report (see module doc).

    ``model_path``: a model folder instead of the template's model. ``geometry``: a name of
    :data:`sakura.model.geometry.GEOMETRIES` (or a ``Flux2Geometry``): time a seeded random-weight model of that
    geometry with ``geometry_layers = (double, single)`` blocks, built in memory (times only; use with
    ``random_cache``). ``threads``: torch intra-op threads for the run (None: leave torch's setting).
    ``layout`` / ``basis``: the pack built when ``pack`` is not given: ``uniform`` = v1 of rank ``max_rank``;
    ``allocated`` = v2 with the builder's options for top quality ``(max_rank, 8, 8)`` (``pack_options``; a
    shared basis factorises to 4 × ``max_rank``), its per-shard frontier kept (``level_for`` reads it);
    ``rebuild_rank`` caps its decoded rank as ``sakura build --rebuild-rank`` does."""
    import torch

    from sakura.editing import edit_request, model_for  # torch: sakura --help stays light
    from sakura.model import ModelLoadError  # torch: sakura --help stays light
    from sakura.model.geometry import geometry_model, geometry_record, get_geometry  # torch: sakura --help stays light
    from sakura.runtime.calibration import machine_fingerprint  # torch: sakura --help stays light

    if geometry is not None and model_path:
        raise ModelLoadError("give a model folder or a geometry, not both")
    if geometry is None and geometry_layers is not None:
        raise ModelLoadError("geometry layers need a geometry")
    if layout not in LAYOUTS:
        raise UserError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if basis not in BENCH_BASES:
        raise UserError(f"basis must be one of {', '.join(BENCH_BASES)}, got {basis!r}")
    if pack and ((layout, basis) != ("uniform", "shard") or rebuild_rank is not None):
        raise UserError("--layout / --basis / --rebuild-rank choose the pack bench-device builds: not with --pack")
    tpl = load_catalog(catalog).get(template_id)
    geo_spec = get_geometry(geometry) if geometry is not None else None
    if geo_spec is not None:
        t0 = time.perf_counter()
        model = geometry_model(geo_spec, geometry_layers)
        log(f"built {model.model_id} (geometry of {geo_spec.title}, random weights) "
            f"in {time.perf_counter() - t0:.1f} s")
    else:
        model = model_for(tpl, model_path)
    req_template = tpl.eval_requests[0] if tpl.eval_requests else None
    req = edit_request(tpl, req_template, resolution=model.codec.resolution, ref_size=model.codec.ref_size)
    report: dict = {"template": tpl.id, "model": model.model_id, "shard_size": shard_size, "repeats": repeats,
                    "mbps": mbps, "torch_threads": threads or torch.get_num_threads(),
                    "geometry": {**geometry_record(model, geo_spec), **_token_counts(model, req)}}
    if geo_spec is not None:
        report["note"] = f"geometry of {geo_spec.title}, random weights: times only"
    with _threads(threads, "executorch" in executors) as et_threads, \
            tempfile.TemporaryDirectory(prefix="sakura-bench-device-") as tmp:
        report["host"] = {**machine_fingerprint(), "executorch_threads": et_threads,
                          "load_avg_at_start": list(os.getloadavg())}
        reader, report["pack"] = open_pack(pack, tpl, model, req, Path(tmp), max_rank=max_rank,
                                            shard_size=shard_size, importance=importance, random_cache=random_cache,
                                            layout=layout, basis=basis, rebuild_rank=rebuild_rank)
        info = reader.info
        geo = info.geometry
        if geo.shard_size != shard_size:
            log(f"pack has shard size {geo.shard_size}; using it")
            shard_size = report["shard_size"] = geo.shard_size
        cfgs = parse_configs(configs, geo.rank, geo.group)
        report["pack"].update({"bytes": info.file_size, "rank": geo.rank, "n": geo.n, "d": geo.d,
                               "shards": info.num_shards, "version": info.version,
                               "shared_basis": bool(geo.shared_basis),
                               "shared_shards": sum(getattr(info, "a_units", lambda s: 2)(s) == 1
                                                    for s in range(info.num_shards))})
        report["configs"] = [list(c) for c in cfgs]
        key = {(s, c): info.level_for(s, *c) for s in range(info.num_shards) for c in cfgs}
        blobs = {(s, c): reader.read(s, *key[(s, c)]) for s in range(info.num_shards) for c in cfgs}
        report["levels"] = level_rows(info, cfgs, key, blobs)
        for k, lv in report["levels"].items():
            log(f"config {k}: level rank {lv['rank_mean']:.0f} ({lv['rank_min']}–{lv['rank_max']}), "
                f"{lv['kib_mean']:.0f} KiB per shard")
        rebuild = measure_rebuild(reconstructors, info, cfgs, key, blobs, repeats, log)
        report["reconstructors"] = rebuild.devices

        # reference K/V: the torch decode of the main configuration (the middle one listed)
        main = cfgs[min(1, len(cfgs) - 1)]
        report["main_config"] = list(main)
        ref_rec = rebuild.recs.get("torch") or next(iter(rebuild.recs.values()))
        kv_all: dict = {}
        for s in range(info.num_shards):
            kv_all.update(ref_rec.rebuild(info, s, *key[(s, main)], blobs[(s, main)]))
        execute = measure_execute(executors, model, req, shard_size, lambda step, layer: kv_all[(step, layer)],
                                   repeats, log)
        report["executors"] = execute.info
        if "eager" in execute.images and "executorch" in execute.images:
            diff = execute.images["executorch"] - execute.images["eager"]
            report["image_max_abs_executorch_vs_eager"] = float(abs(diff).max())
        report["shards"] = shard_rows(info, cfgs, blobs, mbps, rebuild.ms, execute.ms)
        ranks = {k: lv["rank_mean"] for k, lv in report["levels"].items()}
        summary = summarise(rebuild, execute, config_key(main), ranks)
        # measured: a rebuild thread beside the executor on this host's shared cores
        for rn, rec in rebuild.recs.items():
            for en, (ex, ranges) in execute.runs.items():
                rebuild_fn = lambda p, rec=rec: rec.rebuild(info, p, *key[(p, main)], blobs[(p, main)])  # noqa: E731
                wall, stall = min((_pipelined(lambda ex=ex: ex.prepare(req, shard_size), info.shards, rebuild_fn,
                                              ranges) for _ in range(max(1, repeats - 1))), key=lambda x: x[0])
                serial = sum(execute.ms[en]) / 1e3 + sum(rebuild.ms[rn][config_key(main)]) / 1e3
                summary["pipelined"][f"{rn}/{en}"] = {"wall_ms": 1e3 * wall, "stall_ms": 1e3 * stall,
                                                      "serial_ms": 1e3 * serial}
        report["summary"] = summary
        report["host"]["load_avg_at_end"] = list(os.getloadavg())
        return report


@contextmanager
def _threads(n: int | None, executorch: bool):
    """torch's intra-op threads (and ExecuTorch's thread pool, when it runs) set to ``n`` for the block
    (None: unchanged), then put back. Yields ExecuTorch's pool size (None when it does not run)."""
    import torch

    pool = None
    if executorch:
        try:
            from executorch.extension.pybindings import portable_lib as pool
        except ImportError:  # the executor reports the backend unavailable
            pool = None
    before = torch.get_num_threads(), pool._threadpool_get_thread_count() if pool else None
    if n:
        torch.set_num_threads(n)
        if pool:
            pool._unsafe_reset_threadpool(n)  # no program is running yet
    try:
        yield pool._threadpool_get_thread_count() if pool else None
    finally:
        torch.set_num_threads(before[0])
        if pool and n:
            pool._unsafe_reset_threadpool(before[1])


@dataclass
class _Rebuilds:
    recs: dict = field(default_factory=dict)  # name -> reconstructor
    ms: dict = field(default_factory=dict)  # name -> config key -> per-shard median ms
    min_ms: dict = field(default_factory=dict)  # name -> config key -> per-shard best ms
    devices: dict = field(default_factory=dict)  # name -> device, or why it is unavailable


def measure_rebuild(names: Sequence[str], info, cfgs, key, blobs, repeats: int, log) -> _Rebuilds:
    import torch

    from sakura.runtime.executors import BackendUnavailable  # torch: sakura --help stays light
    from sakura.runtime.reconstruct import get_reconstructor  # torch: sakura --help stays light

    out = _Rebuilds()
    for name in names:
        try:
            rec = get_reconstructor(name)
        except BackendUnavailable as e:
            out.devices[name] = f"unavailable: {e}"
            log(f"reconstructor {name}: unavailable ({e})")
            continue
        out.recs[name] = rec
        dev = getattr(rec, "device_name", f"cpu (numpy + torch, {torch.get_num_threads()} threads)")
        units = getattr(getattr(rec, "device", None), "max_compute_units", None)  # OpenCL: its own thread pool
        out.devices[name] = f"{dev}, {units} compute units" if units else dev
        for c in cfgs:  # warm-up: kernel builds, first allocations
            rec.rebuild(info, 0, *key[(0, c)], blobs[(0, c)])
        out.ms[name], out.min_ms[name] = {}, {}
        for c in cfgs:
            runs = [[_timed(lambda: rec.rebuild(info, s, *key[(s, c)], blobs[(s, c)])) for _ in range(repeats)]
                    for s in range(info.num_shards)]
            out.ms[name][config_key(c)] = [_median_ms(x) for x in runs]
            out.min_ms[name][config_key(c)] = [1e3 * min(x) for x in runs]
        log(f"rebuild {name}: " + ", ".join(f"{k} {statistics.mean(v):.2f} ms" for k, v in out.ms[name].items()))
    return out


@dataclass
class _Executions:
    ms: dict = field(default_factory=dict)  # name -> per-shard median ms
    min_ms: dict = field(default_factory=dict)  # name -> per-shard best ms
    images: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # name -> report entry
    runs: dict = field(default_factory=dict)  # name -> (executor, layer ranges)


def measure_execute(names: Sequence[str], model, req, shard_size: int, provider, repeats: int,
                     log, make: Callable[[str], object] | None = None) -> _Executions:
    """``make(name)``: the executor to time (default: ``get_executor(name, model)``; the bench passes the
    device's own, whose programs are already exported)."""
    from sakura.runtime.executors import BackendUnavailable, get_executor  # torch: sakura --help stays light

    out = _Executions()
    for name in names:
        try:
            ex = make(name) if make else get_executor(name, model, **({"log": log} if name == "executorch" else {}))
            t0 = time.perf_counter()
            run = ex.prepare(req, shard_size)
        except BackendUnavailable as e:
            out.info[name] = {"unavailable": str(e)}
            log(f"executor {name}: unavailable ({e})")
            continue
        out.info[name] = {"prepare_s": round(time.perf_counter() - t0, 2)}
        if name == "executorch":
            out.info[name]["export"] = [{k: m.get(k) for k in ("layers", "export_s", "lower_s", "bytes",
                                                               "delegates", "max_abs_vs_eager", "cached")}
                                        for m in ex.exports]
        out.images[name] = run.run(provider)  # warm-up
        per = []
        for _ in range(repeats):
            run = ex.prepare(req, shard_size)
            out.images[name] = run.run(provider)
            per.append([t for *_, t in run.timings.shards])
        out.ms[name] = [_median_ms(col) for col in zip(*per)]
        out.min_ms[name] = [1e3 * min(col) for col in zip(*per)]
        out.info[name]["step_overhead_ms"] = round(1e3 * statistics.mean(
            [t for _, t in run.timings.begin] + [t for _, t in run.timings.end]), 3)
        out.runs[name] = (ex, run.layer_ranges)
        log(f"execute {name}: {statistics.mean(out.ms[name]):.2f} ms per shard")
    return out


def _token_counts(model, req) -> dict:
    """Tokens of the request: masked image tokens (computed), reused ones (cached), reference and text
    tokens (computed with the masked ones in every block)."""
    masked = int(model.token_mask(req.mask).sum())
    ref = model.reference_tokens(req)
    text_cfg = getattr(model.text_encoder, "cfg", None)
    return {"masked_tokens": masked, "reused_tokens": model.codec.num_tokens - masked,
            "reference_tokens": 0 if ref is None else int(ref.shape[0]),
            "text_tokens": getattr(text_cfg, "max_tokens", None)}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
