"""``sakura bench-device`` on the command line: the report as rich tables, and the typer command
(the measurement itself is :mod:`sakura.eval.device_bench`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from sakura.eval.device_bench import DEFAULT_CONFIGS, bench_device


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
    at_budget = {pair: r for pair, r in s.get("rank_at_budget", {}).items() if r is not None}
    if at_budget:
        console.print(f"decoded rank at which rebuild reaches {100 * s['rebuild_budget']:.0f} % of execute (line fit): "
                      + ", ".join(f"{pair} {r}" for pair, r in at_budget.items())
                      + f" → `sakura build --rebuild-rank {min(at_budget.values())}` keeps every level within it")
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
    config: Optional[list[str]] = typer.Option(
        None,
        "--config",
        "-c",
        help="r,b_A,b_B (R = stored rank); repeatable; the 2nd is the main one. Default: R,8,8 64,4,4 32,3,2.",
    ),
    executor: Optional[list[str]] = typer.Option(None, "--executor", "-e", help="eager / executorch (repeatable)."),
    reconstructor: Optional[list[str]] = typer.Option(
        None, "--reconstructor", "-r", help="torch / opencl (repeatable)."
    ),
    repeats: int = typer.Option(3, "--repeats", help="Timed repetitions (medians)."),
    mbps: float = typer.Option(50.0, "--mbps", help="Link rate for the receive column."),
    pack: Optional[Path] = typer.Option(None, "--pack", help="Use this built pack instead of building one."),
    importance: bool = typer.Option(False, "--importance", help="Profile token importance for the pack (slower)."),
    random_cache: bool = typer.Option(
        False,
        "--random-cache",
        help="Seeded random K/V instead of capturing the "
        "template (times do not depend on values; skips the capture run).",
    ),
    catalog: Optional[Path] = typer.Option(
        None, "--catalog", help="Catalog manifest (TOML); default: the embedded one."
    ),
    model: Optional[Path] = typer.Option(
        None,
        "--model",
        help="A model folder (sakura.json + transformer/ + text_encoder/) instead of the template's model.",
    ),
    geometry: Optional[str] = typer.Option(
        None,
        "--geometry",
        help="Time a seeded random-weight model of this "
        "geometry (flux2-klein-4b), built in memory: times only. Use with "
        "--random-cache.",
    ),
    geometry_layers: Optional[str] = typer.Option(
        None,
        "--geometry-layers",
        help="D,S: double and single blocks of the --geometry model (default: the real model's counts).",
    ),
    threads: Optional[int] = typer.Option(
        None, "--threads", min=1, help="torch intra-op threads (default: torch's own setting)."
    ),
    layout: str = typer.Option(
        "uniform",
        "--layout",
        help="Pack to build: uniform (v1, rank --max-rank) or "
        "allocated (v2 as `sakura build` writes it for top quality (--max-rank, 8, 8)).",
    ),
    basis: str = typer.Option(
        "shard",
        "--basis",
        help="v2 token basis: shard (one A shared by a shard's K/V units, "
        "factorised to 4 × --max-rank) or unit (one per unit, 2 × --max-rank).",
    ),
    rebuild_rank: Optional[int] = typer.Option(
        None, "--rebuild-rank", min=1, help="Cap the built pack's decoded rank, as `sakura build --rebuild-rank` does."
    ),
    out: Path = typer.Option(Path("bench-device.json"), "--out", "-o", help="JSON report."),
):
    """Per shard: rebuild (torch vs OpenCL) vs execute (eager vs ExecuTorch), and how much rebuild hides."""
    report = bench_device(template, catalog=catalog, shard_size=shard_size, max_rank=max_rank,
                          configs=config or DEFAULT_CONFIGS, executors=executor or ("eager", "executorch"),
                          reconstructors=reconstructor or ("torch", "opencl"), repeats=repeats, mbps=mbps,
                          pack=pack, importance=importance, random_cache=random_cache, model_path=model,
                          geometry=geometry, geometry_layers=geometry_layers, threads=threads, layout=layout,
                          basis=basis, rebuild_rank=rebuild_rank, log=lambda m: typer.echo(m, err=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print_report(report)
    typer.echo(f"wrote {out}")
