"""The template server in store mode (``sakura serve --packs s3://bucket/prefix``): catalog, headers and
short-lived presigned URLs; pack bytes go from the object store to the device, never through here.

It keeps no state but a small cache of immutable headers, so any number of replicas can run behind a load
balancer. Endpoints:

``GET /healthz``             ``{"status": "ok", "pack_bytes": "store", "store": URL}``
``GET /templates``           ``[{"id", "size", "template", "build_key"}]``, one per published file
``GET /packs/{id}/header``   the file's JSON header (bytes [8, 8+len)), as application/json
``GET /packs/{id}/url``      ``{"url", "size", "sha256", "expires_s"}``: a presigned GET of the object
``GET /packs/{id}``          307 to the presigned URL (for plain HTTP clients that follow redirects)
"""

from __future__ import annotations

import struct

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response

from sakura.net.client import MAX_HEADER_BYTES, FetchError
from sakura.net.stores import Store, StoreError
from sakura.server.access_log import AccessLog, make_logger
from sakura.server.store import PLAIN_NAME, error_response

HEADER_CACHE = 256  # headers kept (tens of kB each)


def create_store_app(store: Store, *, presign_s: int = 300, access_log=None) -> FastAPI:
    """The server over an object store (one that can ``locate`` and ``presign``: :class:`~sakura.net.s3store.S3Store`);
    ``access_log``: a file (or logging handler) for the JSON-lines access log, as the folder server's."""
    app = FastAPI(title="SAKURA template server (object store)", docs_url=None, redoc_url=None, openapi_url=None)
    headers: dict[str, bytes] = {}  # by object sha: immutable, so never stale

    def failure(e: Exception) -> Response:
        if isinstance(e, FetchError):
            return error_response(e.status if 400 <= e.status < 600 else 502, str(e).split(": ", 1)[-1])
        return error_response(503, f"object store: {e}")

    def checked(fid: str) -> Response | None:
        if not PLAIN_NAME.match(fid) or ".." in fid:
            return error_response(400, f"invalid template id {fid[:80]!r}: use letters, digits, '.', '_', '-'")
        return None

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok", "pack_bytes": "store", "store": store.url}

    @app.get("/templates")
    def templates():
        try:
            published = store.templates()
        except (StoreError, FetchError) as e:
            return failure(e)
        return [{"id": fid, "size": size, "template": tid, "build_key": info["build_key"]}
                for tid, info in sorted(published.items()) for fid, size in sorted(info["files"].items())]

    @app.get("/packs/{fid}/url")
    def pack_url(fid: str):
        if (bad := checked(fid)) is not None:
            return bad
        try:
            return store.presign(fid, presign_s)
        except (StoreError, FetchError) as e:
            return failure(e)

    @app.get("/packs/{fid}/header")
    def pack_header(fid: str):
        if (bad := checked(fid)) is not None:
            return bad
        try:
            sha = store.locate(fid)["sha256"]
            body = headers.get(sha)
            if body is None:
                body = _header_json(store, fid)
                if len(headers) >= HEADER_CACHE:
                    headers.pop(next(iter(headers)))
                headers[sha] = body
        except (StoreError, FetchError) as e:
            return failure(e)
        return Response(
            body, media_type="application/json", headers={"cache-control": "public, max-age=31536000, immutable"}
        )

    @app.get("/packs/{fid}")
    def pack_redirect(fid: str):
        if (bad := checked(fid)) is not None:
            return bad
        try:
            return RedirectResponse(store.presign(fid, presign_s)["url"], status_code=307)
        except (StoreError, FetchError) as e:
            return failure(e)

    app.add_middleware(AccessLog, log=make_logger(access_log))
    return app


def _header_json(store: Store, fid: str) -> bytes:
    (n,) = struct.unpack("<Q", store.read(fid, 0, 8))
    if not 0 < n <= MAX_HEADER_BYTES:
        raise FetchError(422, f"{fid} is not a SAKURA container (header length {n})")
    return store.read(fid, 8, n)
