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
* how far the ExecuTorch image is from the eager one.
JSON + a rich table. Numbers are this host's (CPU-only; "GPU" and "NPU" share its cores): the
pipelined measurement is a lower bound on what separate engines give.

The model is the template's own, a model folder (``--model``), or a seeded random-weight model of a
named geometry built in memory (``--geometry flux2-klein-4b --geometry-layers 1,3``,
:mod:`sakura.model.geometry`): a real model's block dimensions and token count with fewer blocks, for
times at its size only. The report's ``geometry`` block records d, heads, layers and token counts.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

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


def _key(cfg: tuple[int, int, int]) -> str:  # a v2 pack reads each config's level at its bytes: level_for
    return "r{}-a{}-b{}".format(*cfg)


def _hidden_share(rebuild: Sequence[float], execute: Sequence[float]) -> float:
    """Share of total rebuild time overlapped by execution when rebuild of shard p+1 runs during
    execution of shard p (shard 0's rebuild is the pipeline's start-up and is never hidden)."""
    total = sum(rebuild)
    if total <= 0:
        return 1.0
    hidden = sum(min(rebuild[p + 1], execute[p]) for p in range(len(rebuild) - 1))
    return hidden / total


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
                 log: Callable[[str], None] = print) -> dict:
    """Run the benchmark and return its report (see module doc).

    ``model_path``: a model folder instead of the template's model. ``geometry``: a name of
    :data:`sakura.model.geometry.GEOMETRIES` (or a ``Flux2Geometry``): time a seeded random-weight model of that
    geometry with ``geometry_layers = (double, single)`` blocks, built in memory (times only; use with
    ``random_cache``). ``threads``: torch intra-op threads for the run (None: leave torch's setting).
    ``layout`` / ``basis``: the pack built when ``pack`` is not given: ``uniform`` = v1 of rank ``max_rank``;
    ``allocated`` = v2 with the builder's options for top quality ``(max_rank, 8, 8)`` (``pack_options``; a
    shared basis factorises to 4 × ``max_rank``), its per-shard frontier kept (``level_for`` reads it)."""
    import torch

    from sakura.catalog import load_catalog
    from sakura.cli_errors import UserError
    from sakura.editing import edit_request, model_for
    from sakura.model import ModelLoadError
    from sakura.model.geometry import geometry_model, geometry_record, get_geometry
    from sakura.runtime.calibration import machine_fingerprint

    if geometry is not None and model_path:
        raise ModelLoadError("give a model folder or a geometry, not both")
    if geometry is None and geometry_layers is not None:
        raise ModelLoadError("geometry layers need a geometry")
    if layout not in LAYOUTS:
        raise UserError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if basis not in BENCH_BASES:
        raise UserError(f"basis must be one of {', '.join(BENCH_BASES)}, got {basis!r}")
    if pack and (layout, basis) != ("uniform", "shard"):
        raise UserError("--layout / --basis choose the pack bench-device builds: not with --pack")
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
        reader, report["pack"] = _open_pack(pack, tpl, model, req, Path(tmp), max_rank=max_rank,
                                            shard_size=shard_size, importance=importance, random_cache=random_cache,
                                            layout=layout, basis=basis)
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
        report["levels"] = _levels(info, cfgs, key, blobs)
        for k, lv in report["levels"].items():
            log(f"config {k}: level rank {lv['rank_mean']:.0f} ({lv['rank_min']}–{lv['rank_max']}), "
                f"{lv['kib_mean']:.0f} KiB per shard")
        rebuild = _measure_rebuild(reconstructors, info, cfgs, key, blobs, repeats, log)
        report["reconstructors"] = rebuild.devices

        # reference K/V: the torch decode of the main configuration (the middle one listed)
        main = cfgs[min(1, len(cfgs) - 1)]
        report["main_config"] = list(main)
        ref_rec = rebuild.recs.get("torch") or next(iter(rebuild.recs.values()))
        kv_all: dict = {}
        for s in range(info.num_shards):
            kv_all.update(ref_rec.rebuild(info, s, *key[(s, main)], blobs[(s, main)]))
        execute = _measure_execute(executors, model, req, shard_size, lambda step, layer: kv_all[(step, layer)],
                                   repeats, log)
        report["executors"] = execute.info
        if "eager" in execute.images and "executorch" in execute.images:
            diff = execute.images["executorch"] - execute.images["eager"]
            report["image_max_abs_executorch_vs_eager"] = float(abs(diff).max())
        report["shards"] = _shard_rows(info, cfgs, blobs, mbps, rebuild.ms, execute.ms)
        summary = _summary(rebuild, execute, _key(main))
        # measured: a rebuild thread beside the executor on this host's shared cores
        for rn, rec in rebuild.recs.items():
            for en, (ex, ranges) in execute.runs.items():
                rebuild_fn = lambda p, rec=rec: rec.rebuild(info, p, *key[(p, main)], blobs[(p, main)])  # noqa: E731
                wall, stall = min((_pipelined(lambda ex=ex: ex.prepare(req, shard_size), info.shards, rebuild_fn,
                                              ranges) for _ in range(max(1, repeats - 1))), key=lambda x: x[0])
                serial = sum(execute.ms[en]) / 1e3 + sum(rebuild.ms[rn][_key(main)]) / 1e3
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


def _open_pack(pack: str | Path | None, tpl, model, req, tmp: Path, *, max_rank: int, shard_size: int,
               importance: bool, random_cache: bool, layout: str = "uniform", basis: str = "shard"):
    """A reader of the given pack, or of a real pack built into ``tmp`` now (v1, or v2 with the builder's
    ``pack_options``); and its report entry."""
    import torch

    from sakura.formats.pack import PackReader

    if pack:
        return PackReader(pack), {"path": str(pack), "built": False}
    from sakura.offline.builder import capture_request, pack_options, profile_importance
    from sakura.offline.compress import pack_cache

    t0 = time.perf_counter()
    if random_cache:  # times do not depend on the values: skip the capture run
        cache, imp = _random_cache(model, req), None
    else:
        cache = model.capture(capture_request(tpl, model)).to(torch.float16)
        imp = profile_importance(model, tpl, cache) if importance else None
    path = tmp / f"{tpl.id}.pack"
    options = pack_options(max_rank, layout, basis)
    # v1: no frontier (every config is its own level); v2: its frontier is what level_for reads
    pack_cache(path, cache, imp, shard_size=shard_size, model_id=model.model_id, template_id=tpl.id,
               **options, **({"tradeoff": False} if layout == "uniform" else {}))
    return PackReader(path), {"built": True, "build_s": round(time.perf_counter() - t0, 2),
                              "importance": bool(imp), "random_cache": random_cache, "layout": layout,
                              **({"basis": basis} if layout == "allocated" else {}), "options": options}


def _levels(info, cfgs, key, blobs) -> dict:
    """Per config: the level read on each shard (v2: its chunk count ``k``, the rank it decodes to, mean
    planes of A and B per component, bytes; v1: the config itself) and the means over shards."""
    out = {}
    for c in cfgs:
        rows = []
        for s in range(info.num_shards):
            nbytes = sum(map(len, blobs[(s, c)].values()))
            lv = next((f for f in info.frontier(s) if f.key == key[(s, c)]), None) if info.version >= 2 else None
            row = {"key": list(key[(s, c)]), "bytes": nbytes}
            row.update({"r": lv.r, "b_a": lv.b_a, "b_b": lv.b_b} if lv is not None else
                       {"r": c[0], "b_a": c[1], "b_b": c[2]} if info.version < 2 else {"r": None})
            rows.append(row)
        ranks = [r["r"] for r in rows if r["r"] is not None]
        out[_key(c)] = {"shards": rows, "kib_mean": statistics.mean(r["bytes"] for r in rows) / 1024,
                        "rank_mean": statistics.mean(ranks) if ranks else float("nan"),
                        "rank_min": min(ranks, default=None), "rank_max": max(ranks, default=None)}
    return out


@dataclass
class _Rebuilds:
    recs: dict = field(default_factory=dict)  # name -> reconstructor
    ms: dict = field(default_factory=dict)  # name -> config key -> per-shard median ms
    min_ms: dict = field(default_factory=dict)  # name -> config key -> per-shard best ms
    devices: dict = field(default_factory=dict)  # name -> device, or why it is unavailable


def _measure_rebuild(names: Sequence[str], info, cfgs, key, blobs, repeats: int, log) -> _Rebuilds:
    import torch

    from sakura.runtime.executors import BackendUnavailable
    from sakura.runtime.reconstruct import get_reconstructor

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
            out.ms[name][_key(c)] = [_median_ms(x) for x in runs]
            out.min_ms[name][_key(c)] = [1e3 * min(x) for x in runs]
        log(f"rebuild {name}: " + ", ".join(f"{k} {statistics.mean(v):.2f} ms" for k, v in out.ms[name].items()))
    return out


@dataclass
class _Executions:
    ms: dict = field(default_factory=dict)  # name -> per-shard median ms
    min_ms: dict = field(default_factory=dict)  # name -> per-shard best ms
    images: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # name -> report entry
    runs: dict = field(default_factory=dict)  # name -> (executor, layer ranges)


def _measure_execute(names: Sequence[str], model, req, shard_size: int, provider, repeats: int,
                     log) -> _Executions:
    from sakura.runtime.executors import BackendUnavailable, get_executor

    out = _Executions()
    for name in names:
        try:
            ex = get_executor(name, model, **({"log": log} if name == "executorch" else {}))
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


def _shard_rows(info, cfgs, blobs, mbps: float, rebuild_ms: dict, execute_ms: dict) -> list[dict]:
    return [{"shard": s, "step": step, "layers": [l0, l1],
             "bytes": {_key(c): sum(map(len, blobs[(s, c)].values())) for c in cfgs},
             "receive_ms": {_key(c): 8e3 * sum(map(len, blobs[(s, c)].values())) / (mbps * 1e6) for c in cfgs},
             "rebuild_ms": {n: {k: v[s] for k, v in per.items()} for n, per in rebuild_ms.items()},
             "execute_ms": {n: v[s] for n, v in execute_ms.items()}}
            for s, (step, l0, l1) in enumerate(info.shards)]


def _summary(rebuild: _Rebuilds, execute: _Executions, main_key: str) -> dict:
    """Means, rebuild / execute ratios and hidden shares (``pipelined`` is filled by the caller)."""
    summary: dict = {"rebuild_ms_mean": {n: {k: statistics.mean(v) for k, v in per.items()}
                                         for n, per in rebuild.ms.items()},
                     "execute_ms_mean": {n: statistics.mean(v) for n, v in execute.ms.items()},
                     "rebuild_over_execute": {}, "rebuild_over_execute_by_config": {}, "hidden_share": {},
                     "pipelined": {},
                     # best-of-repeats per shard, averaged: an estimate of the uncontended times
                     "rebuild_ms_min_mean": {n: {k: statistics.mean(v) for k, v in per.items()}
                                             for n, per in rebuild.min_ms.items()},
                     "execute_ms_min_mean": {n: statistics.mean(v) for n, v in execute.min_ms.items()}}
    for rn, per in rebuild.ms.items():
        for en, ev in execute.ms.items():
            rb = per[main_key]
            summary["rebuild_over_execute"][f"{rn}/{en}"] = sum(rb) / sum(ev)
            summary["rebuild_over_execute_by_config"][f"{rn}/{en}"] = {k: sum(v) / sum(ev) for k, v in per.items()}
            summary["hidden_share"][f"{rn}/{en}"] = _hidden_share(rb, ev)
    return summary


def _token_counts(model, req) -> dict:
    """Tokens of the request: masked image tokens (computed), reused ones (cached), reference and text
    tokens (computed with the masked ones in every block)."""
    masked = int(model.token_mask(req.mask).sum())
    ref = model.reference_tokens(req)
    text_cfg = getattr(model.text_encoder, "cfg", None)
    return {"masked_tokens": masked, "reused_tokens": model.codec.num_tokens - masked,
            "reference_tokens": 0 if ref is None else int(ref.shape[0]),
            "text_tokens": getattr(text_cfg, "max_tokens", None)}


def _random_cache(model, req):
    """Seeded FP16 K/V of the template's geometry (for timing only)."""
    import torch

    from sakura.kvcache import KVCache

    reuse = torch.nonzero(~model.token_mask(req.mask)).flatten()
    cache = KVCache(model.num_steps, model.num_layers, model.heads, model.head_dim, reuse)
    g = torch.Generator().manual_seed(0)
    for s in range(model.num_steps):
        for layer in range(model.num_layers):
            cache.k[(s, layer)] = torch.randn(len(reuse), cache.dim, generator=g).half()
            cache.v[(s, layer)] = torch.randn(len(reuse), cache.dim, generator=g).half()
    return cache


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def print_report(report: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=None if Console().is_terminal else 150)
    main = "r{}-a{}-b{}".format(*report["main_config"])
    recs = list(report["summary"]["rebuild_ms_mean"])
    exes = list(report["summary"]["execute_ms_mean"])
    if "note" in report:
        console.print(f"[bold]{report['note']}[/bold]")
    g = report.get("geometry")
    if g:
        console.print(f"d = {g['d']} ({g['heads']} heads × {g['head_dim']}), {g['layers']} layers, {g['steps']} steps, "
                      f"{g['image_tokens']} image tokens: {g['masked_tokens']} masked + {g['reference_tokens']} "
                      f"reference + {g['text_tokens']} text computed, {g['reused_tokens']} reused; "
                      f"torch threads {report['torch_threads']}")
    t = Table(title=f"bench-device: {report['template']} ({report['model']}), shard size {report['shard_size']}, "
                    f"config {tuple(report['main_config'])}, ms")
    t.add_column("shard")
    t.add_column("layers")
    t.add_column("KiB", justify="right")
    t.add_column(f"recv @{report['mbps']:g}Mb/s", justify="right")
    for r in recs:
        t.add_column(f"rebuild {r}", justify="right")
    for e in exes:
        t.add_column(f"exec {e}", justify="right")
    if recs and exes:
        t.add_column(f"{recs[-1]}/{exes[-1]}", justify="right")
    for row in report["shards"]:
        cells = [str(row["shard"]), f"s{row['step']} {row['layers'][0]}-{row['layers'][1]}",
                 f"{row['bytes'][main] / 1024:.0f}", f"{row['receive_ms'][main]:.1f}"]
        cells += [f"{row['rebuild_ms'][r][main]:.2f}" for r in recs]
        cells += [f"{row['execute_ms'][e]:.2f}" for e in exes]
        if recs and exes:
            cells.append(f"{100 * row['rebuild_ms'][recs[-1]][main] / row['execute_ms'][exes[-1]]:.1f}%")
        t.add_row(*cells)
    console.print(t)
    s = report["summary"]
    t2 = Table(title="summary (main config)")
    for col in ("reconstructor/executor", "rebuild ÷ execute", "hidden (model)", "pipelined wall", "serial", "stall"):
        t2.add_column(col, justify="right")
    for pair, ratio in s["rebuild_over_execute"].items():
        pl = s["pipelined"].get(pair, {})
        t2.add_row(pair, f"{100 * ratio:.1f}%", f"{100 * s['hidden_share'][pair]:.0f}%",
                   f"{pl.get('wall_ms', float('nan')):.0f} ms", f"{pl.get('serial_ms', float('nan')):.0f} ms",
                   f"{pl.get('stall_ms', float('nan')):.1f} ms")
    console.print(t2)
    by_config = s.get("rebuild_over_execute_by_config", {})
    if by_config:
        levels = report.get("levels", {})
        pk = report["pack"]
        t3 = Table(title=f"rebuild ÷ execute per configuration (mean ms per shard; pack v{pk.get('version', 1)}"
                         f"{', shared basis' if pk.get('shared_shards') else ''})")
        t3.add_column("config")
        t3.add_column("level rank", justify="right")
        t3.add_column("KiB", justify="right")
        for r in recs:
            t3.add_column(f"rebuild {r}", justify="right")
        for pair in by_config:
            t3.add_column(pair, justify="right")
        for k in s["rebuild_ms_mean"][recs[0]]:
            lv = levels.get(k, {})
            rank = (f"{lv['rank_min']}" if lv.get("rank_min") == lv.get("rank_max") else
                    f"{lv.get('rank_min')}–{lv.get('rank_max')}") if lv else ""
            t3.add_row(k, rank, f"{lv['kib_mean']:.0f}" if lv else "",
                       *[f"{s['rebuild_ms_mean'][r][k]:.2f}" for r in recs],
                       *[f"{100 * by_config[pair][k]:.1f}%" for pair in by_config])
        console.print(t3)
        console.print("execute ms per shard: " + ", ".join(f"{e} {v:.1f}" for e, v in s["execute_ms_mean"].items()))
    for name, dev in report.get("reconstructors", {}).items():
        console.print(f"[dim]{name}: {dev}[/dim]")
    if "image_max_abs_executorch_vs_eager" in report:
        console.print(f"ExecuTorch vs eager image: max abs {report['image_max_abs_executorch_vs_eager']:.2e}")


# ---------------------------------------------------------------------------------- CLI (typer-ready)

import typer  # noqa: E402 - light (no torch): cli.py can import this module at start-up


def bench_device_cmd(
    template: str = typer.Option("fs-astronaut", "--template", "-t", help="Template id (Flux2 model)."),
    shard_size: int = typer.Option(2, "--shard-size", help="Layers per shard (cache and program grouping)."),
    max_rank: int = typer.Option(128, "--max-rank", help="Rank of the pack built for the benchmark."),
    config: Optional[list[str]] = typer.Option(None, "--config", "-c", help="r,b_A,b_B (R = stored rank); "
                                               "repeatable; the 2nd is the main one. Default: R,8,8 64,4,4 32,3,2."),
    executor: Optional[list[str]] = typer.Option(None, "--executor", "-e", help="eager / executorch (repeatable)."),
    reconstructor: Optional[list[str]] = typer.Option(None, "--reconstructor", "-r", help="torch / opencl (repeatable)."),
    repeats: int = typer.Option(3, "--repeats", help="Timed repetitions (medians)."),
    mbps: float = typer.Option(50.0, "--mbps", help="Link rate for the receive column."),
    pack: Optional[Path] = typer.Option(None, "--pack", help="Use this built pack instead of building one."),
    importance: bool = typer.Option(False, "--importance", help="Profile token importance for the pack (slower)."),
    random_cache: bool = typer.Option(False, "--random-cache", help="Seeded random K/V instead of capturing the "
                                      "template (times do not depend on values; skips the capture run)."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="Catalog manifest (TOML); default: the embedded one."),
    model: Optional[Path] = typer.Option(None, "--model", help="A model folder (sakura.json + transformer/ + "
                                         "text_encoder/) instead of the template's model."),
    geometry: Optional[str] = typer.Option(None, "--geometry", help="Time a seeded random-weight model of this "
                                           "geometry (flux2-klein-4b), built in memory: times only. Use with "
                                           "--random-cache."),
    geometry_layers: Optional[str] = typer.Option(None, "--geometry-layers", help="D,S: double and single blocks "
                                                  "of the --geometry model (default: the real model's counts)."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="torch intra-op threads (default: "
                                          "torch's own setting)."),
    layout: str = typer.Option("uniform", "--layout", help="Pack to build: uniform (v1, rank --max-rank) or "
                               "allocated (v2 as `sakura build` writes it for top quality (--max-rank, 8, 8))."),
    basis: str = typer.Option("shard", "--basis", help="v2 token basis: shard (one A shared by a shard's K/V units, "
                              "factorised to 4 × --max-rank) or unit (one per unit, 2 × --max-rank)."),
    out: Path = typer.Option(Path("bench-device.json"), "--out", "-o", help="JSON report."),
):
    """Per shard: rebuild (torch vs OpenCL) vs execute (eager vs ExecuTorch), and how much rebuild hides."""
    report = bench_device(template, catalog=catalog, shard_size=shard_size, max_rank=max_rank,
                          configs=config or DEFAULT_CONFIGS, executors=executor or ("eager", "executorch"),
                          reconstructors=reconstructor or ("torch", "opencl"), repeats=repeats, mbps=mbps,
                          pack=pack, importance=importance, random_cache=random_cache, model_path=model,
                          geometry=geometry, geometry_layers=geometry_layers, threads=threads, layout=layout,
                          basis=basis, log=lambda m: typer.echo(m, err=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print_report(report)
    typer.echo(f"wrote {out}")
