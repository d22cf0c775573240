"""Response bodies of the template server: file spans cut into frames, paced along a trace."""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from sakura.net.shaping import DeadlinePassed, RateSpec, TraceShaper, check_client_trace
from sakura.net.traces import SYNTHETIC_NAMES, Trace, TraceError, load_trace
from sakura.server.ranges import Piece
from sakura.server.store import PLAIN_NAME

FRAME = 64 * 1024  # websocket frame / HTTP body chunk
READ_BLOCK = FRAME  # a response held by a slow reader keeps at most about two frames here
TRACE_HEADER = "x-sakura-trace"


def frames(fd: int, pieces: list[Piece], frame: int = FRAME) -> Iterator[bytes]:
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


async def paced(blocks: Iterator[bytes], shaper: TraceShaper | None, nbytes: int) -> AsyncIterator[bytes]:
    """``blocks`` (``nbytes`` in all) along the shaper's trace; DeadlinePassed once the transfer runs past
    :meth:`TraceShaper.deadline` (the caller ends the response or reports it)."""
    if shaper is None:
        for block in blocks:
            yield block
        return
    deadline, first = shaper.deadline(nbytes), True
    for block in blocks:
        async for chunk in shaper.asend_chunks(block, new_burst=first):
            if shaper.clock.now() > deadline:
                raise DeadlinePassed(f"{nbytes} bytes paced past their deadline")
            yield bytes(chunk)
        first = False


class LinkShapes:
    """Shapers for the link a client asked for: synthetic traces, ``fixed:<Mbps>``, or a file name
    inside ``trace_dir`` if one is configured -- never an arbitrary path from a client."""

    def __init__(self, trace_dir: str | Path | None = None) -> None:
        self.trace_dir = None if trace_dir is None else Path(trace_dir)
        # configuration-derived, not per-request state
        self._trace = functools.lru_cache(maxsize=64)(self._load_trace)

    def _load_trace(self, name: str, scale: float) -> Trace:
        if name in SYNTHETIC_NAMES or name.startswith("fixed:"):
            return load_trace(name, scale)
        if self.trace_dir is not None and PLAIN_NAME.match(name) and (self.trace_dir / name).is_file():
            return load_trace(self.trace_dir / name, scale)
        raise TraceError(f"unknown trace {name[:80]!r}: use {', '.join(SYNTHETIC_NAMES)} or fixed:<Mbps>")

    def shaper(self, spec: RateSpec | None) -> TraceShaper | None:
        """A fresh shaper at ``spec.start`` (None = no shaping). Raises TraceError for an unknown trace or
        one below the client floor."""
        return None if spec is None else TraceShaper(check_client_trace(self._trace(spec.trace, spec.scale)),
                                                      spec.start)
