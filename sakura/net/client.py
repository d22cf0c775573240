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
"""

from __future__ import annotations

import bisect
import json
import re
import struct
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx
from websockets.sync.client import ClientConnection, connect

from sakura.net.shaping import RateSpec

Range = tuple[int, int]  # (offset, length)

# A Range header has to fit one request-header buffer: nginx's default is 8 KiB, uvicorn/h11
# accepts 16 KiB. Longer range lists are split over several requests.
MAX_RANGE_HEADER = 7000
# A stored file's JSON header is tens of KiB; a larger length prefix means the file is not one
# (or is corrupt), so it is refused before anything that size is allocated.
MAX_HEADER_BYTES = 16 << 20


class FetchError(RuntimeError):
    """The server refused a request; ``status`` is the HTTP status (or the websocket error status)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


@dataclass
class Transfer:
    """One request's payload and timing (monotonic seconds)."""

    parts: list[bytes]  # one per requested range, in request order
    nbytes: int  # payload bytes (sum of the requested lengths)
    wire_bytes: int  # body bytes actually received (multipart framing, whole-file fallbacks, ...)
    t_request: float  # request sent
    t_first_byte: float  # first payload byte received
    t_last_byte: float  # last byte received

    @property
    def active_s(self) -> float:
        """Time the link was busy with this request: request sent -> last byte."""
        return max(self.t_last_byte - self.t_request, 1e-9)

    @property
    def rate_bps(self) -> float:
        """Effective rate, wire bytes / active time, in bit/s."""
        return self.wire_bytes * 8 / self.active_s


def _check_ranges(ranges: Sequence[Sequence[int]]) -> list[Range]:
    out = [(int(o), int(n)) for o, n in ranges]
    if any(o < 0 or n < 0 for o, n in out):
        raise ValueError("ranges must be (offset, length) with non-negative values")
    return out


def _spans(ranges: list[Range]) -> list[Range]:
    """Merge overlapping / adjacent ranges into sorted (start, end_exclusive) spans."""
    spans: list[list[int]] = []
    for o, n in sorted(r for r in ranges if r[1] > 0):
        if spans and o <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], o + n)
        else:
            spans.append([o, o + n])
    return [(a, b) for a, b in spans]


def _range_headers(spans: list[Range], limit: int = MAX_RANGE_HEADER) -> list[str]:
    headers, cur = [], ""
    for a, b in spans:
        item = f"{a}-{b - 1}"
        if cur and len(cur) + len(item) + 1 > limit:
            headers.append(cur)
            cur = ""
        cur = f"{cur},{item}" if cur else f"bytes={item}"
    return headers + ([cur] if cur else [])


_CONTENT_RANGE = re.compile(rb"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.I)


def parse_multipart_byteranges(body: bytes | bytearray | memoryview, content_type: str) -> list[tuple[int, memoryview]]:
    """``(start, data)`` segments of a ``multipart/byteranges`` body (RFC 7233 appendix A).

    Part lengths come from each part's Content-Range, so binary data that happens to contain
    the boundary string cannot confuse the parser.
    """
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    if not m:
        raise FetchError(502, f"multipart response without boundary: {content_type!r}")
    delim = b"--" + m.group(1).encode("latin-1")
    raw = body if isinstance(body, (bytes, bytearray)) else bytes(body)
    mv = memoryview(raw)
    segs: list[tuple[int, memoryview]] = []
    pos = raw.find(delim)
    if pos < 0:
        raise FetchError(502, "multipart body has no boundary")
    while True:
        pos += len(delim)
        if raw[pos : pos + 2] == b"--":
            return segs
        head_end = raw.find(b"\r\n\r\n", pos)
        if head_end < 0:
            raise FetchError(502, "truncated multipart part headers")
        cr = _CONTENT_RANGE.search(raw, pos, head_end)
        if not cr:
            raise FetchError(502, "multipart part without Content-Range")
        a, b = int(cr.group(1)), int(cr.group(2))
        start = head_end + 4
        segs.append((a, mv[start : start + b - a + 1]))
        pos = raw.find(delim, start + b - a + 1)
        if pos < 0:
            raise FetchError(502, "multipart body ends without closing boundary")


def _slice(segments: list[tuple[int, memoryview]], ranges: list[Range]) -> list[bytes]:
    segments = sorted(segments, key=lambda s: s[0])
    starts = [s for s, _ in segments]
    out = []
    for o, n in ranges:
        if n == 0:
            out.append(b"")
            continue
        i = bisect.bisect_right(starts, o) - 1
        # Segments may overlap (a server may answer each range separately): look back a little.
        for j in range(i, -1, -1):
            s, data = segments[j]
            if s <= o and o + n <= s + len(data):
                out.append(bytes(data[o - s : o - s + n]))
                break
        else:
            raise FetchError(502, f"server response does not cover range ({o}, {n})")
    return out


def _read_body(r: httpx.Response) -> tuple[bytearray, float]:
    """The raw body and the time its first bytes arrived; preallocated when the length is known
    (growing a bytearray chunk by chunk halves throughput on 100 MB bodies)."""
    t_first = time.monotonic()
    n = int(r.headers.get("content-length", -1))
    body, pos, first = bytearray(max(n, 0)), 0, True
    view = memoryview(body)
    for chunk in r.iter_raw():
        if first and chunk:
            t_first, first = time.monotonic(), False
        end = pos + len(chunk)
        if end <= n:
            view[pos:end] = chunk
        else:  # no or wrong Content-Length: append
            view.release()
            del body[pos:]
            body += chunk
            view, n = memoryview(body), -1
        pos = end
    view.release()
    del body[pos:]
    return body, t_first


def raise_for_error(r: httpx.Response, what: str) -> None:
    """A server's error answer (JSON ``{"error": ...}`` or text) as a :class:`FetchError`."""
    if r.status_code >= 400:
        try:
            msg = r.json().get("error") or r.text
        except ValueError:
            msg = r.text[:200]
        raise FetchError(r.status_code, f"{what}: {msg}")


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
            _check_header_length(file_id, int(r.headers.get("content-length", 0)))
            body = r.read()
        _check_header_length(file_id, len(body))
        return struct.pack("<Q", len(body)) + body

    def fetch(self, file_id: str, ranges: Sequence[Sequence[int]]) -> list[bytes]:
        return self.fetch_timed(file_id, ranges).parts

    def fetch_timed(self, file_id: str, ranges: Sequence[Sequence[int]]) -> Transfer:
        """Fetch ``(offset, length)`` ranges with one multi-range request (more only if the
        Range header would exceed :data:`MAX_RANGE_HEADER`)."""
        want = _check_ranges(ranges)
        url = self.pack_path.format(id=file_id)
        segments: list[tuple[int, memoryview]] = []
        wire = 0
        t_req = t_first = t_last = time.monotonic()
        for i, rh in enumerate(_range_headers(_spans(want))):
            with self._http.stream("GET", url, headers={"Range": rh, **self._headers()}) as r:
                if r.status_code >= 400:
                    r.read()
                    raise_for_error(r, f"ranges of {file_id!r}")
                body, t_got = _read_body(r)
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
                cr = _CONTENT_RANGE.search(r.headers.get("content-range", "").encode())
                if r.status_code != 206 or not cr:
                    raise FetchError(502, f"unexpected {r.status_code} response without Content-Range")
                segments.append((int(cr.group(1)), memoryview(body)))
        parts = _slice(segments, want)
        return Transfer(parts, sum(n for _, n in want), wire, t_req, t_first, t_last)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RangeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_header_length(file_id: str, n: int) -> None:
    if n > MAX_HEADER_BYTES:
        raise FetchError(422, f"{file_id!r} does not start with a plausible header: its length says "
                              f"{n} bytes (at most {MAX_HEADER_BYTES} expected)")


def header_bytes_via_ranges(file_id: str, fetch: Callable[[list[Range]], list[bytes]]) -> bytes:
    """A u64-LE-length-prefixed header (the 8 length bytes included) read with two range requests."""
    (head,) = fetch([(0, 8)])
    (n,) = struct.unpack("<Q", head)
    _check_header_length(file_id, n)
    (body,) = fetch([(8, n)])
    return head + body


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
        want = _check_ranges(ranges)
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
