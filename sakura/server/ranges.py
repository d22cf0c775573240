"""HTTP byte ranges (RFC 7233 / RFC 9110 §14): parse ``Range``, lay out ``multipart/byteranges``."""

from __future__ import annotations

import re

MAX_RANGES = 4096  # a shard request carries tens to hundreds; more is abuse

Piece = bytes | tuple[int, int]  # literal bytes, or (offset, length) of the file


class RangeNotSatisfiable(Exception):
    pass


class BadRange(Exception):
    pass


_SPEC = re.compile(r"^\s*(\d*)\s*-\s*(\d*)\s*$")
# A byte position with more digits than this exceeds any file; reading it as "huge" keeps int() off
# numbers of thousands of digits (Python refuses those: a 500 before).
_MAX_DIGITS = 18
_HUGE = 10**_MAX_DIGITS


def _position(digits: str) -> int:
    digits = digits.lstrip("0") or "0"
    return _HUGE if len(digits) > _MAX_DIGITS else int(digits)


def parse_range(value: str, size: int) -> list[tuple[int, int]] | None:
    """Satisfiable ``(start, end_inclusive)`` ranges of a ``Range`` header, in request order.

    Returns ``None`` when the unit is not ``bytes`` (the header must then be ignored).
    Raises :class:`BadRange` on bad syntax, :class:`RangeNotSatisfiable` if no range overlaps.
    """
    unit, eq, specs = value.partition("=")
    if not eq:
        raise BadRange(f"Range header without '=': {value[:80]!r}")
    if unit.strip().lower() != "bytes":
        return None
    parts = [p for p in specs.split(",") if p.strip()]
    if not parts:
        raise BadRange("Range header has no ranges")
    if len(parts) > MAX_RANGES:
        raise BadRange(f"too many ranges ({len(parts)} > {MAX_RANGES})")
    out = []
    for p in parts:
        m = _SPEC.match(p)
        if not m or (not m[1] and not m[2]):
            raise BadRange(f"bad byte range {p.strip()[:40]!r}")
        if not m[1]:  # suffix: the last N bytes
            n = _position(m[2])
            if n > 0 and size > 0:
                out.append((max(size - n, 0), size - 1))
            continue
        first = _position(m[1])
        last = _position(m[2]) if m[2] else size - 1
        if m[2] and last < first:
            raise BadRange(f"byte range {p.strip()!r} ends before it starts")
        if first < size:
            out.append((first, min(last, size - 1)))
    if not out:
        raise RangeNotSatisfiable()
    return out


def multipart_pieces(
    ranges: list[tuple[int, int]], size: int, boundary: str, content_type: str = "application/octet-stream"
) -> tuple[list[Piece], int]:
    """Body of a ``multipart/byteranges`` response as pieces, and its total length."""
    pieces: list[Piece] = []
    for a, b in ranges:
        head = f"\r\n--{boundary}\r\nContent-Type: {content_type}\r\nContent-Range: bytes {a}-{b}/{size}\r\n\r\n"
        pieces += [head.encode("ascii"), (a, b - a + 1)]
    pieces.append(f"\r\n--{boundary}--\r\n".encode("ascii"))
    return pieces, sum(len(p) if isinstance(p, bytes) else p[1] for p in pieces)
