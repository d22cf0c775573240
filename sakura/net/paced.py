"""Receive-side link emulation: pace what a device reads along a bandwidth trace.

The device runtime shapes its own link, whatever it reads from (the template server over HTTP or
websocket, an object store, a local folder), so an experiment needs nothing from the far side and no
trace data ever leaves the device.
"""

from __future__ import annotations

import threading
import time

from sakura.net.client import Transfer
from sakura.net.traces import Trace


class LinkClosed(RuntimeError):
    """The edit ended (or was cancelled) while a transfer was being paced."""


class PacedLink:
    """``inner`` (anything with ``fetch_timed``) as seen through a link following ``trace`` (already
    scaled) from ``start`` seconds in.

    Requests are sequential (one receiver thread): request ``i`` may only use the link after request
    ``i-1`` finished, and it completes when the trace has delivered its wire bytes. The transfer's
    timing is reported as the emulated one, so the runtime monitor measures the emulated rate.
    """

    def __init__(self, inner, trace: Trace, start: float = 0.0) -> None:
        self.inner, self.trace, self.start = inner, trace, start
        self._closed = threading.Event()
        self.reset_link()

    def reset_link(self) -> None:
        """Trace time 0 (= ``start``) is now."""
        self._t0 = time.monotonic()
        self._free_at = self._t0

    def fetch_timed(self, file_id: str, ranges) -> Transfer:
        t_req = time.monotonic()
        tr = self.inner.fetch_timed(file_id, ranges)
        begin = max(t_req, self._free_at)
        done = begin + self.trace.time_to_send(tr.wire_bytes, self.start + (begin - self._t0))
        wait = done - time.monotonic()
        if wait > 0 and self._closed.wait(wait):  # closed while waiting (edit over): give up now
            raise LinkClosed("link closed")
        self._free_at = max(done, time.monotonic())
        first = begin + min(done - begin, 1e-4)
        return Transfer(tr.parts, tr.nbytes, tr.wire_bytes, t_req, max(tr.t_first_byte, first),
                        max(tr.t_last_byte, done))

    def fetch(self, file_id: str, ranges) -> list[bytes]:
        return self.fetch_timed(file_id, ranges).parts

    def close(self) -> None:
        """Stop pacing (a waiting transfer gives up at once). The inner link is the caller's to close."""
        self._closed.set()
