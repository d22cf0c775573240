"""The ``sakura`` command: this file wires the commands; the longer command bodies are the modules beside it
(``edit_stream``, ``export``, ``bench_device``, ``store``, ``build_store``) and ``errors`` is how every one of
them fails. Imports any part of ``sakura``, inside the commands; ``app`` and ``device_bridge`` register their
commands as entry points (``sakura.commands``) and are never imported by name.

Heavy imports (torch, diffusers) happen inside commands so ``sakura --help`` stays fast. Every
expected failure (bad template id, unreadable image, malformed pack, …) exits with status 2 and
one line on stderr, never a traceback.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from sakura.cli.errors import MAX_IMAGE_SIDE, UserError, check_image_file, friendly
from sakura.places import PACKS_HELP, packs_or_default
from sakura.systems import SYSTEMS

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="SAKURA: private image editing on phones by streaming reusable attention state.")
catalog_app = typer.Typer(no_args_is_help=True, help="The template catalog.")
app.add_typer(catalog_app, name="catalog")


CatalogOpt = typer.Option(None, "--catalog", help="Catalog manifest (TOML); default: the embedded one.")


@catalog_app.command("list")
@friendly
def catalog_list(catalog: Optional[Path] = CatalogOpt, as_json: bool = typer.Option(False, "--json")):
    """List the templates: id, task, model, mask ratio, requests."""
    from rich.console import Console
    from rich.table import Table

    from sakura.catalog import load_catalog  # inside the command, as every library import here

    cat = load_catalog(catalog)
    rows = [t.summary() for t in cat]
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    table = Table(title=f"catalog: {cat.path}")
    for col in ("id", "task", "model", "mask %", "profile", "eval"):
        table.add_column(col)
    for t in cat:
        table.add_row(t.id, t.task, t.model, f"{100 * t.mask_ratio:.1f}", str(len(t.profile_requests)),
                      str(len(t.eval_requests)))
    Console().print(table)


def check_backend_names(executor: str, reconstructor: str) -> None:
    """``--executor`` / ``--reconstructor`` against the backends registry (one line when unknown)."""
    from sakura.runtime.backends import BackendChoice  # inside the command, as every library import here

    try:
        BackendChoice(executor, reconstructor)
    except ValueError as e:
        raise UserError(str(e)) from None


def _load_reference(spec: str) -> "object":
    from sakura.catalog import load_image_spec  # inside the command, as every library import here

    try:
        return load_image_spec(spec, Path.cwd())
    except FileNotFoundError:
        raise UserError(f"reference image not found: {spec}")


@app.command()
@friendly
def edit(
    template: str = typer.Option(..., "--template", "-t", help="Template id (see `sakura catalog list`)."),
    reference: Optional[str] = typer.Option(None, "--reference", "-r", help="Reference image (fs, vton)."),
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="Instruction (mb)."),
    mode: str = typer.Option("reuse", "--mode", help="full: every token; reuse: masked run on the exact FP16 cache."),
    out: Path = typer.Option(Path("edit.png"), "--out", "-o"),
    as_json: bool = typer.Option(False, "--json", help="Run both modes and print timings and reuse-vs-full quality."),
    catalog: Optional[Path] = CatalogOpt,
    model_path: Optional[Path] = typer.Option(
        None, "--model-path", help="Local model folder instead of the embedded model."
    ),
    stream: bool = typer.Option(
        False, "--stream", help="Stream the cache from a template server (see `sakura serve`)."
    ),
    policy: str = typer.Option("sakura", "--policy", help=f"With --stream: {', '.join(SYSTEMS)}."),
    trace: str = typer.Option("5g", "--trace", help="With --stream: 5g, 4g5g, wifi, fixed:MBPS or a trace file."),
    start: float = typer.Option(0.0, "--start", help="With --stream: offset into the trace (s)."),
    trace_scale: Optional[float] = typer.Option(None, "--trace-scale", help="Multiply the trace's bandwidth."),
    regime: str = typer.Option(
        "paper", "--regime", help="paper: scale the trace to the paper's 23 s / 13 s regime; none."
    ),
    server: Optional[str] = typer.Option(None, "--server", help="Template server URL, or several (URL,URL: replicas "
                                         "tried in order when one dies); default: start one on --packs."),
    packs: Optional[str] = typer.Option(None, "--packs", help=f"Pack folder or s3://bucket/prefix (built if missing; "
                                        f"{PACKS_HELP})."),
    executor: str = typer.Option(
        "eager", "--executor", help="With --stream: eager | executorch (shard .pte programs) | auto."
    ),
    reconstructor: str = typer.Option("torch", "--reconstructor", help="With --stream: torch | opencl | auto."),
    calibration: Optional[Path] = typer.Option(
        None,
        "--calibration",
        help="With --stream: JSON file of measured device compute, shared with `sakura device --calibration`.",
    ),
    link: str = typer.Option("paced", "--link", help="With --stream: paced (the device paces along the trace) or "
                             "kernel (server and device in a network namespace whose loopback tc shapes; root)."),
):
    """Edit a template locally: full recomputation or masked execution with template KV reuse."""
    check_image_file(reference)
    if stream:
        from sakura.cli.edit_stream import stream_edit  # the streaming runtime owns this path

        check_backend_names(executor, reconstructor)
        stream_edit(template=template, reference=reference, prompt=prompt, out=out, as_json=as_json,
                    catalog=catalog, policy=policy, trace=trace, start=start, trace_scale=trace_scale,
                    regime=regime, server=server, packs=packs if server else packs_or_default(packs),
                    executor=executor, reconstructor=reconstructor,
                    calibration=calibration, link=link)
        return
    if mode not in ("full", "reuse"):
        raise UserError(f"--mode must be full or reuse, not {mode!r}")
    import numpy as np
    import torch
    from PIL import Image

    from sakura.catalog import load_catalog  # inside the command, as every library import here
    from sakura.editing import edit_request, model_for  # heavy (torch): inside the command
    from sakura.quality import quality  # inside the command, as every library import here

    tpl = load_catalog(catalog).get(template)
    if tpl.task in ("fs", "vton") and not reference:
        raise UserError(f"template {tpl.id} is a {tpl.task} template: pass --reference IMAGE")
    if tpl.task == "mb" and not (prompt and prompt.strip()):
        raise UserError(f"template {tpl.id} is a text edit: pass a non-empty --prompt")
    ref = _load_reference(reference) if reference and tpl.task in ("fs", "vton") else None
    model = model_for(tpl, model_path)
    req = edit_request(tpl, prompt=prompt, reference=ref, resolution=model.codec.resolution,
                       ref_size=model.codec.ref_size)
    model.validate(req)
    report: dict = {"template": tpl.id, "task": tpl.task, "model": model.model_id, "mode": mode}
    image = cache = None
    if mode == "reuse" or as_json:
        # capture first: it is offline work (timed apart) and warms the model up for both timings
        t0 = time.perf_counter()
        cache = model.capture(req).to(torch.float16)
        report["capture_s"] = time.perf_counter() - t0
        report["cache_fp16_bytes"] = cache.nbytes()
    if mode == "full" or as_json:
        res = model.full_edit(req)
        report["full_s"] = res.seconds
        full_image = image = res.image
    if cache is not None:
        res = model.masked_edit(req, cache.provider())
        report["reuse_s"] = res.seconds
        if mode == "reuse":
            image = res.image
        if as_json:
            report["speedup"] = report["full_s"] / report["reuse_s"]
            report["reuse_vs_full"] = quality(res.image, full_image, req.mask)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((np.clip(image, 0, 1) * 255).round().astype("uint8")).save(out)
    report["out"] = str(out)
    typer.echo(json.dumps(report, indent=1) if as_json else f"wrote {out} ({mode}, {report.get(mode + '_s', 0):.2f} s)")


@app.command()
@friendly
def build(
    out: Optional[str] = typer.Option(None, "--out", help="Pack folder, or an object store: s3://bucket/prefix "
                                      f"(endpoint and credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...; "
                                      f"{PACKS_HELP})."),
    catalog: Optional[Path] = CatalogOpt,
    templates: Optional[str] = typer.Option(None, "--templates", help="Comma-separated ids (default: all)."),
    q: float = typer.Option(0.5, "--q", help="Importance-weighting exponent (0 = plain SVD)."),
    max_rank: int = typer.Option(128, "--max-rank"),
    shard_size: int = typer.Option(2, "--shard-size", help="Consecutive layers per shard."),
    model_path: Optional[Path] = typer.Option(None, "--model-path"),
    ray: Optional[str] = typer.Option(None, "--ray", help="Build as Ray tasks: `local` (a Ray on this machine) or "
                                      "a cluster address (auto, HOST:6379, ray://HOST:10001)."),
    ray_workers: Optional[int] = typer.Option(None, "--ray-workers", help="With --ray local: CPUs (parallel tasks)."),
    force: bool = typer.Option(False, "--force", help="Rebuild templates whose packs are already published."),
    basis: str = typer.Option("auto", "--basis", help="SAKURA pack: one token basis per shard, shared by its K/V "
                              "units (shard), one per unit (unit), or per template the first of shard at 0.5, unit, "
                              "shard at 0.35 / 0.25 of v1's top error whose top matches v1's masked PSNR (auto)."),
    rebuild_rank: Optional[int] = typer.Option(None, "--rebuild-rank", min=1, help="Cap every level's decoded "
                                               "rank (rebuild work grows with it): the target device's "
                                               "`rank_at_budget` from `sakura bench-device` (default: no cap)."),
    output_weights_only: bool = typer.Option(False, "--output-weights-only", help="Only measure (again) each "
                                             "SAKURA pack's per-shard output weights and every level's output MSE "
                                             "into its header (packs built before them lack them); the packs must "
                                             "be in a folder."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="torch threads in this process (default: "
                                          "torch's own, one per core; two builds side by side: 1 each, or they "
                                          "oversubscribe the cores and run several times slower)."),
):
    """Offline: capture, profile importance, write the progressive pack and the baselines' files."""
    from sakura.catalog import load_catalog  # inside the command, as every library import here
    from sakura.net.stores import is_store_url  # inside the command, as every library import here

    if threads is not None:
        import torch

        torch.set_num_threads(threads)

    cat = load_catalog(catalog)
    chosen = [cat.get(t.strip()) for t in templates.split(",")] if templates else list(cat)
    out = packs_or_default(out)
    if output_weights_only:
        if is_store_url(out):
            raise typer.BadParameter("--output-weights-only rewrites pack headers in a folder, not in a store")
        from rich.progress import Progress

        from sakura.formats import FORMATS  # inside the command, as every library import here
        from sakura.offline.builder import remeasure_output_weights  # heavy (torch): inside the command

        missing = [t.id for t in chosen if not (Path(out) / f"{FORMATS['sakura'].file_id(t.id)}.pack").is_file()]
        if missing:
            raise typer.BadParameter(f"no SAKURA pack in {out} for {', '.join(missing)}: build first")
        for tpl in chosen:
            with Progress(transient=True) as bar:  # (per shard: every level of it is one masked run)
                task = bar.add_task(f"{tpl.id}: output weights", total=None)
                measured = remeasure_output_weights(
                    tpl, Path(out), model_path, lambda msg, tid=tpl.id: bar.update(task, description=f"{tid}: {msg}"))
            typer.echo(f"{tpl.id}: output weight per shard {min(measured.weights):.3g} … {max(measured.weights):.3g}, "
                       f"{sum(map(len, measured.level_mse))} levels' output MSE, "
                       f"local masked MSE {measured.local_mse:.3g}")
        return
    if ray is None and not is_store_url(out):  # the embedded default, exactly as before
        from sakura.offline.builder import build_with_progress  # heavy (torch): inside the command

        build_with_progress(chosen, Path(out), q=q, max_rank=max_rank, shard_size=shard_size, model_path=model_path,
                            basis=basis, rebuild_rank=rebuild_rank)
        return
    from sakura.cli.build_store import build_to_store  # heavy (torch): inside the command

    build_to_store(chosen, out, q=q, max_rank=max_rank, shard_size=shard_size, model_path=model_path, ray=ray,
                   ray_workers=ray_workers, catalog=catalog, force=force, basis=basis, rebuild_rank=rebuild_rank)


@app.command("pack-info")
@friendly
def pack_info(path: Path = typer.Argument(..., help="PACKDIR/ID (the template's files in PACKDIR)."),
              as_json: bool = typer.Option(False, "--json")):
    """Sizes of a template's stored formats and its SAKURA pack's frontier."""
    from sakura.formats.inspect import pack_summary  # inside the command, as every library import here

    info = pack_summary(path.parent, path.name)
    if as_json:
        typer.echo(json.dumps(info, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{info['template_id']} ({info['model_id']})")
    for col in ("format", "bytes", "vs FP16"):
        table.add_column(col)
    for name, nbytes in info["storage"].items():
        table.add_row(name, f"{nbytes:,}", f"{nbytes / info['fp16_bytes']:.3f}")
    lad = info.get("ladder_storage")
    if lad:  # pack v3: the file above is the pack and its residual rungs; the exact rung is the FP16 file's bytes
        for name, nbytes in (("  sakura: pack alone", lad["pack"]), ("  sakura: residual rungs", lad["rungs"]),
                             ("  sakura: + referenced FP16", lad["pack"] + lad["rungs"] + lad["fp16"])):
            table.add_row(name, f"{nbytes:,}", f"{nbytes / info['fp16_bytes']:.3f}")
    Console().print(table)
    typer.echo(
        f"shards {info['shards']}, frontier sizes {info['frontier_sizes'][:4]}…, header {info['header_bytes']:,} B"
    )


@app.command()
@friendly
def serve(
    packs: Optional[str] = typer.Option(
        None,
        "--packs",
        help="Pack folder, or s3://bucket/prefix: then the server "
        f"gives catalog, headers and presigned URLs and devices read the store ({PACKS_HELP}).",
    ),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8600, "--port"),
    access_log: Optional[Path] = typer.Option(None, "--access-log"),
    trace_dir: Optional[Path] = typer.Option(None, "--trace-dir", help="Folder of trace files clients may name."),
):
    """Run the stateless template server over a pack folder or an object store."""
    from sakura.net.stores import is_store_url  # inside the command, as every library import here
    from sakura.server.run import serve as run_server  # heavy (fastapi/uvicorn): inside the command

    packs = packs_or_default(packs)
    if not is_store_url(packs) and not Path(packs).is_dir():
        raise UserError(f"pack folder {packs} does not exist (run `sakura build --out {packs}`)")
    run_server(packs, host=host, port=port, access_log=access_log, trace_dir=trace_dir)


@app.command()
@friendly
def bench(
    out: Path = typer.Option(Path("runs/bench"), "--out"),
    workloads: str = typer.Option("fs,vton,mb,mb-sd", "--workloads"),
    systems: str = typer.Option(",".join(SYSTEMS), "--systems"),
    trace: str = typer.Option("5g", "--trace", help="5g, 4g5g, wifi, fixed:MBPS or a trace file."),
    starts: int = typer.Option(100, "--starts", help="Random start offsets per workload."),
    trace_part: str = typer.Option("all", "--trace-part", help="all | first | second: draw the offsets from that part "
                                   "of the trace (tune on first halves, report held-out second halves); outages: "
                                   "start each edit up to 1 s before one of the trace's dead stretches."),
    regime: str = typer.Option("paper", "--regime", help="paper | none"),
    trace_scale: Optional[float] = typer.Option(None, "--trace-scale"),
    sim_link: str = typer.Option("fluid", "--sim-link", help="The simulated clock's link: fluid (the trace as it is) "
                                 "| tcp (an outage holds a transfer until TCP's next retransmission after it, as on "
                                 "the kernel-shaped link) | kernel (tcp, and each request and sub-request pays its "
                                 "round trip once the link is free, as the device reads a kernel-shaped link). With "
                                 "--clock both --link kernel all run."),
    rebuild_overlap: float = typer.Option(1.0, "--rebuild-overlap", help="The simulated device's share of a rebuild "
                                          "hidden beside execution: 1, a core to spare (a phone); 0, rebuilds take the "
                                          "executor's core (this 2-core host). With --clock both --link kernel, 0 runs "
                                          "as sim-host and sim-kernel."),
    clock: str = typer.Option(
        "sim",
        "--clock",
        help="sim (replays measured compute) | real (server + sockets) | both (both sweeps and the sim-vs-real table).",
    ),
    quick: bool = typer.Option(False, "--quick", help="10 offsets, the fs workload only, no Fig. 11: minutes."),
    packs: Optional[str] = typer.Option(None, "--packs", help="Pack folder or s3://bucket/prefix (missing packs are "
                                        f"built; {PACKS_HELP})."),
    figure: Optional[str] = typer.Option(
        None,
        "--figure",
        help="Regenerate one figure: 11,12,13,15,16,17,18,19,20,21,table2,estimators,tails,"
        "packs (v2 vs v1 pack), rebuild-pricing, regret (CDFs of each system's regret against its "
        "clairvoyant optimum), or all.",
    ),
    project: Optional[str] = typer.Option(None, "--project", help="Paper-scale projection, e.g. flux2-klein-4b."),
    seed: int = typer.Option(0, "--seed"),
    append: bool = typer.Option(False, "--append", help="Keep other workloads already in OUT/summary.json."),
    threads: int = typer.Option(1, "--threads", help="torch threads (1: steady timings on a shared machine)."),
    calibration: Optional[Path] = typer.Option(
        None,
        "--calibration",
        help="Calibration file (measured compute and "
        "request round trip, reused until the machine or model changes); "
        "default: ~/.cache/sakura/calibration.json.",
    ),
    fallbacks: bool = typer.Option(
        True,
        "--fallbacks/--no-fallbacks",
        help="Let every streaming system's runtime "
        "reuse the previous step's K/V, recompute step 0 or go local instead of waiting "
        "(--no-fallbacks: always wait, the paper's runtime).",
    ),
    think_time: Optional[float] = typer.Option(
        None,
        "--think-time",
        help="Also run `sakura+prefetch`: the template "
        "was picked S seconds before the edit and its pack prefetched meanwhile.",
    ),
    calibration_runs: int = typer.Option(
        7,
        "--calibration-runs",
        help="Local-generation runs per template when calibrating (the regime scale rests on their median).",
    ),
    quality_requests: int = typer.Option(
        2,
        "--quality-requests",
        min=1,
        help="Fig. 15: held-out requests per template at every operating point (the catalog has 6–7).",
    ),
    executor: str = typer.Option(
        "eager", "--executor", help="eager | executorch: with executorch (and/or --reconstructor opencl) every "
        "row also runs on that stack, beside the eager/torch rows, with per-shard execute/rebuild ratios."),
    reconstructor: str = typer.Option("torch", "--reconstructor", help="torch | opencl (see --executor)."),
    link: str = typer.Option("paced", "--link", help="Real-clock runs: paced (the device paces along the trace) or "
                             "kernel (server and device in a network namespace tc shapes; root). With --clock both, "
                             "kernel adds a third run and links.md."),
    regret: bool = typer.Option(
        False, "--regret", help="Measure every streamed edit against its system's clairvoyant optimum (latency / "
        "optimal at equal quality, quality gap at equal latency; SAKURA rerun with the true future rates): "
        "summary.json gets their p50 / p90. --figure regret implies it."),
    regret_budget: float = typer.Option(20.0, "--regret-budget", help="The planner's CPU seconds per solve "
                                        "(load-independent); past them it reports its optimality gap."),
    window_rule: bool = typer.Option(False, "--window-rule", help="Also run `sakura+rule` (simulated clock): SAKURA's "
                                     "earlier per-unit window rule (each unit its own window, a shorter start-up "
                                     "hold) instead of its plan, beside SAKURA."),
    also_estimator: list[str] = typer.Option([], "--also-estimator", help="Also run SAKURA on this rate estimator "
                                             "(simulated clock; repeatable): `sakura+NAME` rows beside SAKURA's."),
    rebuild_clock: str = typer.Option(
        "cpu",
        "--rebuild-clock",
        help="cpu | wall | tick: time the simulated clock's "
        "rebuilds by the rebuilding thread's CPU time (the default: the systems' ranking does not move "
        "with machine load), by elapsed time (on a quiet machine; compute is replayed from the calibration "
        "either way), or at 2 ms each (tick: runs repeat exactly, to compare code before and after a change).",
    ),
):
    """Reproduce the paper's evaluation: every system, same trace offsets, same metrics."""
    import torch

    # Oversubscribed cores make multi-threaded small matmuls several times slower and noisy; the
    # simulated clock replays compute measured under this same setting for every system.
    torch.set_num_threads(threads)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sakura.eval import bench, figures  # heavy (torch, matplotlib): inside the command
    from sakura.runtime.calibration import default_path  # heavy (torch): inside the command

    if clock not in ("sim", "real", "both"):
        raise UserError("--clock must be sim, real or both")
    if rebuild_clock not in bench.REBUILD_CLOCKS:
        raise UserError(f"--rebuild-clock must be one of {', '.join(bench.REBUILD_CLOCKS)}")
    check_backend_names(executor, reconstructor)
    if executor in ("executorch", "auto"):  # XNNPACK's pool gets the same cores as torch (before any program loads)
        from sakura.runtime.executors.executorch_backend import set_threads  # inside the command, as every import

        set_threads(threads)
    if (executor, reconstructor) != ("eager", "torch"):
        if rebuild_clock == "cpu":  # OpenCL rebuilds run in the runtime's own threads: thread CPU time misses them
            rebuild_clock = "wall"
        if clock != "sim":
            raise UserError("--executor / --reconstructor run beside the eager rows on the simulated clock: use "
                            "--clock sim")
    bench.use_rebuild_clock(rebuild_clock)
    packs = packs_or_default(packs)
    cfg = bench.BenchConfig(workloads=tuple(w.strip() for w in workloads.split(",")),
                            systems=tuple(x.strip() for x in systems.split(",")), trace=trace, starts=starts,
                            trace_part=trace_part, regime=regime, trace_scale=trace_scale, seed=seed, append=append,
                            packs=packs if "://" in packs else Path(packs),
                            calibration_file=calibration or default_path(), repeats=5, think_time=think_time,
                            fallbacks=fallbacks,
                            full_repeats=max(1, calibration_runs), quality_requests=quality_requests,
                            executor=executor, reconstructor=reconstructor,
                            regret=regret or figure == "regret", regret_budget_s=regret_budget, sim_link=sim_link,
                            rebuild_overlap=rebuild_overlap, window_rule=window_rule,
                            also_estimators=tuple(also_estimator))
    from sakura.online.monitor import ESTIMATORS  # (light; with the other imports of the command)

    unknown = [e for e in also_estimator if e not in ESTIMATORS]
    if unknown:
        raise UserError(f"--also-estimator: unknown {', '.join(unknown)}; choose from {', '.join(ESTIMATORS)}")
    if trace_part not in bench.TRACE_PARTS:
        raise UserError(f"--trace-part must be one of {', '.join(bench.TRACE_PARTS)}, not {trace_part!r}")
    if not 0.0 <= rebuild_overlap <= 1.0:
        raise UserError(f"--rebuild-overlap is a share in [0, 1], not {rebuild_overlap}")
    if sim_link not in bench.SIM_LINKS:
        raise UserError(f"--sim-link must be one of {', '.join(bench.SIM_LINKS)}, not {sim_link!r}")
    for sname in cfg.systems:
        if sname not in SYSTEMS:
            raise UserError(f"unknown system {sname!r}; choose from {', '.join(SYSTEMS)}")
    if quick:
        cfg.workloads, cfg.starts = ("fs",), 10
    from sakura.net.kernel import check_link, link_for_command  # (no torch)

    check_link(link)
    if link != "paced" and (clock == "sim" or figure or project or "://" in str(cfg.packs)):
        raise UserError("--link kernel shapes real-clock runs on a pack folder: use --clock real or both, no "
                        "--figure / --project")

    with link_for_command(link) as kernel, Progress(TextColumn("{task.description}"), BarColumn(),
                                                     MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        say = bar.console.print
        if clock == "both":
            from sakura.eval import plots, realclock  # heavy (torch, matplotlib): inside the command

            summary = realclock.run_both_clocks(cfg, out, progress=bar, say=say, kernel=kernel)
            say(realclock.clock_table(summary["clock_check"]))
            if kernel is not None:
                say(realclock.link_table(summary["link_check"]))
            written = plots.write_all(summary, out) + [out / "summary.json"]
            written += [out / "links.md"] if kernel is not None else []
        elif kernel is not None:
            from sakura.eval import plots, realclock  # heavy (torch, matplotlib): inside the command

            summary = realclock.run_bench_real(cfg, out, progress=bar, say=say, kernel=kernel)
            written = plots.write_all(summary, out) + [out / "summary.json"]
        else:
            written = figures.run(cfg, out, figure=figure, project=project, clock=clock, progress=bar, say=say,
                                  example_trace=not quick)
    if cfg.stack is not None and (out / "summary.json").is_file():  # the stack beside eager + torch
        from sakura.eval.bench_backends import backends_markdown  # inside the command, as every library import here

        table = backends_markdown(json.loads((out / "summary.json").read_text()))
        (out / "backends.md").write_text(table)
        typer.echo(table)
        written.append(out / "backends.md")
    for path in written:
        typer.echo(f"wrote {path}")


@app.command()
@friendly
def report(
    kind: str = typer.Argument(..., help="importance | tradeoff | q-sweep"),
    templates: str = typer.Option("fs-astronaut", "--templates", help="Comma-separated template ids."),
    packs: Optional[Path] = typer.Option(None, "--packs", help=PACKS_HELP),
    out: Path = typer.Option(Path("runs/report"), "--out"),
):
    """Offline observations: token importance (Fig. 2), rank-precision trade-off (Fig. 8), q sweep (Fig. 19)."""
    from sakura.catalog import load_catalog  # inside the command, as every library import here
    from sakura.eval import bench, reports  # heavy (torch): inside the command

    if kind not in ("importance", "tradeoff", "q-sweep"):
        raise UserError("report kind must be importance, tradeoff or q-sweep")
    packs = Path(packs_or_default(packs))
    out.mkdir(parents=True, exist_ok=True)
    cat = load_catalog()
    chosen = [cat.get(t.strip()) for t in templates.split(",")]
    if kind == "q-sweep":
        from sakura.eval import figures  # heavy (torch, matplotlib): inside the command

        tasks = {t.task for t in chosen}
        workload = "fs" if "fs" in tasks else sorted(tasks)[0]
        for path in figures.fig19_q_sweep(
            bench.BenchConfig(workloads=(workload,), packs=packs), out, {}, None, typer.echo
        ):
            typer.echo(f"wrote {path}")
        return
    for tpl in chosen:
        prepared = bench.prepare_template(tpl, packs, say=lambda s: typer.echo(s, err=True), repeats=1)
        result = (reports.importance_report if kind == "importance" else reports.tradeoff_report)(prepared, packs, out)
        if kind == "importance":
            typer.echo(
                f"{tpl.id}: top decile carries {100 * result['decile_error_share'][0]:.0f}% of the INT2 error; "
                f"top-10% overlap {result['top10_overlap_mean']:.2f}; "
                f"top-10% attention mass {result['top10_mass_share_mean']:.2f}"
            )
        else:
            ratios = ", ".join(f"{k} {v:.2f}x" for k, v in result["fp16_over"].items() if k.startswith("sakura"))
            typer.echo(
                f"{tpl.id}: frontier of shard 0 has {len(result['frontier'])} configurations; FP16 / pack: {ratios}"
            )
    typer.echo(f"figures in {out}")


@app.command("train-tiny", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train_tiny(ctx: typer.Context):
    """Train the embedded models (flow matching on edits synthesized from packaged images).

    Arguments pass through to `python -m sakura.model.train` (see `sakura train-tiny --help-train`)."""
    from sakura.model import train  # heavy (torch): inside the command

    args = ["--help" if a == "--help-train" else a for a in ctx.args]
    train.main(args)


def _register_runtime_commands() -> None:
    """Commands whose bodies are modules of their own. Every ``sakura`` process imports these modules, so
    they must stay light: no torch, diffusers or gradio at import (tests/test_cli_startup.py checks)."""
    from sakura.cli.bench_device import bench_device_cmd  # registered by main(), not on import
    from sakura.cli.export import export_cmd  # registered by main(), not on import
    from sakura.cli.store import store_app  # registered by main(), not on import
    from sakura.eval.loadtest import loadtest_cmd  # registered by main(), not on import

    app.command("export")(friendly(export_cmd))
    app.command("bench-device")(friendly(bench_device_cmd))
    app.add_typer(store_app, name="store")
    app.command("loadtest")(friendly(loadtest_cmd))


def _register_plugins() -> None:
    """Subcommands other packages declare under the ``sakura.commands`` entry-point group (their modules are
    imported by every ``sakura`` process too: keep them as light as the runtime commands above)."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="sakura.commands"):
        try:
            obj = ep.load()
            if isinstance(obj, typer.Typer):  # a command group (`sakura study serve|report|…`)
                app.add_typer(obj, name=ep.name)
            else:
                app.command(ep.name)(obj)
        except Exception as e:  # noqa: BLE001 - a broken plug-in must not break the core CLI
            typer.echo(f"warning: command {ep.name!r} unavailable ({type(e).__name__}: {e})", err=True)


def main() -> None:
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = (
        MAX_IMAGE_SIDE * MAX_IMAGE_SIDE
    )  # any image the CLI decodes (PIL warns above, refuses at 2×)
    _register_runtime_commands()
    _register_plugins()
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
