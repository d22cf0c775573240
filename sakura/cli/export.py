"""``sakura export``: export a template's shards to ExecuTorch programs (typer command body).

Wired in ``sakura/cli/__init__.py`` with ``app.command("export")(friendly(export_cmd))``; add
``BackendUnavailable`` (``sakura.runtime.executors.errors``) to the expected errors so a missing
SDK prints one line and exits 2.

It lives outside :mod:`sakura.runtime.executors` because importing that package loads the model code
(torch, diffusers: seconds), and every ``sakura`` process registers this command; the body imports the
executors when it runs.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Optional

import typer


def export_cmd(
    template: str = typer.Option(..., "--template", "-t", help="Template id (see `sakura catalog list`)."),
    backend: str = typer.Option(
        "xnnpack", "--backend", "-b", help="xnnpack (CPU, runs here) or qnn (Snapdragon HTP; needs QNN_SDK_ROOT)."
    ),
    shard_size: int = typer.Option(2, "--shard-size", help="Layers per shard (the cache shard grouping)."),
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        "-o",
        help="Folder for the .pte files (default: $SAKURA_PTE_CACHE or ~/.cache/sakura/pte, the runtime's cache).",
    ),
    soc: str = typer.Option("SM8650", "--soc", help="qnn only: target Snapdragon SoC (QcomChipset name)."),
    catalog: Optional[Path] = typer.Option(
        None, "--catalog", help="Catalog manifest (TOML); default: the embedded one."
    ),
    model_path: Optional[Path] = typer.Option(
        None, "--model-path", help="Local model folder instead of the embedded model."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the export metadata as JSON."),
    bundle: Optional[Path] = typer.Option(
        None, "--bundle", help="Write a phone bundle into this folder: every program of an edit (text encoder, "
        "reference, per-step parts, shards), the template's tensors and pack headers, and a manifest."
    ),
    force: bool = typer.Option(False, "--force", help="--bundle: replace an existing non-empty folder."),
    packs: Optional[str] = typer.Option(None, "--packs", help="--bundle: where the pack headers are read (folder or "
                                        "s3://bucket/prefix; default: $SAKURA_PACKS, else packs/ in the checkout)."),
    programs: Optional[Path] = typer.Option(None, "--programs", help="--bundle: the shard-program cache (default: "
                                            "programs/ beside a pack folder, else ~/.cache/sakura/programs)."),
):
    """Export every shard of a template's masked run (static token counts) to a .pte program, or (--bundle) all a
    phone needs to run the template's edits."""
    if bundle is not None:
        return _bundle(template, bundle, force, packs, programs, shard_size, catalog, model_path, backend, as_json)
    from sakura.catalog import load_catalog  # sakura --help stays light
    from sakura.editing import edit_request, model_for  # torch: sakura --help stays light
    from sakura.runtime.executors.errors import BackendUnavailable  # torch: sakura --help stays light
    from sakura.runtime.executors.executorch_backend import BACKENDS, check_qnn_sdk, export_shards  # ExecuTorch (heavy)

    if backend not in BACKENDS:
        raise BackendUnavailable(f"--backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if backend == "qnn":
        check_qnn_sdk()  # before loading anything: say what is missing first
    tpl = load_catalog(catalog).get(template)
    model = model_for(tpl, model_path)
    first = tpl.eval_requests[0] if tpl.eval_requests else None  # geometry only: mask, task, text length
    req = edit_request(tpl, first, resolution=model.codec.resolution, ref_size=model.codec.ref_size)
    log = (lambda m: None) if as_json else (lambda m: typer.echo(m, err=True))
    rows = export_shards(model, req, shard_size, backend=backend, out_dir=out, soc=soc, log=log)
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    for r in rows:
        how = "cached" if r.get("cached") else f"exported in {r.get('export_s', 0):.1f} s"
        typer.echo(f"layers {r['layers'][0]}-{r['layers'][1]}: {r['path']} ({r.get('bytes', 0) / 1e6:.1f} MB, {how})")


def _bundle(template: str, out: Path, force: bool, packs: Optional[str], programs: Optional[Path], shard_size: int,
            catalog: Optional[Path], model_path: Optional[Path], backend: str, as_json: bool) -> None:
    from sakura.catalog import load_catalog  # sakura --help stays light
    from sakura.places import packs_or_default  # sakura --help stays light

    if backend != "xnnpack":
        from sakura.runtime.executors.errors import BackendUnavailable  # (a light module)

        raise BackendUnavailable("a bundle holds XNNPACK programs (--backend xnnpack); QNN programs are exported "
                                 "per shard with `sakura export --backend qnn`")
    tpl = load_catalog(catalog).get(template)  # an unknown template: one line, before anything heavy
    from sakura.runtime.bundle_folder import prepare_folder  # sakura --help stays light

    prepare_folder(out, force).rmdir()  # a folder that cannot be a bundle: one line, before exporting
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from sakura.editing import edit_request, model_for  # torch: sakura --help stays light
    from sakura.net.stores import open_store  # sakura --help stays light
    from sakura.runtime.backends import programs_beside  # sakura --help stays light
    from sakura.runtime.bundle import read_headers, write_bundle  # torch: sakura --help stays light

    packs = packs_or_default(packs)
    headers = read_headers(open_store(packs).source(), tpl.id)  # no packs: one line before the model loads
    model = model_for(tpl, model_path)
    first = tpl.eval_requests[0] if tpl.eval_requests else None  # geometry only: mask, task, text length
    req = edit_request(tpl, first, resolution=model.codec.resolution, ref_size=model.codec.ref_size)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), transient=as_json, disable=as_json) as bar:
        task = bar.add_task(f"bundle {tpl.id}", total=1)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(task, description=f"{tpl.id}: {what}", completed=done, total=total)

        with warnings.catch_warnings():  # torch.export's pytree deprecation notes, once per graph: not the user's
            warnings.simplefilter("ignore", FutureWarning)
            manifest = write_bundle(model, tpl, req, out, shard_size=shard_size, headers=headers,
                                    programs_dir=programs or programs_beside(packs), force=force, progress=progress)
    if as_json:
        typer.echo(json.dumps(manifest.to_dict(), indent=1))
        return
    for f in manifest.files:
        typer.echo(f"{f.bytes:>12,d}  {f.role:<8} {f.path}")
    typer.echo(f"{manifest.total_bytes:>12,d}  total    {len(manifest.files)} files + manifest.json in {out} "
               f"(ExecuTorch {manifest.executorch}, {manifest.model_id}, shard size {manifest.shard_size})")
