"""Listening sockets for the uvicorn servers (template server, device agent, app): bind, serve in a
thread, and the URL a bound socket answers on."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn (port 0 = a free port; the real one is then known at once)."""
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say so, and without
    # it Nagle + delayed ACK add ~40 ms to every keep-alive response (headers and body are 2 writes).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def url_of(host: str, sock: socket.socket, scheme: str = "http") -> str:
    """``scheme://host:port`` of a socket bound on ``host`` (IPv6 hosts in brackets)."""
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{sock.getsockname()[1]}"


def serve_in_thread(config: uvicorn.Config, sock: socket.socket, *, name: str, what: str,
                    timeout: float = 20.0) -> tuple[uvicorn.Server, threading.Thread]:
    """Run a uvicorn server on ``sock`` in a daemon thread; return once it accepts connections."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=name)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.01)
    return server, thread
