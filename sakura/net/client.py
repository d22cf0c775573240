"""Clients that fetch byte ranges of a pack and time the transfer.

* :class:`RangeClient` -- HTTP. One multi-range request per call (``Range: bytes=a-b,c-d``);
  parses ``multipart/byteranges`` and also copes with servers that coalesce ranges, answer a
  single range, or ignore ``Range`` and send the whole file (200): it slices what it asked for.
  Works against the SAKURA server and any static server with Range support (nginx, S3).
* :class:`WsRangeClient` -- the SAKURA server's websocket stream mode (one connection per file).

Files are named by *file id*: a template's pack (``<template>``) or one of its baseline encodings
(``<template>.fp16``, ``<template>.intq``, ...).

Both return a :class:`Transfer` with the payload and its timing (``time.monotonic()``, the base
of :class:`sakura.net.clock.RealClock`), so the runtime monitor can use bytes / active time.
Both can ask the server to shape the link with a :class:`RateSpec`; the trace position advances
with wall time since the client was created (or :meth:`reset_link`).

The byte-range wire format itself lives in :mod:`sakura.net.byteranges` (re-exported here).
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Sequence
from contextlib import ExitStack
from urllib.parse import urlsplit, urlunsplit

import httpx
from websockets.sync.client import ClientConnection, connect

from sakura.net.byteranges import (
    CONTENT_RANGE,
    MAX_HEADER_BYTES,
    MAX_RANGE_HEADER,
    FetchError,
    Transfer,
    arrived,
    check_header_length,
    check_ranges,
    header_bytes_via_ranges,
    merged_spans,
    parse_multipart_byteranges,
    raise_for_error,
    range_headers,
    read_body,
    slice_segments,
)
from sakura.net.shaping import RateSpec

__all__ = ["FetchError", "MAX_HEADER_BYTES", "MAX_RANGE_HEADER", "RangeClient", "Transfer", "WsRangeClient",
           "parse_multipart_byteranges"]


class RangeClient:
    """HTTP range client for a template server or a static server holding the packs.

    ``pack_path`` maps a file id to a URL path: ``/packs/{id}`` for the SAKURA server,
    e.g. ``/{id}.pack`` for nginx serving the pack directory.
    """

    def __init__(
        self,
        base_url: str,
        *,
        pack_path: str = "/packs/{id}",
        rate: RateSpec | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.pack_path = pack_path
        self.rate = rate
        # identity: byte offsets refer to the stored file, never to a compressed rendition of it.
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout,
                                  headers={"Accept-Encoding": "identity"})
        self.reset_link()

    def reset_link(self) -> None:
        """Trace time ``rate.start`` corresponds to now."""
        self._t0 = time.monotonic()

    def _headers(self) -> dict[str, str]:
        if self.rate is None:
            return {}
        return {"X-Sakura-Trace": self.rate.shifted(time.monotonic() - self._t0).header()}

    def templates(self) -> list[dict]:
        r = self._http.get("/templates")
        raise_for_error(r, "list templates")
        return r.json()

    def header(self, file_id: str) -> dict:
        """The file's JSON header (u64 LE length + JSON at the start of the file)."""
        return json.loads(self.header_bytes(file_id)[8:])

    def header_bytes(self, file_id: str) -> bytes:
        """The raw ``8 + N`` header bytes (u64 LE ``N``, then N bytes of JSON) of a stored file: one
        request through the SAKURA server's ``/header`` endpoint, else two range requests."""
        if self.pack_path != "/packs/{id}":
            return header_bytes_via_ranges(file_id, lambda rs: self.fetch(file_id, rs))
        with self._http.stream("GET", f"/packs/{file_id}/header", headers=self._headers()) as r:
            if r.status_code >= 400:
                r.read()
                raise_for_error(r, f"header of {file_id!r}")
            check_header_length(file_id, int(r.headers.get("content-length", 0)))
            body = r.read()
        check_header_length(file_id, len(body))
        return struct.pack("<Q", len(body)) + body

    def fetch(self, file_id: str, ranges: Sequence[Sequence[int]]) -> list[bytes]:
        return self.fetch_timed(file_id, ranges).parts

    def fetch_timed(self, file_id: str, ranges: Sequence[Sequence[int]]) -> Transfer:
        """Fetch ``(offset, length)`` ranges with one multi-range request (more only if the
        Range header would exceed :data:`MAX_RANGE_HEADER`)."""
        want = check_ranges(ranges)
        url = self.pack_path.format(id=file_id)
        segments: list[tuple[int, memoryview]] = []
        wire = 0
        t_req = t_first = t_last = time.monotonic()
        for i, rh in enumerate(range_headers(merged_spans(want))):
            with self._http.stream("GET", url, headers={"Range": rh, **self._headers()}) as r:
                if r.status_code >= 400:
                    r.read()
                    raise_for_error(r, f"ranges of {file_id!r}")
                body, t_got = read_body(r)
                t_first = t_got if i == 0 else t_first
                t_last = time.monotonic()
            wire += len(body)
            ctype = r.headers.get("content-type", "")
            if r.status_code == 200:  # Range ignored: the whole file is here
                segments = [(0, memoryview(body))]
                break
            if ctype.startswith("multipart/byteranges"):
                segments += parse_multipart_byteranges(body, ctype)
            else:
                cr = CONTENT_RANGE.search(r.headers.get("content-range", "").encode())
                if r.status_code != 206 or not cr:
                    raise FetchError(502, f"unexpected {r.status_code} response without Content-Range")
                segments.append((int(cr.group(1)), memoryview(body)))
        parts = slice_segments(segments, want)
        return Transfer(parts, sum(n for _, n in want), wire, t_req, t_first, t_last)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RangeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WsRangeClient:
    """Websocket range client (sync); one connection per file, opened on first use.

    Requests on a connection are answered in order; use one instance from one thread.
    """

    def __init__(self, base_url: str, *, rate: RateSpec | None = None, open_timeout: float = 10.0) -> None:
        u = urlsplit(base_url.rstrip("/"))
        scheme = {"http": "ws", "https": "wss"}.get(u.scheme, u.scheme)
        self.base_url = urlunsplit((scheme, u.netloc, u.path, "", ""))
        self.rate = rate
        self.open_timeout = open_timeout
        self._conns: dict[str, ClientConnection] = {}
        self._stack = ExitStack()  # websockets wants connections used as context managers
        self._next_id = 0
        self.reset_link()

    def reset_link(self) -> None:
        """Trace time ``rate.start`` corresponds to now (re-sent on each connection's next request)."""
        self._t0 = time.monotonic()
        self._rate_sent: set[str] = set()

    def _conn(self, file_id: str) -> ClientConnection:
        c = self._conns.get(file_id)
        if c is not None:
            return c
        try:
            # No compression: pack bytes don't compress and deflate would cap throughput.
            c = self._stack.enter_context(connect(
                f"{self.base_url}/ws/{file_id}", compression=None, max_size=None,
                open_timeout=self.open_timeout,
            ))
        except Exception as e:  # websockets.InvalidStatus carries the HTTP denial response
            resp = getattr(e, "response", None)
            if resp is not None:
                raise FetchError(resp.status_code, resp.body.decode("utf-8", "replace")) from None
            raise
        self._conns[file_id] = c
        return c

    def header(self, file_id: str) -> dict:
        """The file's JSON header (u64 LE length + JSON at the start of the file)."""
        return json.loads(self.header_bytes(file_id)[8:])

    def header_bytes(self, file_id: str) -> bytes:
        """The raw ``8 + N`` header bytes of a stored file, by two range requests."""
        return header_bytes_via_ranges(file_id, lambda rs: self.fetch(file_id, rs))

    def fetch(self, file_id: str, ranges: Sequence[Sequence[int]]) -> list[bytes]:
        return self.fetch_timed(file_id, ranges).parts

    def fetch_timed(self, file_id: str, ranges: Sequence[Sequence[int]]) -> Transfer:
        want = check_ranges(ranges)
        conn = self._conn(file_id)
        self._next_id += 1
        msg: dict[str, object] = {"id": self._next_id, "ranges": [list(r) for r in want]}
        if self.rate is not None and file_id not in self._rate_sent:
            # Sent once per connection (and after reset_link): the server keeps shaping it.
            msg["rate"] = self.rate.shifted(time.monotonic() - self._t0).to_json()
            self._rate_sent.add(file_id)
        conn.send(json.dumps(msg))
        t_req = time.monotonic()
        head = json.loads(conn.recv())
        if "error" in head:
            raise FetchError(int(head.get("status", 400)), head["error"])
        total = int(head["nbytes"])
        buf = bytearray()
        t_first = t_last = t_req
        while len(buf) < total:
            frame = conn.recv()
            if isinstance(frame, str):
                raise FetchError(502, f"text frame before all {total} bytes arrived: {frame[:100]}")
            if not buf:
                t_first = time.monotonic()
            buf += frame
            arrived(len(frame))
        t_last = time.monotonic() if total else t_req
        done = json.loads(conn.recv())
        if not done.get("done") or done.get("id") != self._next_id:
            raise FetchError(502, f"unexpected end-of-request message {done}")
        parts, off, mv = [], 0, memoryview(buf)
        for _, n in want:
            parts.append(bytes(mv[off : off + n]))
            off += n
        return Transfer(parts, total, total, t_req, t_first, t_last)

    def close(self) -> None:
        self._conns.clear()
        self._stack.close()

    def __enter__(self) -> WsRangeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
