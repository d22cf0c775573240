"""The byte-range wire format shared by every range client (HTTP, websocket, S3 store reader): range
lists and Range headers, ``multipart/byteranges`` bodies, slicing what arrived back into the ranges
asked for, a pack header fetched by ranges, and the :class:`Transfer` a fetch returns with its timing."""

from __future__ import annotations

import bisect
import contextlib
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

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


def check_ranges(ranges: Sequence[Sequence[int]]) -> list[Range]:
    out = [(int(o), int(n)) for o, n in ranges]
    if any(o < 0 or n < 0 for o, n in out):
        raise ValueError("ranges must be (offset, length) with non-negative values")
    return out


def merged_spans(ranges: list[Range]) -> list[Range]:
    """Merge overlapping / adjacent ranges into sorted (start, end_exclusive) spans."""
    spans: list[list[int]] = []
    for o, n in sorted(r for r in ranges if r[1] > 0):
        if spans and o <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], o + n)
        else:
            spans.append([o, o + n])
    return [(a, b) for a, b in spans]


def range_headers(spans: list[Range], limit: int = MAX_RANGE_HEADER) -> list[str]:
    headers, cur = [], ""
    for a, b in spans:
        item = f"{a}-{b - 1}"
        if cur and len(cur) + len(item) + 1 > limit:
            headers.append(cur)
            cur = ""
        cur = f"{cur},{item}" if cur else f"bytes={item}"
    return headers + ([cur] if cur else [])


CONTENT_RANGE = re.compile(rb"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.I)


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
        cr = CONTENT_RANGE.search(raw, pos, head_end)
        if not cr:
            raise FetchError(502, "multipart part without Content-Range")
        a, b = int(cr.group(1)), int(cr.group(2))
        start = head_end + 4
        segs.append((a, mv[start : start + b - a + 1]))
        pos = raw.find(delim, start + b - a + 1)
        if pos < 0:
            raise FetchError(502, "multipart body ends without closing boundary")


def slice_segments(segments: list[tuple[int, memoryview]], ranges: list[Range]) -> list[bytes]:
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


_arrivals = threading.local()


@contextlib.contextmanager
def counting(on_bytes: Callable[[int], None]):
    """While inside, every body chunk a range client reads on this thread is told to ``on_bytes(n)`` as it
    arrives: what a link that does not pace (:class:`sakura.net.unpaced.UnpacedLink`) sees of a transfer in
    flight."""
    before = getattr(_arrivals, "fn", None)
    _arrivals.fn = on_bytes
    try:
        yield
    finally:
        _arrivals.fn = before


def arrived(n: int) -> None:
    """``n`` body bytes just came in on this thread (see :func:`counting`)."""
    fn = getattr(_arrivals, "fn", None)
    if fn is not None and n:
        fn(n)


def read_body(r: httpx.Response) -> tuple[bytearray, float]:
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
        arrived(len(chunk))
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


def check_header_length(file_id: str, n: int) -> None:
    if n > MAX_HEADER_BYTES:
        raise FetchError(422, f"{file_id!r} does not start with a plausible header: its length says "
                              f"{n} bytes (at most {MAX_HEADER_BYTES} expected)")


def header_bytes_via_ranges(file_id: str, fetch: Callable[[list[Range]], list[bytes]]) -> bytes:
    """A u64-LE-length-prefixed header (the 8 length bytes included) read with two range requests."""
    (head,) = fetch([(0, 8)])
    (n,) = struct.unpack("<Q", head)
    check_header_length(file_id, n)
    (body,) = fetch([(8, n)])
    return head + body
