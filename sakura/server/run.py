"""Running the template server: blocking (``serve``), or in the background (``start_server``)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import uvicorn

from sakura.net.listen import bind_socket, serve_in_thread, url_of
from sakura.net.stores import is_store_url, open_store
from sakura.server.app import create_app
from sakura.server.limits import ServerLimits, uvicorn_config
from sakura.server.store_app import create_store_app

READY_PREFIX = "sakura server listening on "


def _config(app: object, log_level: str, limits: ServerLimits) -> uvicorn.Config:
    # Pack bytes do not compress; per-message deflate would only burn CPU on both ends.
    return uvicorn_config(app, log_level, limits, ws_per_message_deflate=False)


def serve(
    packs_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 8600,
    *,
    access_log: str | Path | logging.Handler | None = None,
    trace_dir: str | Path | None = None,
    log_level: str = "warning",
    limits: ServerLimits = ServerLimits(),
) -> None:
    """Serve ``packs_dir`` until interrupted (``sakura serve --packs DIR --port P`` calls this).

    Prints one line ``sakura server listening on http://HOST:PORT`` once bound (port 0 = any free).
    """
    app = app_for(packs_dir, access_log=access_log, trace_dir=trace_dir, limits=limits)
    sock = bind_socket(host, port)
    print(f"{READY_PREFIX}{url_of(host, sock)}", flush=True)
    uvicorn.Server(_config(app, log_level, limits)).run(sockets=[sock])


def app_for(packs: str | Path, **kw):
    """The server over a pack folder (it serves the bytes too), or over an object store URL such as
    ``s3://bucket/prefix`` (catalog, headers and presigned URLs; devices read the bytes from the store)."""
    if is_store_url(packs):
        return create_store_app(open_store(packs), access_log=kw.get("access_log"))
    return create_app(packs, **kw)


class RunningServer:
    """A server in a background thread or child process. Use as a context manager."""

    def __init__(self, url: str, *, server: uvicorn.Server | None = None,
                 thread: threading.Thread | None = None, proc: subprocess.Popen | None = None) -> None:
        self.url = url
        hostport = url.split("//", 1)[1]
        self.host, self.port = hostport.rsplit(":", 1)[0].strip("[]"), int(hostport.rsplit(":", 1)[1])
        self._server, self._thread, self._proc = server, thread, proc

    def stop(self, timeout: float = 5.0) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(
    packs_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    access_log: str | Path | None = None,
    trace_dir: str | Path | None = None,
    log_level: str = "warning",
    process: bool = False,
    timeout: float = 20.0,
    limits: ServerLimits = ServerLimits(),
) -> RunningServer:
    """Start a server and wait until it accepts connections (port 0 = a free port).

    ``process=True`` runs it as ``python -m sakura.server`` in a child process: use that for
    timing measurements, since a server thread shares the GIL with the client and adds
    milliseconds of jitter to every response.
    """
    if process:
        return _start_process(packs_dir, host, port, access_log, trace_dir, log_level, timeout, limits)
    app = app_for(packs_dir, access_log=access_log, trace_dir=trace_dir, limits=limits)
    sock = bind_socket(host, port)
    server, thread = serve_in_thread(_config(app, log_level, limits), sock, name="sakura-server",
                                     what=f"template server on {url_of(host, sock)}", timeout=timeout)
    return RunningServer(url_of(host, sock), server=server, thread=thread)


def server_command(packs_dir: str | Path, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                   limits: ServerLimits = ServerLimits()) -> list[str]:
    """The command line of a server process (``python -m sakura.server ...``)."""
    return [sys.executable, "-m", "sakura.server", "--packs", str(packs_dir), "--host", host, "--port", str(port),
            "--log-level", log_level, "--max-connections", str(limits.max_connections),
            "--header-timeout", str(limits.header_timeout_s), "--send-stall-timeout", str(limits.send_stall_s)]


def _start_process(packs_dir: str | Path, host: str, port: int, access_log: str | Path | None,
                   trace_dir: str | Path | None, log_level: str, timeout: float, limits: ServerLimits) -> RunningServer:
    cmd = server_command(packs_dir, host, port, log_level=log_level, limits=limits)
    cmd += ["--access-log", str(access_log)] if access_log else []
    cmd += ["--trace-dir", str(trace_dir)] if trace_dir else []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the ready line, or "" if the child died
    if not line.startswith(READY_PREFIX):
        proc.kill()
        raise RuntimeError(f"template server process did not start: {line.strip() or 'exit ' + str(proc.wait())}")
    url = line[len(READY_PREFIX):].strip()
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining: a full pipe blocks
    running = RunningServer(url, proc=proc)
    deadline = time.monotonic() + timeout
    while True:  # bound is not yet accepting: wait for uvicorn to start serving
        try:
            with socket.create_connection((running.host, running.port), timeout=0.5):
                return running
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                running.stop()
                raise RuntimeError(f"template server process at {url} never accepted connections") from None
            time.sleep(0.02)
