"""``sakura device``: run the device agent (wire :func:`device` into ``sakura/cli.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from device_bridge.protocol import DEFAULT_TIMEOUT_S
from sakura.places import PACKS_HELP, packs_or_default


def run_agent(listen: str = "127.0.0.1:8700", server: str | None = None, packs: str | Path | None = None, *,
              catalog: str | Path | None = None, link: str = "ws", timeout_s: float = DEFAULT_TIMEOUT_S,
              warmup: list[str] | tuple[str, ...] = (),
              calibration_file: str | Path | None = None, calibration_repeats: int = 1,
              log_level: str = "warning", executor: str = "eager", reconstructor: str = "torch",
              programs: str | Path | None = None, kernel_ns: str | None = None) -> None:
    """Start a :class:`DeviceAgent` (and a local template server over ``packs`` when no ``server``
    is given) and serve it until interrupted. ``kernel_ns``: the agent runs inside that sakura network namespace
    (its links shaped there by tc)."""
    from device_bridge.agent import DeviceAgent  # torch: sakura --help stays light
    from device_bridge.server import parse_listen, serve_agent  # fastapi/uvicorn: sakura --help stays light

    parse_listen(listen)  # fail before loading anything
    from sakura.catalog import CatalogError  # sakura --help stays light
    from sakura.net.kernel import KernelLinkError, attach  # sakura --help stays light
    from sakura.runtime.backends import BackendChoice  # sakura --help stays light
    from sakura.runtime.executors.errors import BackendUnavailable  # sakura --help stays light

    try:
        kernel = attach(kernel_ns) if kernel_ns else None
        choice = BackendChoice(executor, reconstructor, Path(programs) if programs else None)
        agent = DeviceAgent(server, catalog, packs, link=link, timeout_s=timeout_s,
                            calibration_file=calibration_file, calibration_repeats=calibration_repeats,
                            backends=choice, kernel=kernel)
    except (CatalogError, BackendUnavailable, KernelLinkError) as e:
        raise ValueError(str(e)) from None
    b = agent.backends_summary()
    print(f"device backends: {b['executor_title']} + {b['reconstructor_title']} on the {b['where']}"
          + (f" ({b['note']})" if b["note"] else ""), file=sys.stderr, flush=True)
    try:
        for tid in warmup:
            agent.warmup(tid)
        serve_agent(agent, listen, log_level=log_level)
    finally:
        agent.close()


def device(
    listen: str = typer.Option(
        "127.0.0.1:8700", "--listen", help="HOST:PORT for the agent's websocket (port 0 = any)."
    ),
    server: Optional[str] = typer.Option(None, "--server", help="Template server URL, or replicas URL,URL (tried in "
                                         "order when one dies); default: serve --packs here."),
    packs: Optional[Path] = typer.Option(None, "--packs", help=f"Packs folder served when no --server is given "
                                         f"({PACKS_HELP})."),
    catalog: Optional[Path] = typer.Option(
        None, "--catalog", help="Catalog manifest (TOML); default: the embedded one."
    ),
    link: str = typer.Option("ws", "--link", help="How the device fetches cache ranges: ws or http."),
    timeout: float = typer.Option(
        DEFAULT_TIMEOUT_S, "--timeout", help="Seconds a shard may be late before the edit fails."
    ),
    warmup: Optional[list[str]] = typer.Option(
        None, "--warmup", help="Template to load and calibrate before serving (repeatable)."
    ),
    calibration: Optional[Path] = typer.Option(
        None, "--calibration", help="JSON file keeping measured device compute across restarts."
    ),
    executor: str = typer.Option("eager", "--executor", help="eager | executorch (shard programs, XNNPACK) | auto "
                                 "(executorch where it runs here); Flux2 templates only, SD3 ones run eager."),
    reconstructor: str = typer.Option("torch", "--reconstructor", help="torch | opencl | auto (opencl where a "
                                      "device exists)."),
    programs: Optional[Path] = typer.Option(None, "--programs", help="Folder of exported shard programs (default: "
                                            "beside --packs, else ~/.cache/sakura/programs)."),
):
    """Run the device agent: edits arrive over a websocket (docs/device-protocol.md); the user's photo
    and prompt stay on this side; packs are streamed from the template server."""
    from sakura.process import sigterm_as_interrupt  # sakura --help stays light

    sigterm_as_interrupt()  # SIGTERM cleans up (the local template server) as Ctrl-C does
    try:
        run_agent(listen, server, None if server else packs_or_default(packs), catalog=catalog, link=link,
                  timeout_s=timeout, warmup=warmup or [], calibration_file=calibration, executor=executor,
                  reconstructor=reconstructor, programs=programs)
    except KeyboardInterrupt:
        pass
    except (ValueError, RuntimeError) as e:
        typer.echo(f"error: {' '.join(str(e).split())}", err=True)
        raise typer.Exit(2)
