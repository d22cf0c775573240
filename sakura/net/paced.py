"""Receive-side link emulation: pace what a device reads along a bandwidth trace.

The device runtime shapes its own link, whatever it reads from (the template server over HTTP or
websocket, an object store, a local folder), so an experiment needs nothing from the far side and no
trace data ever leaves the device.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sakura.net.client import Transfer
from sakura.net.traces import Trace


# Every streaming policy keeps the same number of requests outstanding (the real runtime and the
# simulated clock alike), so round trips hide behind transfers for all of them equally.
DEFAULT_INFLIGHT = 2
# A request's round trip when no real-clock measurement is at hand (calibration stores a measured one).
DEFAULT_REQUEST_OVERHEAD_S = 0.002


class LinkClosed(RuntimeError):
    """The edit ended (or was cancelled) while a transfer was being paced."""


@dataclass
class Pending:
    """A sent request whose bytes the emulated link delivers by ``done`` (monotonic seconds)."""

    transfer: Transfer  # as the inner source returned it
    t_request: float
    begin: float  # the link starts on this request's bytes
    done: float  # its last byte is through the link


class PacedLink:
    """``inner`` (anything with ``fetch_timed``) as seen through a link following ``trace`` (already
    scaled) from ``start`` seconds in.

    The link is a FIFO pipe: a request's bytes start when its first byte came back from the inner
    source (its real round trip) or when the previous request's bytes are through, whichever is later,
    and take what the trace needs to deliver them. :meth:`send` does the inner round trip and books the
    link; :meth:`receive` waits until the booked bytes are through. Between the two, the caller may send
    the next request: that is how several requests are kept in flight. The transfer's timing is reported
    as the emulated one, so the runtime monitor measures the emulated rate.
    """

    def __init__(self, inner, trace: Trace, start: float = 0.0) -> None:
        self.inner, self.trace, self.start = inner, trace, start
        self._closed = threading.Event()
        self._lock = threading.Lock()  # one round trip at a time on the inner connection, in request order
        self.round_trips: list[float] = []  # measured request → first byte, for the link calibration
        self.reset_link()

    def reset_link(self) -> None:
        """Trace time 0 (= ``start``) is now."""
        self._t0 = time.monotonic()
        self._free_at = self._t0

    def send(self, file_id: str, ranges) -> Pending:
        with self._lock:
            t_req = time.monotonic()
            tr = self.inner.fetch_timed(file_id, ranges)
            self.round_trips.append(max(0.0, tr.t_first_byte - tr.t_request))
            begin = max(tr.t_first_byte, self._free_at)
            done = begin + self.trace.time_to_send(tr.wire_bytes, self.start + (begin - self._t0))
            done = max(done, tr.t_last_byte)
            self._free_at = done
        return Pending(tr, t_req, begin, done)

    def receive(self, pending: Pending) -> Transfer:
        wait = pending.done - time.monotonic()
        if wait > 0 and self._closed.wait(wait):  # closed while waiting (edit over): give up now
            raise LinkClosed("link closed")
        tr = pending.transfer
        first = pending.begin + min(pending.done - pending.begin, 1e-4)
        return Transfer(tr.parts, tr.nbytes, tr.wire_bytes, pending.t_request, max(tr.t_first_byte, first),
                        max(tr.t_last_byte, pending.done))

    def fetch_timed(self, file_id: str, ranges) -> Transfer:
        return self.receive(self.send(file_id, ranges))

    def fetch(self, file_id: str, ranges) -> list[bytes]:
        return self.fetch_timed(file_id, ranges).parts

    def close(self) -> None:
        """Stop pacing (a waiting transfer gives up at once). The inner link is the caller's to close."""
        self._closed.set()
