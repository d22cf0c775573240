"""The template server's websocket stream mode: ``WS /ws/{file_id}`` (see :mod:`sakura.server.app`).

Bounds (:class:`~sakura.server.limits.ServerLimits`): a message is at most ``ws_max_message`` bytes
(uvicorn) and nests at most a few hundred levels (pydantic-core's parser); a request names at most
:data:`~sakura.server.ranges.MAX_RANGES` ranges and at most the pack's size in bytes (as HTTP sends an
over-asking multi-range request once); a connection with no request for ``ws_idle_s``, a client that
reads nothing for ``send_stall_s`` or one that sent ``max_ws_errors`` bad requests is closed. The log
gets one bounded record per request (its id, range count, bytes, rate), never the message itself.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import FastAPI, WebSocket
from fastapi.responses import Response
from pydantic_core import from_json
from starlette.websockets import WebSocketDisconnect

from sakura.net.shaping import DeadlinePassed, RateSpec, TraceShaper
from sakura.net.traces import TraceError
from sakura.server.access_log import LogFn, clip
from sakura.server.limits import ServerLimits
from sakura.server.ranges import MAX_RANGES
from sakura.server.store import PackStore
from sakura.server.streaming import LinkShapes, frames, paced


def add_ws_route(app: FastAPI, store: PackStore, links: LinkShapes, log: LogFn, limits: ServerLimits) -> None:
    @app.websocket("/ws/{file_id}")
    async def ws(websocket: WebSocket, file_id: str) -> None:
        path = store.path(file_id)
        wpath = clip(websocket.scope.get("raw_path", b"").decode("latin-1") or websocket.url.path)
        if isinstance(path, Response):
            log({"method": "WS", "path": wpath, "event": "connect", "status": path.status_code})
            if "websocket.http.response" in websocket.scope.get("extensions", {}):
                await websocket.send_denial_response(path)
            else:
                await websocket.close(code=4000 + path.status_code)
            return
        await websocket.accept()
        log({"method": "WS", "path": wpath, "event": "connect", "status": 101})
        why = "closed"
        try:
            why = await _serve_requests(websocket, path, wpath, links, log, limits)
        except WebSocketDisconnect:
            pass
        except TimeoutError:
            why = "client stopped reading"
        if why != "closed":
            await _close(websocket, why)
        log({"method": "WS", "path": wpath, "event": "close", "reason": why})


async def _close(websocket: WebSocket, reason: str) -> None:
    try:
        await asyncio.wait_for(websocket.close(code=1008, reason=reason[:120]), 1.0)
    except Exception:  # noqa: BLE001 - the client is gone or not reading: nothing more to say
        pass


async def _serve_requests(websocket: WebSocket, path: Path, wpath: str, links: LinkShapes, log: LogFn,
                          limits: ServerLimits) -> str:
    """Answer requests in order until the client disconnects (``"closed"``) or a limit ends the
    connection (its reason); a bad request gets an error message and the connection stays open."""
    shaper: TraceShaper | None = None
    errors = 0
    while True:
        try:
            msg = await asyncio.wait_for(websocket.receive(), limits.ws_idle_s)
        except TimeoutError:
            return f"no request for {limits.ws_idle_s:g} s"
        if msg["type"] == "websocket.disconnect":
            return "closed"
        text = msg.get("text")
        rec: dict[str, Any] = {"method": "WS", "path": wpath, "event": "request", "size": len(text or msg.get("bytes")
                                                                                              or b""), "status": 200,
                               "bytes": 0}
        try:
            req = parse_ws_request(text, _size(path))
            rec |= {"id": clip(repr(req["id"]), 64), "ranges": len(req["ranges"]), "nbytes": req["nbytes"]}
            if "rate" in req:
                rec["rate"] = clip(repr(req["rate"]), 200)
                try:
                    shaper = links.shaper(req["rate"])
                except TraceError as e:
                    raise WsError(f"bad rate: {e}", 400, req["id"]) from None
        except WsError as e:
            rec |= {"status": e.status, "error": clip(str(e), 200)}
            log(rec)
            await _send(websocket, limits, {"id": e.req_id, "error": str(e), "status": e.status})
            errors += 1
            if errors >= limits.max_ws_errors:
                return f"{errors} bad requests"
            continue
        try:
            await _send_ranges(websocket, path, req, shaper, rec, limits)
        finally:
            log(rec)


async def _send(websocket: WebSocket, limits: ServerLimits, message: dict | bytes) -> None:
    """Send one message; a client that has not read for ``send_stall_s`` raises TimeoutError."""
    send = websocket.send_bytes(message) if isinstance(message, bytes) else websocket.send_json(message)
    await asyncio.wait_for(send, limits.send_stall_s)


async def _send_ranges(websocket: WebSocket, path: Path, req: dict[str, Any], shaper: TraceShaper | None,
                       rec: dict[str, Any], limits: ServerLimits) -> None:
    await _send(websocket, limits, {"id": req["id"], "nbytes": req["nbytes"]})
    with open(path, "rb") as f:
        try:
            async for chunk in paced(frames(f.fileno(), req["ranges"]), shaper, req["nbytes"]):
                await _send(websocket, limits, chunk)
                rec["bytes"] += len(chunk)
        except DeadlinePassed as e:
            rec |= {"status": 504, "error": str(e)}
            await _send(websocket, limits, {"id": req["id"], "error": str(e), "status": 504})
            return
    await _send(websocket, limits, {"id": req["id"], "done": True})


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        raise WsError(f"pack {path.stem!r} is no longer available", 404) from None


class WsError(Exception):
    def __init__(self, message: str, status: int, req_id: Any = None) -> None:
        super().__init__(message)
        self.status, self.req_id = status, req_id


def parse_ws_request(text: str | None, size: int) -> dict[str, Any]:
    """Validate one websocket request (``nbytes``: the bytes it asks for); ``rate`` is present only
    if the message set it."""
    if text is None:
        raise WsError("send requests as JSON text frames", 400)
    try:
        obj = from_json(text)
    except ValueError as e:  # malformed, or nested deeper than the parser's limit
        raise WsError(f"request is not valid JSON ({clip(str(e), 80)})", 400) from None
    if not isinstance(obj, dict):
        raise WsError('request must be a JSON object {"id", "ranges", "rate"?}', 400)
    rid = obj.get("id")
    if not (rid is None or isinstance(rid, (int, float, str)) and len(str(rid)) <= 256):
        raise WsError("id must be a number or a string of at most 256 characters", 400)
    extra = set(obj) - {"id", "ranges", "rate"}
    if extra:
        raise WsError(f"unknown request fields: {clip(repr(sorted(extra)), 100)}", 400, rid)
    ranges = obj.get("ranges")
    if isinstance(ranges, list) and len(ranges) > MAX_RANGES:
        raise WsError(f"too many ranges ({len(ranges)}; at most {MAX_RANGES} per request)", 413, rid)
    ok = isinstance(ranges, list) and all(
        isinstance(r, list) and len(r) == 2 and all(type(v) is int and v >= 0 for v in r) for r in ranges
    )
    if not ok:
        raise WsError("ranges must be a list of [offset, length] non-negative integers", 400, rid)
    for off, n in ranges:
        if off + n > size:
            raise WsError(f"range [{off}, {n}] ends past the pack end ({size} bytes)", 416, rid)
    nbytes = sum(n for _, n in ranges)
    if nbytes > size:
        raise WsError(f"the ranges add up to {nbytes} bytes, more than the whole pack ({size} bytes): "
                      "ask for each byte once", 413, rid)
    out: dict[str, Any] = {"id": rid, "ranges": [tuple(r) for r in ranges], "nbytes": nbytes}
    if "rate" in obj:
        try:
            out["rate"] = None if obj["rate"] is None else RateSpec.from_json(obj["rate"])
        except TraceError as e:
            raise WsError(f"bad rate: {e}", 400, rid) from None
    return out
