"""Stateless template server: serves pack files by id, as HTTP byte ranges or over a websocket.

Files live in ``PACKDIR/<file_id>.pack`` (a file id names a template's pack, ``<template>``, or one
of its baseline encodings, ``<template>.fp16``, ...) and are opaque bytes here. The server keeps no
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
X-Sakura-Trace header values, status, body bytes) and per websocket event (a request's id, range
count, bytes asked and sent, rate, status). Nothing else from the request is recorded, and every
record is bounded (:mod:`sakura.server.access_log`).

Limits (:class:`~sakura.server.limits.ServerLimits`): connections, request-head deadline and size,
keep-alive, websocket message size and idle time, stalled readers, bytes per request (a multi-range
HTTP request asking for more than the file gets the file once; a websocket one is refused).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sakura.net.shaping import RateSpec, TraceShaper
from sakura.net.traces import TraceError
from sakura.server.access_log import AccessLog, make_logger
from sakura.server.limits import ServerLimits
from sakura.server.ranges import BadRange, Piece, RangeNotSatisfiable, multipart_pieces, parse_range
from sakura.server.store import PackStore, error_response, etag, file_headers
from sakura.server.streaming import TRACE_HEADER, LinkShapes, frames, paced
from sakura.server.ws import add_ws_route

MAX_HEADER_JSON = 64 * 1024 * 1024


def create_app(
    packs_dir: str | Path,
    *,
    access_log: str | Path | logging.Handler | None = None,
    trace_dir: str | Path | None = None,
    limits: ServerLimits = ServerLimits(),
) -> FastAPI:
    """The template server over ``packs_dir`` (see the module docstring)."""
    store = PackStore(packs_dir)
    links = LinkShapes(trace_dir)
    log = make_logger(access_log)
    app = FastAPI(title="SAKURA template server", docs_url=None, redoc_url=None, openapi_url=None)
    _add_catalog_routes(app, store)
    _add_range_route(app, store, links)
    _add_header_route(app, store, links)
    add_ws_route(app, store, links, log, limits)
    app.add_middleware(AccessLog, log=log, send_stall_s=limits.send_stall_s)
    return app


def _add_catalog_routes(app: FastAPI, store: PackStore) -> None:
    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/templates")
    async def templates() -> list[dict[str, Any]]:
        out = []
        for p in store.files():
            stat = p.stat()
            out.append({"id": p.stem, "size": stat.st_size, "etag": etag(stat), "mtime": stat.st_mtime})
        return out


def _http_shaper(links: LinkShapes, request: Request) -> TraceShaper | None | JSONResponse:
    text = request.headers.get(TRACE_HEADER) or request.query_params.get("trace")
    if not text:
        return None
    try:
        return links.shaper(RateSpec.parse(text))
    except TraceError as e:
        return error_response(400, f"bad X-Sakura-Trace: {e}")


def _file_and_shaper(store: PackStore, links: LinkShapes, file_id: str,
                     request: Request) -> tuple[Path, TraceShaper | None] | Response:
    """The stored file a request names and the link it asked for, or the error response."""
    path = store.path(file_id)
    if isinstance(path, Response):
        return path
    shaper = _http_shaper(links, request)
    if isinstance(shaper, Response):
        return shaper
    return path, shaper


def _add_range_route(app: FastAPI, store: PackStore, links: LinkShapes) -> None:
    @app.api_route("/packs/{file_id}", methods=["GET", "HEAD"])
    async def pack(file_id: str, request: Request) -> Response:
        found = _file_and_shaper(store, links, file_id, request)
        if isinstance(found, Response):
            return found
        path, shaper = found
        stat = path.stat()
        size, headers = stat.st_size, file_headers(stat)
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
            return error_response(400, f"bad Range header: {e}")
        except RangeNotSatisfiable:
            return error_response(416, f"range not satisfiable: {file_id!r} is {size} bytes",
                                  headers={**headers, "content-range": f"bytes */{size}"})
        if ranges and sum(b - a + 1 for a, b in ranges) > size:
            ranges = None  # overlapping ranges asking for more than the file (like nginx): send it once
        status, pieces, media = _body_of(ranges, size, headers)
        nbytes = sum(len(p) if isinstance(p, bytes) else p[1] for p in pieces)
        headers["content-length"] = str(nbytes)
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers, media_type=media)
        return StreamingResponse(_stream_file(path, stat, pieces, nbytes, shaper), status, headers, media_type=media)


def _body_of(ranges: list[tuple[int, int]] | None, size: int,
             headers: dict[str, str]) -> tuple[int, list[Piece], str]:
    """Status, body pieces and media type of a response with ``ranges`` (None = the whole file);
    sets Content-Range in ``headers`` for a single range."""
    if ranges and len(ranges) == 1:
        a, b = ranges[0]
        headers["content-range"] = f"bytes {a}-{b}/{size}"
        return 206, [(a, b - a + 1)], "application/octet-stream"
    if ranges:
        boundary = secrets.token_hex(12)
        pieces, _ = multipart_pieces(ranges, size, boundary)
        return 206, pieces, f"multipart/byteranges; boundary={boundary}"
    return 200, [(0, size)], "application/octet-stream"


async def _stream_file(
    path: Path, stat: os.stat_result, pieces: list[Piece], nbytes: int, shaper: TraceShaper | None
) -> AsyncIterator[bytes]:
    # Opened lazily, so a response that never starts leaks no descriptor.
    with open(path, "rb") as f:
        now = os.fstat(f.fileno())
        if (now.st_size, now.st_mtime_ns) != (stat.st_size, stat.st_mtime_ns):
            raise OSError(f"{path.name} changed while serving it")  # aborts: client sees a short body
        async for chunk in paced(frames(f.fileno(), pieces), shaper, nbytes):
            yield chunk


def _add_header_route(app: FastAPI, store: PackStore, links: LinkShapes) -> None:
    @app.get("/packs/{file_id}/header")
    async def header(file_id: str, request: Request) -> Response:
        found = _file_and_shaper(store, links, file_id, request)
        if isinstance(found, Response):
            return found
        path, shaper = found
        with open(path, "rb") as f:
            head = f.read(8)
            size = os.fstat(f.fileno()).st_size
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < n <= min(size - 8, MAX_HEADER_JSON):
                return error_response(422, f"pack {file_id!r} does not start with a u64 LE header length + JSON")
            body = f.read(n)
        try:
            json.loads(body)
        except ValueError:
            return error_response(422, f"pack {file_id!r} header is not valid JSON")
        if shaper is None:
            return Response(body, media_type="application/json")
        return StreamingResponse(paced(iter([body]), shaper, len(body)), media_type="application/json",
                                 headers={"content-length": str(len(body))})
