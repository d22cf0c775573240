"""``sakura demo``: everything on one machine — template server, device agent, app — until Ctrl-C.

This is the app's start-up, and the one module of ``app/`` that imports ``sakura``: it starts the
template server on the pack store (a folder, or ``s3://bucket/prefix``: then the server hands out
presigned URLs and the device reads pack bytes straight from the store), builds missing packs into
that store in the background (a template the user picks goes first), connects to the device agent
through ``device_bridge`` and hands the app the quality explorer. Registered as the ``demo`` command
through the ``sakura.commands`` entry point; also runnable as ``python -m app``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from app.calibrations import Calibrations
from sakura.places import PACKS_HELP, packs_or_default

# `sakura` registers the `demo` command from this module in every process (`sakura --help` included): what the
# demo runs on (gradio, the device agent's torch and diffusers, uvicorn) is imported where it is used.
if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from sakura.offline.build_queue import BuildQueue


class RunningApp:
    def __init__(self, server: uvicorn.Server, thread: threading.Thread, url: str):
        self.server, self.thread, self.url = server, thread, url

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> "RunningApp":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_app(app: FastAPI, host: str = "127.0.0.1", port: int = 0, timeout: float = 60.0) -> RunningApp:
    """Serve ``app`` from a background thread (tests, embedding); port 0 = a free port."""
    import uvicorn

    from sakura.net.listen import bind_socket, serve_in_thread, url_of  # uvicorn: sakura --help stays light

    sock = bind_socket(host, port)
    server, thread = serve_in_thread(uvicorn.Config(app, log_level="warning", lifespan="on"), sock, name="sakura-app",
                                     what=f"the app on {url_of(host, sock)}", timeout=timeout)
    return RunningApp(server, thread, url_of(host, sock) + "/")


# Masked runs per template when the demo's agent calibrates (local runs: one fewer): two or more local runs
# let the agent apply the bench's spread rule.
CALIBRATION_REPEATS = 3


def connect_device(device: str, server_url: str, agent_port: int = 0, executor: str = "auto",
                   reconstructor: str = "auto", programs: Path | None = None,
                   calibration_file: str | Path | None = None, kernel_ns: str | None = None,
                   listen: str | None = None):
    """A bridge to the device agent: ``subprocess`` / ``inprocess`` use our template server, run on the
    given backends (``auto``: the phone-style stack where it works here) and keep their calibration in
    ``calibration_file``; a remote agent (``tcp://…``, ``ws://…``, ``adb``) already knows its own server,
    backends and calibration. ``kernel_ns``: a subprocess agent runs inside that network namespace, reached at
    ``listen`` (a Unix socket)."""
    from device_bridge import connect  # sakura --help stays light

    calibration = {"calibration_file": calibration_file, "calibration_repeats": CALIBRATION_REPEATS}
    if device == "subprocess":
        return connect(device, server_url=server_url, port=agent_port, executor=executor,
                       reconstructor=reconstructor, programs=programs, kernel_ns=kernel_ns, listen=listen,
                       **calibration)
    if device == "inprocess":
        from sakura.runtime.backends import BackendChoice  # sakura --help stays light

        return connect(device, server_url=server_url, backends=BackendChoice(executor, reconstructor, programs),
                       **calibration)
    return connect(device)


def describe_backends(bridge) -> str:
    """One line on what the device's edits run on (from its health), for the demo's start-up."""
    try:
        b = bridge.health().get("backends") or {}
    except Exception:  # noqa: BLE001 - the page says so too
        return "device backends: unknown (the agent did not answer)"
    if not b:
        return "device backends: not reported by this agent"
    phone = b.get("executor") == "executorch" and b.get("reconstructor") == "opencl"
    why = ("the phone-style stack" if phone else "eager/torch") + (f"; {b['note']}" if b.get("note") else "")
    return (f"device backends: {b.get('executor_title')} + {b.get('reconstructor_title')} on the "
            f"{b.get('where', 'host CPU')} (asked {b.get('asked')}: {why})")


def run_demo(host: str = "127.0.0.1", port: int = 7860, packs: str | Path = "packs", device: str = "subprocess",
             templates: list[str] | None = None, data: Path = Path("runs/app"), echo=typer.echo,
             server_port: int = 0, agent_port: int = 0, executor: str = "auto", reconstructor: str = "auto",
             link: str = "paced") -> None:
    """``server_port`` / ``agent_port``: where the template server and a subprocess agent listen on 127.0.0.1
    (0: any free port). ``link`` ``kernel``: the template server and the agent run inside a network namespace whose
    loopback tc shapes along each edit's trace; the app reaches the agent through a Unix socket (not shaped)."""
    import uvicorn

    from app.server import create_app  # gradio: sakura --help stays light
    from sakura.catalog import load_catalog  # sakura --help stays light
    from sakura.eval.explorer import Explorer  # torch: sakura --help stays light
    from sakura.net.listen import bind_socket, url_of  # uvicorn: sakura --help stays light
    from sakura.net.stores import is_store_url, open_store  # sakura --help stays light
    from sakura.offline.build_queue import BuildQueue  # torch: sakura --help stays light
    from sakura.runtime.calibration import default_path  # torch: sakura --help stays light
    from sakura.server.run import start_server  # fastapi/uvicorn: sakura --help stays light

    catalog = load_catalog()
    data = Path(data)
    data.mkdir(parents=True, exist_ok=True)
    chosen = [catalog.get(i) for i in templates] if templates else list(catalog)
    if is_store_url(packs):
        echo(f"opening the pack store {packs}…")
    store = open_store(packs, create=True)  # a folder is made; a bad URL or credentials fail here, in one line
    from sakura.net.kernel import KernelLinkError, check_link, entered, link_for_command  # sakura --help stays light

    check_link(link)
    if link == "kernel" and (device != "subprocess" or is_store_url(packs)):
        raise KernelLinkError("--link kernel runs the template server and a subprocess device agent inside a network "
                              "namespace: use --device subprocess and a pack folder")
    builds = BuildQueue(chosen, store)  # started once the page is served: the user never waits for them
    with contextlib.ExitStack() as stack:
        kernel = stack.enter_context(link_for_command(link))
        stack.callback(builds.stop)
        echo("starting the template server…")
        with contextlib.ExitStack() as inside:  # (on a kernel link: in the namespace, on its shaped loopback)
            if kernel is not None:
                inside.enter_context(entered(kernel.ns))
                echo(f"  kernel-shaped link: network namespace {kernel.ns.name}, loopback MTU 1500, tc tbf along "
                     "each edit's trace")
            server = start_server(store.url, port=server_port, process=True,
                                  access_log=data / "template-server-access.log")
        stack.callback(server.stop)
        where = "pack bytes from the store, by presigned URL" if is_store_url(store.url) else "pack bytes too"
        echo(f"  template server: {server.url} ({where}; access log: {data / 'template-server-access.log'})")
        echo(f"starting the device agent ({device})…")
        from sakura.runtime.backends import programs_beside  # sakura --help stays light

        bridge = connect_device(device, server.url, agent_port, executor, reconstructor,
                                programs_beside(None if is_store_url(store.url) else packs), default_path(),
                                kernel_ns=kernel.ns.name if kernel is not None else None,
                                listen=f"unix:{(data / 'agent.sock').resolve()}" if kernel is not None else None)
        stack.callback(bridge.close)
        calibrations = Calibrations(bridge, [t.id for t in chosen], builds)  # started with the builds
        stack.callback(calibrations.stop)
        if getattr(bridge, "url", None):
            echo(f"  device agent: {bridge.url}")
        echo(f"  {describe_backends(bridge)}")
        echo("starting the app…")
        app = create_app(bridge, data_dir=data, explorer=Explorer(store, data / "explorer"), builds=builds,
                         calibrations=calibrations, offered=[t.id for t in chosen] if templates else None)
        try:
            sock = bind_socket(host, port)
        except OSError as e:
            raise typer.BadParameter(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port") from None
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=3))
        threading.Thread(target=_after_start, args=(server, builds, calibrations, echo), daemon=True).start()
        echo(f"\nSAKURA demo running at {url_of(host, sock)}/  (Ctrl-C stops everything)")
        server.run(sockets=[sock])
        echo("stopping… (the device agent finishes the step it is in: at most ~10 s)")
    echo("stopped.")


def _after_start(server: uvicorn.Server, builds: BuildQueue, calibrations: Calibrations, echo) -> None:
    """Once the page is served (the 2 cores are its until then): build the missing packs behind it, and
    calibrate the device's compute for each template whose packs are ready (builds hold meanwhile)."""
    while not server.started and not server.should_exit:
        time.sleep(0.1)
    builds.start()
    calibrations.start()
    summary = builds.summary()
    if not summary["done"]:
        echo(f"  packs: {summary['ready']}/{summary['total']} templates ready; the rest build in the background "
             "(progress on the page)")


def demo(
    host: str = typer.Option("127.0.0.1", "--host", help="Address the app listens on."),
    port: int = typer.Option(7860, "--port", help="Port of the app."),
    packs: Optional[str] = typer.Option(
        None,
        "--packs",
        help="Pack folder, or s3://bucket/prefix (endpoint and credentials "
        "from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); missing packs are "
        f"built into it in the background ({PACKS_HELP}).",
    ),
    device: str = typer.Option(
        "subprocess",
        "--device",
        help="Device agent: subprocess, inprocess, tcp://HOST:PORT, ws://HOST:PORT or adb[:SERIAL].",
    ),
    templates: Optional[str] = typer.Option(
        None, "--templates", help="Comma-separated template ids to offer (default: every template in the catalog)."
    ),
    data: Path = typer.Option(Path("runs/app"), "--data", help="App data: explorer cache, logs."),
    server_port: int = typer.Option(0, "--server-port", min=0, max=65535,
                                    help="Port of the template server on 127.0.0.1 (0: any free port)."),
    agent_port: int = typer.Option(0, "--agent-port", min=0, max=65535,
                                   help="Port of the subprocess device agent on 127.0.0.1 (0: any free port)."),
    executor: str = typer.Option("auto", "--executor", help="The device's executor: eager | executorch | auto "
                                 "(default: ExecuTorch shard programs where they run here, else eager)."),
    reconstructor: str = typer.Option("auto", "--reconstructor", help="The device's rebuild: torch | opencl | auto "
                                      "(default: OpenCL where a device exists, else torch)."),
    link: str = typer.Option("paced", "--link", help="paced (the device paces along the trace) or kernel (server "
                             "and agent in a network namespace whose loopback tc shapes; root)."),
):
    """Run the demo: template server, a device agent, and the app (missing packs build behind it)."""
    from device_bridge import BridgeError  # sakura --help stays light
    from sakura.catalog import CatalogError  # sakura --help stays light
    from sakura.process import sigterm_as_interrupt  # sakura --help stays light

    sigterm_as_interrupt()  # SIGTERM stops the server, agent and builds as Ctrl-C does
    from sakura.runtime.backends import BackendChoice  # sakura --help stays light

    try:
        BackendChoice(executor, reconstructor)  # unknown names: one line before anything starts
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    ids = [t.strip() for t in templates.split(",") if t.strip()] if templates else None
    from device_bridge import preflight  # sakura --help stays light

    try:
        preflight(device)  # adb missing, no phone attached: one line before anything starts
    except BridgeError as e:
        typer.echo(f"error: {' '.join(str(e).split())}", err=True)
        raise typer.Exit(2)
    try:
        run_demo(host, port, packs_or_default(packs), device, ids, data, server_port=server_port,
                 agent_port=agent_port, executor=executor, reconstructor=reconstructor, link=link)
    except KeyboardInterrupt:
        typer.echo("\nstopped.")
    except typer.BadParameter:
        raise
    except (BridgeError, CatalogError, RuntimeError, OSError, ValueError) as e:  # (KernelLinkError: a RuntimeError)
        typer.echo(f"error: {' '.join(str(e).split())}", err=True)
        raise typer.Exit(2)


def main() -> None:  # python -m app
    cli = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    cli.command()(demo)
    cli(args=sys.argv[1:], prog_name="python -m app")
