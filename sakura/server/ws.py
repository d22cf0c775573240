"""The template server's websocket stream mode: ``WS /ws/{file_id}`` (see :mod:`sakura.server.app`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI, WebSocket
from fastapi.responses import Response
from starlette.websockets import WebSocketDisconnect

from sakura.net.shaping import RateSpec, TraceShaper
from sakura.net.traces import TraceError
from sakura.server.access_log import LogFn
from sakura.server.store import PackStore
from sakura.server.streaming import LinkShapes, frames, paced


def add_ws_route(app: FastAPI, store: PackStore, links: LinkShapes, log: LogFn) -> None:
    @app.websocket("/ws/{file_id}")
    async def ws(websocket: WebSocket, file_id: str) -> None:
        path = store.path(file_id)
        wpath = websocket.scope.get("raw_path", b"").decode("latin-1") or websocket.url.path
        if isinstance(path, Response):
            log({"method": "WS", "path": wpath, "event": "connect", "status": path.status_code})
            if "websocket.http.response" in websocket.scope.get("extensions", {}):
                await websocket.send_denial_response(path)
            else:
                await websocket.close(code=4000 + path.status_code)
            return
        await websocket.accept()
        log({"method": "WS", "path": wpath, "event": "connect", "status": 101})
        try:
            await _serve_requests(websocket, path, wpath, links, log)
        except WebSocketDisconnect:
            pass
        log({"method": "WS", "path": wpath, "event": "close"})


async def _serve_requests(websocket: WebSocket, path: Path, wpath: str, links: LinkShapes, log: LogFn) -> None:
    """Answer requests in order until the client disconnects; a bad request gets an error message
    and the connection stays open."""
    shaper: TraceShaper | None = None
    while True:
        msg = await websocket.receive()
        if msg["type"] == "websocket.disconnect":
            return
        text = msg.get("text")
        rec: dict[str, Any] = {"method": "WS", "path": wpath, "message": text, "status": 200, "bytes": 0}
        if text is None:
            rec["message"] = f"<binary frame, {len(msg.get('bytes') or b'')} bytes>"
        try:
            req = parse_ws_request(text, _size(path))
            if "rate" in req:
                try:
                    shaper = links.shaper(req["rate"])
                except TraceError as e:
                    raise WsError(f"bad rate: {e}", 400, req["id"]) from None
        except WsError as e:
            rec["status"] = e.status
            log(rec)
            await websocket.send_json({"id": e.req_id, "error": str(e), "status": e.status})
            continue
        try:
            await _send_ranges(websocket, path, req, shaper, rec)
        finally:
            log(rec)


async def _send_ranges(websocket: WebSocket, path: Path, req: dict[str, Any], shaper: TraceShaper | None,
                       rec: dict[str, Any]) -> None:
    nbytes = sum(n for _, n in req["ranges"])
    await websocket.send_json({"id": req["id"], "nbytes": nbytes})
    with open(path, "rb") as f:
        async for chunk in paced(frames(f.fileno(), req["ranges"]), shaper):
            await websocket.send_bytes(chunk)
            rec["bytes"] += len(chunk)
    await websocket.send_json({"id": req["id"], "done": True})


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
    """Validate one websocket request; ``rate`` is present only if the message set it."""
    if text is None:
        raise WsError("send requests as JSON text frames", 400)
    try:
        obj = json.loads(text)
    except ValueError:
        raise WsError("request is not valid JSON", 400) from None
    if not isinstance(obj, dict):
        raise WsError('request must be a JSON object {"id", "ranges", "rate"?}', 400)
    rid = obj.get("id")
    extra = set(obj) - {"id", "ranges", "rate"}
    if extra:
        raise WsError(f"unknown request fields: {sorted(extra)}", 400, rid)
    ranges = obj.get("ranges")
    ok = isinstance(ranges, list) and len(ranges) <= 65536 and all(
        isinstance(r, list) and len(r) == 2 and all(type(v) is int and v >= 0 for v in r) for r in ranges
    )
    if not ok:
        raise WsError("ranges must be a list of [offset, length] non-negative integers", 400, rid)
    for off, n in ranges:
        if off + n > size:
            raise WsError(f"range [{off}, {n}] ends past the pack end ({size} bytes)", 416, rid)
    out: dict[str, Any] = {"id": rid, "ranges": [tuple(r) for r in ranges]}
    if "rate" in obj:
        try:
            out["rate"] = None if obj["rate"] is None else RateSpec.from_json(obj["rate"])
        except TraceError as e:
            raise WsError(f"bad rate: {e}", 400, rid) from None
    return out
