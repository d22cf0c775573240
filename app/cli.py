"""``sakura demo``: everything on one machine — template server, device agent, app — until Ctrl-C.

Wire into ``sakura/cli.py`` with ``app.command()(demo)`` (imports stay inside the function, so
``sakura --help`` stays fast). Also runnable as ``python -m app``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path
from typing import Optional

import typer

ENCODINGS = ("sakura", "fp16", "intq", "cachegen")


def missing_packs(catalog, packs: Path, ids: list[str] | None = None) -> list:
    """Templates of ``catalog`` (or just ``ids``) lacking one of their four stored files in ``packs``."""
    from sakura.offline.builder import file_id

    chosen = [catalog.get(i) for i in ids] if ids else list(catalog)
    return [t for t in chosen if not all((packs / f"{file_id(t.id, e)}.pack").is_file() for e in ENCODINGS)]


def build_missing(catalog, packs: Path, ids: list[str] | None = None, echo=typer.echo) -> None:
    """Build the missing templates' packs, with a progress bar (first run only)."""
    todo = missing_packs(catalog, packs, ids)
    if not todo:
        return
    from sakura.offline.builder import build_with_progress

    echo(f"building packs for {len(todo)} template(s) into {packs} (first run only; a few minutes each)…")
    build_with_progress(todo, packs)


def connect_device(device: str, server_url: str):
    """A bridge to the device agent: ``subprocess`` / ``inprocess`` use our template server; a remote
    agent (``tcp://…``, ``ws://…``, ``adb``) already knows its own."""
    from device_bridge import connect

    if device in ("subprocess", "inprocess"):
        return connect(device, server_url=server_url)
    return connect(device)


def run_demo(host: str = "127.0.0.1", port: int = 7860, packs: Path = Path("packs"), device: str = "subprocess",
             templates: list[str] | None = None, data: Path = Path("runs/app"), echo=typer.echo) -> None:
    import uvicorn

    from sakura.catalog import load_catalog
    from sakura.server.run import start_server

    catalog = load_catalog()
    packs = Path(packs)
    data = Path(data)
    build_missing(catalog, packs, templates, echo)
    data.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        echo("starting the template server…")
        server = start_server(packs, process=True, access_log=data / "template-server-access.log")
        stack.callback(server.stop)
        echo(f"  template server: {server.url} (access log: {data / 'template-server-access.log'})")
        echo(f"starting the device agent ({device})…")
        bridge = connect_device(device, server.url)
        stack.callback(bridge.close)
        if getattr(bridge, "url", None):
            echo(f"  device agent: {bridge.url}")
        from app.server import create_app, url_of
        from sakura.server.run import bind_socket

        first = next((t.id for t in catalog if not missing_packs(catalog, packs, [t.id])), None)
        if first:  # load the model and calibrate compute while the browser opens
            threading.Thread(target=_quiet, args=(bridge.warmup, first), daemon=True).start()
        echo("starting the app…")
        app = create_app(bridge, data_dir=data, packs_dir=packs)
        try:
            sock = bind_socket(host, port)
        except OSError as e:
            raise typer.BadParameter(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port") from None
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=3)
        echo(f"\nSAKURA demo running at {url_of(host, sock)}  (Ctrl-C stops everything)\n")
        uvicorn.Server(config).run(sockets=[sock])
        echo("stopping… (the device agent finishes the step it is in: at most ~10 s)")
    echo("stopped.")


def _quiet(fn, *args) -> None:
    with contextlib.suppress(Exception):
        fn(*args)


def demo(
    host: str = typer.Option("127.0.0.1", "--host", help="Address the app listens on."),
    port: int = typer.Option(7860, "--port", help="Port of the app."),
    packs: Path = typer.Option(Path("packs"), "--packs", help="Pack folder (missing packs are built first)."),
    device: str = typer.Option("subprocess", "--device",
                               help="Device agent: subprocess, inprocess, tcp://HOST:PORT, ws://HOST:PORT or adb[:SERIAL]."),
    templates: Optional[str] = typer.Option(None, "--templates", help="Comma-separated template ids to build "
                                            "(default: every template in the catalog)."),
    data: Path = typer.Option(Path("runs/app"), "--data", help="App data: study votes, explorer cache, logs."),
):
    """Run the demo: template server (building missing packs first), a device agent, and the app."""
    ids = [t.strip() for t in templates.split(",") if t.strip()] if templates else None
    try:
        run_demo(host, port, packs, device, ids, data)
    except KeyboardInterrupt:
        typer.echo("\nstopped.")
    except typer.BadParameter:
        raise
    except Exception as e:  # noqa: BLE001 - one line, not a traceback
        from device_bridge import BridgeError

        from sakura.catalog import CatalogError

        if isinstance(e, (BridgeError, CatalogError, RuntimeError, OSError, ValueError)):
            typer.echo(f"error: {' '.join(str(e).split())}", err=True)
            raise typer.Exit(2)
        raise


def main() -> None:  # python -m app
    cli = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    cli.command()(demo)
    cli(args=sys.argv[1:], prog_name="python -m app")
