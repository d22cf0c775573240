"""``sakura study``: serve the user study on its own origin, prepare its pool, report, export, simulate.

Registered as the ``study`` command group through the ``sakura.commands`` entry point (``sakura`` imports
nothing from ``app``). Like ``app/cli.py`` for the demo, this is where the study meets the library: it opens
the pack store and the catalog, makes the quality explorer whose frontiers the pool is cut from, and hands
them to ``app/study_pool.py`` and ``app/study_web.py``. Light at import (every ``sakura`` process imports it).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path
from typing import Optional

import typer

from sakura.places import PACKS_HELP, packs_or_default

study_app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                        help="The user study: serve it (participants and operator apart), prepare, report, export.")

DATA_HELP = "The study's folder: votes (study.sqlite) and the pre-rendered pool."


def _store(data: Path, per_cell: int = 2, controls: int = 6):
    from app.study import Design, StudyStore  # sqlite only, but keep `sakura --help` minimal

    return StudyStore(data, Design(per_cell=per_cell, controls=controls))


def _preparer(store, packs: str, data: Path, templates: Optional[str], requests: int, budgets: int,
              max_fraction: float, echo, explorer_budgets: int = 9, baseline_levels: int | None = None):
    """The pool preparer over the pack store's frontiers (the quality explorer's, cached under ``data``)."""
    from app.study_pool import PoolConfig, PoolPreparer, TemplateInfo  # PIL: sakura --help stays light
    from sakura.catalog import load_catalog  # sakura --help stays light
    from sakura.eval.explorer import Explorer  # torch: sakura --help stays light
    from sakura.net.stores import open_store  # sakura --help stays light

    catalog = load_catalog()
    ids = [t.strip() for t in templates.split(",") if t.strip()] if templates else catalog.ids()
    chosen = [catalog.get(i) for i in ids]
    pack_store = open_store(packs, create=True)
    explorer = Explorer(pack_store, data / "explorer", budgets=explorer_budgets, baseline_levels=baseline_levels)
    infos = [TemplateInfo(t.id, workload_of(t.task, str(t.model)), len(t.eval_requests)) for t in chosen]
    others = list(catalog)

    def wrong_image(template_id: str, size: int):
        from PIL import Image

        mine = catalog.get(template_id)
        # another template's picture: of the same task when there is one (a face for a face), never this one
        pick = next((t for t in others if t.id != template_id and t.task == mine.task),
                    next(t for t in others if t.id != template_id))
        return Image.fromarray((pick.image(size) * 255).round().clip(0, 255).astype("uint8"))

    prep = PoolPreparer(store, explorer, infos, wrong_image,
                        PoolConfig(requests=requests, budgets=budgets, max_fraction=max_fraction), echo=echo)
    return prep, chosen, pack_store


def workload_of(task: str, model: str) -> str:
    """fs / vton / mb, and mb-sd for the SD3-class model (the paper's four workloads)."""
    return "mb-sd" if task == "mb" and "sd3" in model else task


@study_app.command("serve")
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address the participants' pages listen on (0.0.0.0: "
                             "every interface; only the study is served there)."),
    port: int = typer.Option(7870, "--port", min=0, max=65535, help="Port of the participants' pages."),
    operator_host: str = typer.Option("127.0.0.1", "--operator-host", help="Address of the operator's pages."),
    operator_port: int = typer.Option(7871, "--operator-port", min=0, max=65535,
                                      help="Port of the operator's pages (results, exports; token printed below)."),
    packs: Optional[str] = typer.Option(None, "--packs", help=f"Pack folder or s3://bucket/prefix ({PACKS_HELP})."),
    templates: Optional[str] = typer.Option(None, "--templates", help="Comma-separated template ids (default: all)."),
    data: Path = typer.Option(Path("runs/study"), "--data", help=DATA_HELP),
    requests: int = typer.Option(2, "--requests", min=1, help="Evaluation requests per template."),
    budgets: int = typer.Option(4, "--budgets", min=1, help="Budget levels per system."),
    max_fraction: float = typer.Option(0.35, "--max-fraction", min=0.001, max=1.0,
                                       help="Largest budget, as a fraction of the FP16 cache bytes."),
    per_cell: int = typer.Option(2, "--per-cell", min=1, help="Pairs per (system, budget) cell per participant."),
    controls: int = typer.Option(6, "--controls", min=0, help="Control pairs per participant."),
    build: bool = typer.Option(True, "--build/--no-build", help="Build missing packs behind the page."),
):
    """Serve the study: participants on --host:--port (nothing but the study), the operator on
    --operator-host:--operator-port behind a token; the pool is prepared behind the pages as packs are ready."""
    from app.cli import start_app  # uvicorn: sakura --help stays light
    from app.study_web import operator_app, participant_app  # fastapi: sakura --help stays light
    from sakura.process import sigterm_as_interrupt  # sakura --help stays light

    sigterm_as_interrupt()
    store = _store(data, per_cell, controls)
    token = secrets.token_urlsafe(24)
    preparer: list = []  # made once the pages are up: a pool prepared earlier is served before torch is imported
    with contextlib.ExitStack() as stack:
        try:
            who = stack.enter_context(start_app(participant_app(store), host, port))
            op = stack.enter_context(start_app(operator_app(store, token, lambda: preparer[0].status() if preparer
                                                            else None), operator_host, operator_port))
        except (OSError, RuntimeError) as e:
            typer.echo(f"error: cannot listen ({' '.join(str(e).split())}); pick other ports", err=True)
            raise typer.Exit(2)
        typer.echo(f"study for participants: {who.url}  (only the study is served there)")
        typer.echo(f"operator (keep private): {op.url}?token={token}")
        prep, chosen, pack_store = _preparer(store, packs_or_default(packs), data, templates, requests, budgets,
                                             max_fraction, typer.echo)
        preparer.append(prep)
        if build:
            from sakura.offline.build_queue import BuildQueue  # torch: imported once the pages are up

            builds = BuildQueue(chosen, pack_store)
            stack.callback(builds.stop)
            builds.start()
        stack.callback(prep.stop)
        prep.start()
        typer.echo(f"pool: {data / 'pool'} — prepared behind the pages as packs are ready (Ctrl-C stops)")
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            typer.echo("\nstopping…")


@study_app.command("prepare")
def prepare(
    packs: Optional[str] = typer.Option(None, "--packs", help=f"Pack folder or s3://bucket/prefix ({PACKS_HELP})."),
    templates: Optional[str] = typer.Option(None, "--templates", help="Comma-separated template ids (default: all)."),
    data: Path = typer.Option(Path("runs/study"), "--data", help=DATA_HELP),
    requests: int = typer.Option(2, "--requests", min=1),
    budgets: int = typer.Option(4, "--budgets", min=1),
    max_fraction: float = typer.Option(0.35, "--max-fraction", min=0.001, max=1.0),
):
    """Prepare the pool now for every template whose packs are published (without serving)."""
    store = _store(data)
    prep, _, _ = _preparer(store, packs_or_default(packs), data, templates, requests, budgets, max_fraction,
                           typer.echo)
    n = prep.prepare_once()
    st = prep.status()
    typer.echo(f"{n} template request(s) added; pool: {store.counts()}")
    if st.waiting:
        typer.echo(f"packs not published yet: {', '.join(st.waiting)}")
    for e in st.errors:
        typer.echo(f"error: {e}", err=True)


@study_app.command("report")
def report(
    data: Path = typer.Option(Path("runs/study"), "--data", help=DATA_HELP),
    out: Path = typer.Option(Path("runs/study/report"), "--out", help="Folder for the CSVs, the PNG and the JSON."),
    threshold: float = typer.Option(0.8, "--screen", min=0.0, max=1.0,
                                    help="Share of control pairs a participant must get right to be kept."),
):
    """Per system, the share judged similar (Wilson 95 %) against bytes and masked PSNR; screened participants."""
    from app.study_report import write_report  # matplotlib: sakura --help stays light

    if not (data / "study.sqlite").is_file():
        typer.echo(f"error: no study in {data} (no study.sqlite)", err=True)
        raise typer.Exit(2)
    rep = write_report(_store(data), out, threshold)
    kept = sum(s.kept for s in rep.screened)
    typer.echo(f"{kept} of {len(rep.screened)} participants kept ({rep.rule})")
    for r in rep.rows:
        if r.by == "budget":
            rate = "—" if r.rate is None else f"{100 * r.rate:5.1f} % [{100 * r.ci_low:.0f}–{100 * r.ci_high:.0f}]"
            typer.echo(f"  {r.system:9s} level {r.level}: {r.bytes_mean / 1e6:7.3f} MB ({100 * r.fraction_mean:5.1f} % "
                       f"of FP16), masked PSNR {r.psnr_masked_mean:5.1f} dB, similar {rate} (n={r.n})")
    typer.echo(f"wrote {out / 'study_report.csv'}, {out / 'participants.csv'}, {out / 'study_report.png'}")


@study_app.command("export")
def export(
    data: Path = typer.Option(Path("runs/study"), "--data", help=DATA_HELP),
    out: Path = typer.Option(Path("runs/study/votes.csv"), "--out", help="CSV file of every answer."),
):
    """Every answer with its pair's system, budget, bytes and quality (participants by label)."""
    from app.study_report import votes_csv  # matplotlib: sakura --help stays light

    if not (data / "study.sqlite").is_file():
        typer.echo(f"error: no study in {data} (no study.sqlite)", err=True)
        raise typer.Exit(2)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(votes_csv(_store(data)), encoding="utf-8")
    typer.echo(f"wrote {out}")


@study_app.command("simulate")
def simulate_cmd(
    data: Path = typer.Option(Path("runs/study"), "--data", help="The study whose pool the scripted participants see."),
    out: Path = typer.Option(Path("runs/study-sim"), "--out", help="A new study folder for the scripted answers."),
    attentive: int = typer.Option(24, "--attentive", min=0, help="Participants who answer by masked PSNR."),
    careless: int = typer.Option(6, "--careless", min=0, help="Participants who answer 'similar' to everything."),
    threshold: float = typer.Option(35.0, "--threshold", help="Attentive: similar when masked PSNR ≥ this (dB)."),
    per_cell: int = typer.Option(2, "--per-cell", min=1),
    controls: int = typer.Option(6, "--controls", min=0),
):
    """Check the plumbing: scripted participants answer over HTTP (a participants' server on loopback) into a
    copy of the pool, then the report is written to OUT/report."""
    from app.cli import start_app  # uvicorn: sakura --help stays light
    from app.study_report import write_report  # matplotlib: sakura --help stays light
    from app.study_sim import simulate  # httpx: sakura --help stays light
    from app.study_web import Limits, participant_app  # fastapi: sakura --help stays light

    src = _store(data)
    if (out / "study.sqlite").exists():
        typer.echo(f"error: {out} already holds a study; pick another --out", err=True)
        raise typer.Exit(2)
    sim = _store(out, per_cell, controls)
    if not sim.import_pool(src):
        typer.echo(f"error: {data} has no prepared pairs (run `sakura study prepare` or `serve` first)", err=True)
        raise typer.Exit(2)
    t0 = time.perf_counter()
    limits = Limits(votes_per_minute=10**9, min_vote_interval_s=0.0, consents_per_minute=10**9)
    with start_app(participant_app(sim, limits), "127.0.0.1", 0) as srv:
        n = simulate(srv.url.rstrip("/"), sim, attentive, careless, threshold)
    typer.echo(f"{attentive + careless} scripted participants gave {n} answers in {time.perf_counter() - t0:.1f} s")
    rep = write_report(sim, out / "report")
    kept = sum(s.kept for s in rep.screened)
    typer.echo(f"{kept} of {len(rep.screened)} kept ({rep.rule}); report in {out / 'report'}")
