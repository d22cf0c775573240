"""Stateless template server: serves pack files by id, as HTTP byte ranges or over a websocket.

Packs live in ``PACKDIR/<template_id>.pack`` and are opaque bytes here. The server keeps no
state between requests (only configuration), so any number can run behind a load balancer,
and a plain static server with Range support (nginx, S3) can stand in for the HTTP part.

Endpoints
---------
``GET /healthz``                    ``{"status": "ok"}``
``GET /templates``                  ``[{"id", "size", "etag", "mtime"}]`` for every pack
``GET|HEAD /packs/{id}``            the pack; ``Range: bytes=...`` -> 206 (one range) or 206
                                    ``multipart/byteranges`` (several), 416 if none satisfiable;
                                    ETag / Last-Modified / If-None-Match / If-Range
``GET /packs/{id}/header``          bytes [8, 8+len) of a pack that starts with a u64 LE ``len``
                                    then JSON (safetensors style), as application/json; 422 if not
``WS /ws/{id}``                     JSON text requests ``{"id": any, "ranges": [[offset, length], ...],
                                    "rate": {"trace": "5g", "start": 12, "scale": 1} | null}``.
                                    Reply: ``{"id", "nbytes"}``, binary frames carrying the ranges
                                    concatenated, then ``{"id", "done": true}``; errors as
                                    ``{"id", "error", "status"}`` (the connection stays open).
                                    ``rate`` (re)sets this connection's shaping; omitted = keep.

Link emulation on HTTP: header ``X-Sakura-Trace: 5g;start=12;scale=0.5`` (or query
``?trace=5g;start=12;scale=0.5``) paces that response body along the trace from ``start``.
Each response starts its own shaper, so the client advances ``start`` between requests
(see :class:`sakura.net.client.RangeClient`). Trace names: ``5g``, ``4g5g``, ``wifi``,
``lte``, ``fixed:<Mbps>``, or a file name inside ``trace_dir`` if one is configured --
never an arbitrary path from a client.

Access log: one JSON line per HTTP request (method, raw path + query, Range and
X-Sakura-Trace header values, status, body bytes) and per websocket event (the message text
exactly as received, status, bytes). Nothing else from the request is recorded, so the log
shows everything a client ever told the server.
"""

from __future__ import annotations

import email.utils
import functools
import json
import logging
import os
import re
import secrets
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.websockets import WebSocketDisconnect

from sakura.net.shaping import RateSpec, TraceShaper
from sakura.net.traces import SYNTHETIC_NAMES, Trace, TraceError, load_trace
from sakura.server.ranges import BadRange, Piece, RangeNotSatisfiable, multipart_pieces, parse_range

FRAME = 64 * 1024  # websocket frame / HTTP body chunk
READ_BLOCK = 1024 * 1024
MAX_HEADER_JSON = 64 * 1024 * 1024
TEMPLATE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
TRACE_HEADER = "x-sakura-trace"

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


class PackStore:
    """Maps template ids to ``<root>/<id>.pack``; ids are plain names, so no path can escape."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"packs directory {self.root} does not exist")

    def path(self, template_id: str) -> Path | JSONResponse:
        if not TEMPLATE_ID.match(template_id) or ".." in template_id:
            return _error(400, f"invalid template id {template_id[:80]!r}: use letters, digits, '.', '_', '-'")
        p = self.root / f"{template_id}.pack"
        if not p.is_file():
            return _error(404, f"unknown template {template_id!r}: no pack for it on this server")
        return p

    def ids(self) -> list[Path]:
        return sorted(p for p in self.root.glob("*.pack") if p.is_file() and TEMPLATE_ID.match(p.stem))


def _etag(st: os.stat_result) -> str:
    return f'"{st.st_size:x}-{st.st_mtime_ns:x}"'


def _file_headers(st: os.stat_result) -> dict[str, str]:
    return {
        "accept-ranges": "bytes",
        "etag": _etag(st),
        "last-modified": email.utils.formatdate(st.st_mtime, usegmt=True),
    }


def _frames(fd: int, pieces: list[Piece], frame: int = FRAME) -> Iterator[bytes]:
    """The concatenation of ``pieces`` (literal bytes or file spans) cut into ``frame``-sized blocks."""
    buf = bytearray()
    for p in pieces:
        if isinstance(p, bytes):
            buf += p
        else:
            off, n = p
            while n > 0:
                data = os.pread(fd, min(n, READ_BLOCK), off)
                if not data:
                    raise OSError(f"pack shrank while reading at offset {off}")
                buf += data
                off += len(data)
                n -= len(data)
                while len(buf) >= frame:
                    yield bytes(buf[:frame])
                    del buf[:frame]
        while len(buf) >= frame:
            yield bytes(buf[:frame])
            del buf[:frame]
    if buf:
        yield bytes(buf)


async def _paced(frames: Iterator[bytes], shaper: TraceShaper | None) -> AsyncIterator[bytes]:
    first = True
    for f in frames:
        if shaper is None:
            yield f
        else:
            async for chunk in shaper.asend_chunks(f, new_burst=first):
                yield bytes(chunk)
        first = False


class _AccessLog:
    """ASGI middleware: one JSON line per HTTP request with exactly what the server received."""

    def __init__(self, app: ASGIApp, log: Callable[[dict[str, Any]], None]) -> None:
        self.app, self.log = app, log

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path = scope.get("raw_path", scope["path"].encode())
        path = path.decode("latin-1") if isinstance(path, bytes) else path
        qs = scope.get("query_string", b"").decode("latin-1")
        rec: dict[str, Any] = {"method": scope["method"], "path": path + (f"?{qs}" if qs else "")}
        rec |= {"range": headers.get("range"), "trace": headers.get(TRACE_HEADER), "status": None, "bytes": 0}

        async def send_logged(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                rec["status"] = msg["status"]
            elif msg["type"] == "http.response.body":
                rec["bytes"] += len(msg.get("body", b""))
            await send(msg)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            self.log(rec)


def _make_logger(access_log: str | Path | logging.Handler | None) -> Callable[[dict[str, Any]], None]:
    logger = logging.getLogger(f"sakura.server.access.{secrets.token_hex(4)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    if access_log is None:
        logger.addHandler(logging.NullHandler())
    else:
        h = access_log if isinstance(access_log, logging.Handler) else logging.FileHandler(access_log)
        logger.addHandler(h)

    def log(rec: dict[str, Any]) -> None:
        logger.info(json.dumps({"t": round(time.time(), 6), **rec}, default=str))

    return log


def create_app(
    packs_dir: str | Path,
    *,
    access_log: str | Path | logging.Handler | None = None,
    trace_dir: str | Path | None = None,
) -> FastAPI:
    """The template server over ``packs_dir`` (see the module docstring)."""
    store = PackStore(packs_dir)
    log = _make_logger(access_log)
    app = FastAPI(title="SAKURA template server", docs_url=None, redoc_url=None, openapi_url=None)

    @functools.lru_cache(maxsize=64)  # configuration-derived, not per-request state
    def trace_for(name: str, scale: float) -> Trace:
        if name in SYNTHETIC_NAMES or name.startswith("fixed:"):
            return load_trace(name, scale)
        if trace_dir is not None and TEMPLATE_ID.match(name) and (Path(trace_dir) / name).is_file():
            return load_trace(Path(trace_dir) / name, scale)
        raise TraceError(f"unknown trace {name!r}: use {', '.join(SYNTHETIC_NAMES)} or fixed:<Mbps>")

    def shaper_for(spec: RateSpec | None) -> TraceShaper | None:
        return None if spec is None else TraceShaper(trace_for(spec.trace, spec.scale), spec.start)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/templates")
    async def templates() -> list[dict[str, Any]]:
        out = []
        for p in store.ids():
            st = p.stat()
            out.append({"id": p.stem, "size": st.st_size, "etag": _etag(st), "mtime": st.st_mtime})
        return out

    def http_shaper(request: Request) -> TraceShaper | None | JSONResponse:
        text = request.headers.get(TRACE_HEADER) or request.query_params.get("trace")
        if not text:
            return None
        try:
            return shaper_for(RateSpec.parse(text))
        except TraceError as e:
            return _error(400, f"bad X-Sakura-Trace: {e}")

    @app.api_route("/packs/{template_id}", methods=["GET", "HEAD"])
    async def pack(template_id: str, request: Request) -> Response:
        path = store.path(template_id)
        if isinstance(path, Response):
            return path
        shaper = http_shaper(request)
        if isinstance(shaper, Response):
            return shaper
        st = path.stat()
        size, headers = st.st_size, _file_headers(st)
        inm = request.headers.get("if-none-match")
        if inm and (inm.strip() == "*" or headers["etag"] in [t.strip() for t in inm.split(",")]):
            return Response(status_code=304, headers=headers)
        rng = request.headers.get("range")
        if_range = request.headers.get("if-range")
        if rng and if_range and if_range.strip() not in (headers["etag"], headers["last-modified"]):
            rng = None  # the client's copy is stale: send the whole current file
        try:
            ranges = parse_range(rng, size) if rng else None
        except BadRange as e:
            return _error(400, f"bad Range header: {e}")
        except RangeNotSatisfiable:
            return _error(416, f"range not satisfiable: {template_id!r} is {size} bytes",
                          headers={**headers, "content-range": f"bytes */{size}"})
        if ranges and sum(b - a + 1 for a, b in ranges) > size:
            ranges = None  # overlapping ranges asking for more than the file (like nginx): send it once
        status, pieces = 200, [(0, size)]
        media = "application/octet-stream"
        if ranges and len(ranges) == 1:
            (a, b), status = ranges[0], 206
            pieces, headers["content-range"] = [(a, b - a + 1)], f"bytes {a}-{b}/{size}"
        elif ranges:
            boundary, status = secrets.token_hex(12), 206
            pieces, _ = multipart_pieces(ranges, size, boundary)
            media = f"multipart/byteranges; boundary={boundary}"
        length = sum(len(p) if isinstance(p, bytes) else p[1] for p in pieces)
        headers["content-length"] = str(length)
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers, media_type=media)
        return StreamingResponse(_stream_file(path, st, pieces, shaper), status, headers, media_type=media)

    @app.get("/packs/{template_id}/header")
    async def header(template_id: str, request: Request) -> Response:
        path = store.path(template_id)
        if isinstance(path, Response):
            return path
        shaper = http_shaper(request)
        if isinstance(shaper, Response):
            return shaper
        with open(path, "rb") as f:
            head = f.read(8)
            size = os.fstat(f.fileno()).st_size
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < n <= min(size - 8, MAX_HEADER_JSON):
                return _error(422, f"pack {template_id!r} does not start with a u64 LE header length + JSON")
            body = f.read(n)
        try:
            json.loads(body)
        except ValueError:
            return _error(422, f"pack {template_id!r} header is not valid JSON")
        if shaper is None:
            return Response(body, media_type="application/json")
        return StreamingResponse(_paced(iter([body]), shaper), media_type="application/json",
                                 headers={"content-length": str(len(body))})

    @app.websocket("/ws/{template_id}")
    async def ws(websocket: WebSocket, template_id: str) -> None:
        path = store.path(template_id)
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
        shaper: TraceShaper | None = None
        try:
            while True:
                msg = await websocket.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                text = msg.get("text")
                rec: dict[str, Any] = {"method": "WS", "path": wpath, "message": text, "status": 200, "bytes": 0}
                if text is None:
                    rec["message"] = f"<binary frame, {len(msg.get('bytes') or b'')} bytes>"
                try:
                    req = _ws_request(text, _size(path))
                    if "rate" in req:
                        try:
                            shaper = shaper_for(req["rate"])
                        except TraceError as e:
                            raise _WsError(f"bad rate: {e}", 400, req["id"]) from None
                except _WsError as e:
                    rec["status"] = e.status
                    log(rec)
                    await websocket.send_json({"id": e.req_id, "error": str(e), "status": e.status})
                    continue
                try:
                    nbytes = sum(n for _, n in req["ranges"])
                    await websocket.send_json({"id": req["id"], "nbytes": nbytes})
                    with open(path, "rb") as f:
                        async for chunk in _paced(_frames(f.fileno(), req["ranges"]), shaper):
                            await websocket.send_bytes(chunk)
                            rec["bytes"] += len(chunk)
                    await websocket.send_json({"id": req["id"], "done": True})
                finally:
                    log(rec)
        except WebSocketDisconnect:
            pass
        log({"method": "WS", "path": wpath, "event": "close"})

    app.add_middleware(_AccessLog, log=log)
    return app


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        raise _WsError(f"pack {path.stem!r} is no longer available", 404) from None


async def _stream_file(
    path: Path, st: os.stat_result, pieces: list[Piece], shaper: TraceShaper | None
) -> AsyncIterator[bytes]:
    # Opened lazily, so a response that never starts leaks no descriptor.
    with open(path, "rb") as f:
        now = os.fstat(f.fileno())
        if (now.st_size, now.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            raise OSError(f"{path.name} changed while serving it")  # aborts: client sees a short body
        async for chunk in _paced(_frames(f.fileno(), pieces), shaper):
            yield chunk


class _WsError(Exception):
    def __init__(self, message: str, status: int, req_id: Any = None) -> None:
        super().__init__(message)
        self.status, self.req_id = status, req_id


def _ws_request(text: str | None, size: int) -> dict[str, Any]:
    """Validate one websocket request; ``rate`` is present only if the message set it."""
    if text is None:
        raise _WsError("send requests as JSON text frames", 400)
    try:
        obj = json.loads(text)
    except ValueError:
        raise _WsError("request is not valid JSON", 400) from None
    if not isinstance(obj, dict):
        raise _WsError('request must be a JSON object {"id", "ranges", "rate"?}', 400)
    rid = obj.get("id")
    extra = set(obj) - {"id", "ranges", "rate"}
    if extra:
        raise _WsError(f"unknown request fields: {sorted(extra)}", 400, rid)
    ranges = obj.get("ranges")
    ok = isinstance(ranges, list) and len(ranges) <= 65536 and all(
        isinstance(r, list) and len(r) == 2 and all(type(v) is int and v >= 0 for v in r) for r in ranges
    )
    if not ok:
        raise _WsError("ranges must be a list of [offset, length] non-negative integers", 400, rid)
    for off, n in ranges:
        if off + n > size:
            raise _WsError(f"range [{off}, {n}] ends past the pack end ({size} bytes)", 416, rid)
    out: dict[str, Any] = {"id": rid, "ranges": [tuple(r) for r in ranges]}
    if "rate" in obj:
        try:
            out["rate"] = None if obj["rate"] is None else RateSpec.from_json(obj["rate"])
        except TraceError as e:
            raise _WsError(f"bad rate: {e}", 400, rid) from None
    return out
