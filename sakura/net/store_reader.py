"""The device reading pack bytes straight from an object store: one HTTP Range request per range.

Many CDNs and S3 itself reject multi-range requests, so unlike :class:`~sakura.net.client.RangeClient`
these readers never send ``Range: bytes=a-b,c-d``. Ranges that touch or overlap are coalesced into one
request first; the rest go one request each, over a few keep-alive connections at once.

* :class:`PresignedRangeSource` — reads presigned URLs; ``locate(file id)`` says where each file is
  (``{"url", "size"}``): the store itself (with credentials) or a template server.
* :class:`ServerStoreClient` — asks a template server in store mode (``sakura serve --packs s3://...``)
  for the catalog, headers and presigned URLs, and reads the bytes from the store.

Both have the link interface the device runtime reads through (``header_bytes``, ``fetch_timed``), so
:class:`~sakura.net.paced.PacedLink` paces them along a trace like any other link.
"""

from __future__ import annotations

import functools
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import httpx

from sakura.net.byteranges import (
    FetchError,
    Transfer,
    check_header_length,
    check_ranges,
    header_bytes_via_ranges,
    merged_spans,
    raise_for_error,
    read_body,
    slice_segments,
)
from sakura.net.client import RangeClient

T = TypeVar("T")
PARALLEL_RANGES = 4  # separate ranges of one fetch travel on this many connections at once
URL_MARGIN_S = 60.0  # a presigned URL is renewed this long before it expires


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every client: loading the CA bundle costs ~50 ms of CPU per client otherwise."""
    return ssl.create_default_context()


# How the keep-alive race shows (a server closes an idle connection just as the client reuses it): a clean close
# before any answer, a reset on reading, a broken pipe on writing. httpx retries none of them.
STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def once_more_if_stale(get: Callable[[], T]) -> T:
    """``get()``, sent again once (on a fresh connection) if the connection broke without an answer. Only for
    idempotent GETs; timeouts are not retried."""
    try:
        return get()
    except STALE_CONNECTION:
        return get()


class PresignedRangeSource:
    def __init__(self, locate: Callable[[str], dict], *, timeout: float = 30.0) -> None:
        self.locate = locate
        self._http = httpx.Client(timeout=timeout, headers={"Accept-Encoding": "identity"}, verify=tls_context(),
                                  limits=httpx.Limits(max_connections=PARALLEL_RANGES * 2))
        self._pool = ThreadPoolExecutor(PARALLEL_RANGES, thread_name_prefix="sakura-range")
        self._where: dict[str, tuple[float, dict]] = {}
        self._lock = threading.Lock()

    def _location(self, fid: str, renew: bool = False) -> dict:
        now = time.monotonic()
        with self._lock:
            got = self._where.get(fid)
        if got and not renew and now < got[0]:
            return got[1]
        where = self.locate(fid)
        with self._lock:
            self._where[fid] = (now + max(1.0, float(where.get("expires_s", 3600)) - URL_MARGIN_S), where)
        return where

    def size(self, fid: str) -> int:
        return int(self._location(fid)["size"])

    def header_bytes(self, fid: str) -> bytes:
        self._location(fid, renew=True)  # (the object published now: a header is read again to see a new one)
        return header_bytes_via_ranges(fid, lambda rs: self.fetch(fid, rs))

    def _get_span(self, fid: str, start: int, end: int) -> tuple[int, bytearray, float, float]:
        """One ``Range: bytes=start-(end-1)`` request; a refused (expired) URL is renewed once."""
        for attempt in (0, 1):
            url = self._location(fid, renew=attempt == 1)["url"]
            status, body, t_first, t_last = once_more_if_stale(lambda: self._range_get(url, start, end))
            if status in (401, 403) and attempt == 0:
                continue
            if status >= 400:
                raise FetchError(416 if status == 416 else status,
                                 f"{fid} bytes {start}-{end - 1}: store answered {status} {bytes(body[:120])!r}")
            if status == 200:  # Range ignored: slice what was asked
                body = body[start:end]
            if len(body) != end - start:
                raise FetchError(502, f"{fid}: asked {end - start} bytes at {start}, got {len(body)}")
            return start, body, t_first, t_last
        raise AssertionError("unreachable")

    def _range_get(self, url: str, start: int, end: int) -> tuple[int, bytearray, float, float]:
        with self._http.stream("GET", url, headers={"Range": f"bytes={start}-{end - 1}"}) as r:
            if r.status_code >= 400:
                return r.status_code, bytearray(r.read()), 0.0, 0.0
            body, t_first = read_body(r)
            return r.status_code, body, t_first, time.monotonic()

    def fetch_timed(self, fid: str, ranges: Sequence[Sequence[int]]) -> Transfer:
        want = check_ranges(ranges)
        spans = merged_spans(want)
        t_req = time.monotonic()
        size = self.size(fid)
        if spans and spans[-1][1] > size:
            raise FetchError(416, f"{fid}: range ends at {spans[-1][1]}, past the file's {size} bytes")
        if len(spans) == 1:
            got = [self._get_span(fid, *spans[0])]
        else:
            got = list(self._pool.map(lambda s: self._get_span(fid, *s), spans))
        segments = [(start, memoryview(body)) for start, body, _, _ in got]
        t_first = min((g[2] for g in got), default=t_req)
        t_last = max((g[3] for g in got), default=t_req)
        wire = sum(len(g[1]) for g in got)
        return Transfer(slice_segments(segments, want), sum(n for _, n in want), wire, t_req, t_first, t_last)

    def fetch(self, fid: str, ranges) -> list[bytes]:
        return self.fetch_timed(fid, ranges).parts

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ServerStoreClient(PresignedRangeSource):
    """Catalog, headers and presigned URLs from a template server in store mode; pack bytes from the store."""

    def __init__(self, server_url: str, *, timeout: float = 30.0) -> None:
        self.server = httpx.Client(base_url=server_url.rstrip("/"), timeout=timeout, verify=tls_context())
        super().__init__(self._ask_server, timeout=timeout)

    def _get(self, path: str) -> httpx.Response:
        r = once_more_if_stale(lambda: self.server.get(path))
        raise_for_error(r, path)
        return r

    def _ask_server(self, fid: str) -> dict:
        return self._get(f"/packs/{fid}/url").json()

    def templates(self) -> list[dict]:
        return self._get("/templates").json()

    def header_bytes(self, fid: str) -> bytes:
        body = self._get(f"/packs/{fid}/header").content
        check_header_length(fid, len(body))
        return len(body).to_bytes(8, "little") + body

    def close(self) -> None:
        super().close()
        self.server.close()


def pack_bytes_from(server_url: str) -> str | None:
    """Where a template server's pack bytes come from, as its ``/healthz`` says: ``"store"`` (an object store:
    read them there), ``"server"`` (the server itself), or None when it does not answer."""
    try:
        r = httpx.get(f"{server_url.rstrip('/')}/healthz", timeout=10, verify=tls_context())
        r.raise_for_status()
        return "store" if r.json().get("pack_bytes") == "store" else "server"
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def link_for_server(server_url: str):
    """The device's link to a template server: pack bytes from the server itself, or — when the server
    says its packs are in an object store — straight from the store (``/healthz`` tells which). A server
    that does not answer gets the plain range client, whose first request then reports the failure."""
    return ServerStoreClient(server_url) if pack_bytes_from(server_url) == "store" else RangeClient(server_url)
