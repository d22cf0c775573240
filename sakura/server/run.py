"""Running the template server: blocking (``serve``) or in a background thread (``start_server``)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import uvicorn

from sakura.server.app import create_app


def _config(app: object, host: str, port: int, log_level: str) -> uvicorn.Config:
    # Pack bytes do not compress; per-message deflate would only burn CPU on both ends.
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=False,
        ws_per_message_deflate=False, ws_max_size=1 << 20, lifespan="off",
    )


def serve(
    packs_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 8600,
    *,
    access_log: str | Path | logging.Handler | None = None,
    trace_dir: str | Path | None = None,
    log_level: str = "warning",
) -> None:
    """Serve ``packs_dir`` until interrupted (``sakura serve --packs DIR --port P`` calls this)."""
    app = create_app(packs_dir, access_log=access_log, trace_dir=trace_dir)
    uvicorn.Server(_config(app, host, port, log_level)).run()


class RunningServer:
    """A server on a background thread; ``url`` is ``http://host:port``. Use as a context manager."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, host: str, port: int) -> None:
        self._server, self._thread = server, thread
        self.host, self.port = host, port
        self.url = f"http://{host}:{port}"

    def stop(self, timeout: float = 5.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(
    packs_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    access_log: str | Path | logging.Handler | None = None,
    trace_dir: str | Path | None = None,
    log_level: str = "warning",
    timeout: float = 10.0,
) -> RunningServer:
    """Start a server in a daemon thread and wait until it accepts connections (port 0 = free)."""
    app = create_app(packs_dir, access_log=access_log, trace_dir=trace_dir)
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say so, and without
    # it Nagle + delayed ACK add ~40 ms to every keep-alive response (headers and body are 2 writes).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))  # bound here so that the real port is known before uvicorn starts
    server = uvicorn.Server(_config(app, host, port, log_level))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="sakura-server")
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"template server did not start on {host}:{sock.getsockname()[1]}")
        time.sleep(0.01)
    return RunningServer(server, thread, host, sock.getsockname()[1])
