"""`sakura edit --stream`: one real streamed edit through a template server, with its timeline.

The edit is an :class:`~sakura.runtime.session.EditSession`, exactly as the device agent runs it:
headers through the server, calibrated compute, the regime scale, a link paced on this side along the
trace (a named profile or a local trace file: nothing about the trace reaches the server).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import typer
from PIL import Image
from rich.console import Console
from rich.table import Table

from sakura.catalog import load_catalog, load_image_spec
from sakura.formats import file_id
from sakura.net.failover import failover_for_servers
from sakura.net.kernel import KernelLinkError, check_link, entered, link_for_command
from sakura.net.stores import is_store_url
from sakura.net.traces import load_trace
from sakura.offline.builder import build_template, template_lock
from sakura.runtime.backends import NO_LOCAL, BackendChoice, programs_beside
from sakura.runtime.calibration import CalibrationStore
from sakura.runtime.session import DeviceRuntime, EditInput, Network
from sakura.server.run import start_server

DEFAULT_PACKS = Path("packs")


@contextlib.contextmanager
def server_for(packs: Path | str, url: str | None):
    """Use the server at ``url``, or run one on ``packs`` in its own process for the duration."""
    if url:
        yield url.rstrip("/")
        return
    with start_server(packs, port=0, process=True) as srv:
        yield srv.url


def ensure_packs(packs: Path | str, template, model_path=None) -> None:
    if is_store_url(packs):
        from sakura.net.stores import open_store  # only for an s3:// store
        from sakura.offline.publish import build_into_store  # only for an s3:// store

        store = open_store(packs, create=True)
        if store.published_key(template.id) is None:  # any published build will do, as for a folder
            typer.echo(f"building packs for {template.id} into {packs} (first time only)…", err=True)
            build_into_store(template, store, progress=lambda s: typer.echo(f"  {s}", err=True))
        return
    packs = Path(packs)
    with template_lock(packs, template.id):  # (another process may be building it: its pack is whole after)
        if not (packs / f"{file_id(template.id, 'sakura')}.pack").exists():
            typer.echo(f"building packs for {template.id} into {packs} (first time only)…", err=True)
            build_template(template, packs, model_path=model_path, progress=lambda s: typer.echo(f"  {s}", err=True))


def stream_edit(*, template: str, reference, prompt, out: Path, as_json: bool, catalog=None, policy: str = "sakura",
                trace: str = "5g", start: float = 0.0, trace_scale: float | None = None, regime: str = "paper",
                server: str | None = None, packs: Path = DEFAULT_PACKS, executor: str = "eager",
                reconstructor: str = "torch", calibration: Path | None = None, link: str = "paced") -> dict:
    check_link(link)
    if link == "kernel" and (server or is_store_url(packs)):
        raise KernelLinkError("--link kernel runs its own template server on a pack folder inside the namespace: "
                              "drop --server and use a folder for --packs")
    tpl = load_catalog(catalog).get(template)
    ref = load_image_spec(reference, Path.cwd()) if reference and tpl.task in ("fs", "vton") else None
    trace_obj = load_trace(trace)
    ensure_packs(packs, tpl)
    with link_for_command(link) as kernel, contextlib.ExitStack() as inside:
        if kernel is not None:  # the server (a child process) and this device's sockets: on the namespace's loopback
            inside.enter_context(entered(kernel.ns))
        network = Network(trace_obj, trace, start, trace_scale, regime, kernel=kernel)
        # packs from the server or its store; several servers (URL,URL): replicas, failed over in order
        with server_for(packs, server) as base, failover_for_servers(base.split(",")) as client:
            choice = BackendChoice(executor, reconstructor, programs_beside(packs))
            runtime = DeviceRuntime(client, calibration=CalibrationStore(calibration, repeats=2), backends=choice)
            runtime.backends.check()  # a missing backend fails here, in one line naming the fallback
            session = runtime.session(tpl, policy, network, on_status=status_printer())
            edit = session.edit(EditInput(prompt or "", ref), with_reference=False)
    plan = edit.plan
    report = {"template": tpl.id, "policy": policy, "trace": trace, "link": link, "start": session.start,
              "trace_scale": session.scale, "server": base, "masked_compute_s": plan["compute"]["masked_s"],
              "local_full_s": plan["compute"]["local_full_s"], "executor": session.backends.executor,
              "reconstructor": session.backends.reconstructor, "backends": session.backends.to_dict(),
              **edit.summary, "plan": plan, "timeline": edit.timeline.to_dict() if as_json else None}
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((np.clip(edit.image, 0, 1) * 255).round().astype("uint8")).save(out)
    report["out"] = str(out)
    if as_json:
        typer.echo(json.dumps(report, indent=1, default=float))
    else:
        _print_summary(report)
    return report


def status_printer():
    """The device's status lines (model loading, calibration, program export) on stderr as they happen."""
    console = Console(stderr=True)

    def say(stage: str, message: str) -> None:
        console.print(f"[dim]{stage}:[/] {message}")

    return say


def _print_summary(report: dict) -> None:
    console = Console()
    b = report["backends"]
    notes = [x for x in (b["note"], "" if b["local_fallback"] else NO_LOCAL) if x]
    console.print(f"backends: {b['executor_title']} + {b['reconstructor_title']} on the {b['where']}"
                  + (f" ({'; '.join(notes)})" if notes else ""))
    console.print(f"[bold]{report['policy']}[/] on {report['trace']} ({report['link']} link, "
                  f"×{report['trace_scale']:.3g}, start "
                  f"{report['start']} s): latency {report['latency_s']:.3f} s, stall {report.get('stall_s', 0):.3f} s, "
                  f"{report.get('bytes', 0) / 1e6:.2f} MB → {report['out']}")
    fired = report.get("fallbacks") or {}
    if fired:
        told = {"reuse": "shard(s) reused the previous step's K/V", "local": "switch to local generation (the link "
                "could not deliver the cache in time)"}
        console.print("fallbacks: " + "; ".join(f"{n} {told.get(k, k)}" for k, n in fired.items()))
    levels = report.get("levels") or []
    if levels:
        table = Table("fetch unit", "level")
        for i, lv in enumerate(levels):
            table.add_row(str(i), lv)
        console.print(table)
