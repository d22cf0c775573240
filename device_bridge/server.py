"""The agent's websocket server (protocol v1, see ``docs/device-protocol.md``).

``GET /healthz``, ``GET /v1/templates``, ``POST /v1/warmup/{template_id}``, ``POST /v1/prefetch/{template_id}``
(body ``{"network": {...}}``, a job's network), ``WS /v1/edit``.
The agent runs each edit in a worker thread; its events are forwarded as JSON text frames as
they happen. A client that disconnects cancels its edit (the agent stops at its next cache
request) and the agent stays up. Nothing of a job is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import threading
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect, WebSocketState

from device_bridge.agent import DeviceAgent
from device_bridge.errors import EditFailed, EditRejected, one_line
from sakura.formats.container import loads_json
from sakura.net.listen import bind_socket, serve_in_thread, url_of
from sakura.server.limits import ServerLimits
from sakura.server.limits import uvicorn_config as bounded_config

READY_PREFIX = "sakura device agent listening on "
WS_MAX_BYTES = 64 * 1024 * 1024  # a 20 MB photo in base64 plus the job must fit one message
_DONE = object()
_NO_JOB = object()


def create_app(agent: DeviceAgent) -> FastAPI:
    app = FastAPI(title="SAKURA device agent", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return agent.health()

    @app.get("/v1/templates")
    def templates() -> list[dict[str, Any]]:
        return agent.templates()

    @app.post("/v1/warmup/{template_id}")
    def warmup(template_id: str):
        try:
            return agent.warmup(template_id)
        except EditRejected as e:
            return JSONResponse({"error": one_line(e), "code": e.code}, status_code=404)
        except EditFailed as e:
            return JSONResponse({"error": one_line(e), "code": e.code}, status_code=503)

    @app.post("/v1/prefetch/{template_id}")
    async def prefetch(template_id: str, request: Request):
        try:
            body = await request.json()
        except ValueError:
            body = {}
        try:
            network = body.get("network") if isinstance(body, dict) else None
            return await run_in_threadpool(agent.prefetch, template_id, network)
        except EditRejected as e:
            return JSONResponse({"error": one_line(e), "code": e.code}, status_code=400)
        except EditFailed as e:
            return JSONResponse({"error": one_line(e), "code": e.code}, status_code=503)

    @app.websocket("/v1/edit")
    async def edit(ws: WebSocket) -> None:
        await ws.accept()
        job = await _receive_job(ws)
        if job is not _NO_JOB:
            await _run_edit(ws, agent, job)

    return app


async def _receive_job(ws: WebSocket) -> Any:
    """The job of an edit connection (its first message, parsed), or ``_NO_JOB`` when there is none
    (the client left, or sent something that is not JSON: then it has been told so)."""
    try:
        first = await ws.receive()
    except (WebSocketDisconnect, RuntimeError):
        return _NO_JOB
    if first["type"] == "websocket.disconnect":
        return _NO_JOB
    text = first.get("text")
    if text is None:
        text = (first.get("bytes") or b"").decode("utf-8", "replace")
    try:
        return loads_json(text)  # a ValueError, never a RecursionError, for a too deeply nested job
    except ValueError as e:
        await _send_final(ws, {"type": "error", "code": "rejected",
                               "message": f"the job is not valid JSON ({one_line(e, 100)})"})
        return _NO_JOB


async def _run_edit(ws: WebSocket, agent: DeviceAgent, job: Any) -> None:
    """Run the edit in a worker thread and forward its events as they happen; a client that goes
    away cancels it."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    cancel = threading.Event()

    def on_event(ev: dict) -> None:
        loop.call_soon_threadsafe(events.put_nowait, ev)

    def work() -> None:
        try:
            agent.edit(job, on_event, cancel=cancel)
        except (EditRejected, EditFailed):
            pass  # already sent as an error event
        except BaseException:  # noqa: BLE001 - never kill the server
            on_event({"type": "error", "code": "internal", "message": "internal error in the device agent"})
        finally:
            loop.call_soon_threadsafe(events.put_nowait, _DONE)

    worker = loop.run_in_executor(None, work)
    watcher = asyncio.create_task(_cancel_on_disconnect(ws, cancel))
    try:
        while True:
            ev = await events.get()
            if ev is _DONE:
                break
            if cancel.is_set():
                continue  # drain: the client is gone
            try:
                await ws.send_text(json.dumps(ev, allow_nan=False))
            except Exception:  # noqa: BLE001 - client gone mid-edit
                cancel.set()
    finally:
        await worker
        watcher.cancel()
        if not cancel.is_set() and ws.application_state == WebSocketState.CONNECTED:
            try:
                await ws.close()
            except Exception:  # noqa: BLE001
                pass


async def _cancel_on_disconnect(ws: WebSocket, cancel: threading.Event) -> None:
    # The client sends nothing more: a receive returns only on disconnect.
    try:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                break
    except Exception:  # noqa: BLE001
        pass
    cancel.set()


async def _send_final(ws: WebSocket, ev: dict) -> None:
    try:
        await ws.send_text(json.dumps(ev))
        await ws.close()
    except Exception:  # noqa: BLE001
        pass


UNIX_PREFIX = "unix:"  # --listen unix:PATH: a Unix socket (crosses network namespaces: the kernel-shaped link's)


def parse_listen(listen: str) -> tuple[str, int]:
    """(host, port), or (``unix:PATH``, 0) for a Unix socket."""
    if listen.strip().startswith(UNIX_PREFIX):
        path = listen.strip()[len(UNIX_PREFIX):]
        if not path:
            raise ValueError(f"--listen unix:PATH needs a path, got {listen!r}")
        return UNIX_PREFIX + path, 0
    host, sep, port = listen.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT (e.g. 127.0.0.1:8700), got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def uvicorn_config(app: FastAPI, log_level: str = "warning") -> uvicorn.Config:
    """The template server's limits (connections, request-head deadline, head size), with room for a photo."""
    return bounded_config(app, log_level, ServerLimits(), ws_max_size=WS_MAX_BYTES, ws_per_message_deflate=False)


def serve_agent(agent: DeviceAgent, listen: str = "127.0.0.1:8700", log_level: str = "warning") -> None:
    """Serve until interrupted. Prints ``sakura device agent listening on ws://HOST:PORT`` once bound
    (port 0 = any free port)."""
    host, port = parse_listen(listen)
    path = host[len(UNIX_PREFIX):] if host.startswith(UNIX_PREFIX) else None
    if path is not None:
        sock = bind_unix(path)
        print(f"{READY_PREFIX}{host}", flush=True)
    else:
        sock = bind_socket(host, port)
        print(f"{READY_PREFIX}{url_of(host, sock, 'ws')}", flush=True)
    try:
        uvicorn.Server(uvicorn_config(create_app(agent), log_level)).run(sockets=[sock])
    finally:
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)


def bind_unix(path: str) -> socket.socket:
    """A listening Unix socket at ``path`` (a stale socket file there is replaced), readable by its owner only."""
    if os.path.exists(path) and stat.S_ISSOCK(os.stat(path).st_mode):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


class AgentServerThread:
    """The agent's server in a background thread of this process (tests, embedding in an app)."""

    def __init__(self, agent: DeviceAgent, host: str = "127.0.0.1", port: int = 0) -> None:
        sock = bind_socket(host, port)
        self.url = url_of(host, sock, 'ws')
        self._server, self._thread = serve_in_thread(uvicorn_config(create_app(agent)), sock,
                                                     name="device-agent-server",
                                                     what=f"device agent server on {self.url}")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(5)

    def __enter__(self) -> "AgentServerThread":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
