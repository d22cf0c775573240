"""Receive-side link emulation: pace what a device reads along a bandwidth trace.

The device runtime shapes its own link, whatever it reads from (the template server over HTTP or
websocket, an object store, a local folder), so an experiment needs nothing from the far side and no
trace data ever leaves the device.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sakura.net.client import Transfer
from sakura.net.failover import source_down
from sakura.net.traces import Trace
from sakura.online.fallback import OBSERVE_WINDOW_S, InFlight, in_flight

# Every streaming policy keeps the same number of requests outstanding (the real runtime and the
# simulated clock alike), so round trips hide behind transfers for all of them equally.
DEFAULT_INFLIGHT = 2
# A request's round trip when no real-clock measurement is at hand (calibration stores a measured one).
DEFAULT_REQUEST_OVERHEAD_S = 0.002
CUT_SLACK_S = 0.001  # a cut waiting for its smallest prefix also takes what is through this soon after it
POLL_S = 0.002  # a waiting receive re-reads its booking this often (a cut before it may move it earlier)
SOURCE_RETRY_S = 0.25  # a request no source answered is sent again this often while its shard waits


def cut_point(trace: Trace, begin: float, now: float, sizes: Sequence[float], ends: Sequence[int]) -> tuple[int, float]:
    """Where a transfer whose bytes started at trace time ``begin`` is cut when it is needed at ``now``:
    the largest usable prefix through by then (``ends``: how many leading parts each usable prefix
    needs, smallest first; ``sizes[k]``: bytes of the first k parts), or else the smallest, as soon as
    it is through. Returns (parts kept, trace time of the cut). Both clocks decide cuts here."""
    delivered = trace.bytes_between(begin, now) if now > begin else 0.0
    fitting = [k for k in ends[:-1] if sizes[k] <= delivered]
    if fitting:
        return fitting[-1], now
    # Nothing usable is through: wait for the smallest, and take any larger prefix through within
    # CUT_SLACK_S of it (on a fast link whose first byte is late, the whole transfer lands at once).
    t_smallest = begin + trace.time_to_send(float(sizes[ends[0]]), begin)
    through = trace.bytes_between(begin, t_smallest + CUT_SLACK_S) if math.isfinite(t_smallest) else 0.0
    larger = [k for k in ends if sizes[k] <= through]
    if larger and larger[-1] != ends[0]:
        k = larger[-1]
        return k, begin + trace.time_to_send(float(sizes[k]), begin)
    return ends[0], t_smallest


class LinkClosed(RuntimeError):
    """The edit ended (or was cancelled) while a transfer was being paced."""


@dataclass
class Pending:
    """A sent request whose bytes the emulated link delivers by ``done`` (monotonic seconds)."""

    transfer: Transfer | None  # as the inner source returned it (None: no source answered yet)
    t_request: float
    begin: float  # the link starts on this request's bytes
    done: float  # its last byte is through the link
    file_id: str = ""
    ranges: tuple = ()
    next_retry: float = math.inf  # (a request no source answered) when it is sent again
    through_at_cut: float = 0.0  # (a cut transfer) bytes through the link by the cut, kept prefix and beyond


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
        self._outstanding: list[Pending] = []  # sent, not yet received (a cut re-books them)
        self.round_trips: list[float] = []  # measured request → first byte, for the link calibration
        self.outages: list[dict] = []  # stretches no source answered: {"down_s", "back_s" (None: still down), "why"}
        self.reset_link()

    def reset_link(self) -> None:
        """Trace time 0 (= ``start``) is now."""
        self._t0 = time.monotonic()
        self._free_at = self._t0

    def send(self, file_id: str, ranges) -> Pending:
        """Book a request. When its source does not answer (a dead server and no replica left), the request
        stays pending with no bytes — to the device a silent link, on which its fallbacks decide — and
        :meth:`receive` sends it again every ``SOURCE_RETRY_S`` (``outages`` records each such stretch)."""
        with self._lock:
            t_req = time.monotonic()
            try:
                tr = self.inner.fetch_timed(file_id, ranges)
            except Exception as e:  # noqa: BLE001 - classified: only a source that did not answer is a link
                if not source_down(e):
                    raise
                pending = Pending(None, t_req, t_req, math.inf, file_id, tuple(ranges), t_req + SOURCE_RETRY_S)
                self._outage(t_req, e)
                self._outstanding.append(pending)
                return pending
            self.round_trips.append(max(0.0, tr.t_first_byte - tr.t_request))
            # (the request as the source that answered got it: a retry or a switch to a replica before it is
            # not link time, so the monitor measures the same rate as without the fault)
            pending = Pending(tr, max(t_req, min(tr.t_request, tr.t_first_byte)), 0.0, 0.0)
            self._book(pending, self._free_at)
            self._outstanding.append(pending)
        return pending

    def _outage(self, t: float, e: BaseException) -> None:
        if not self.outages or self.outages[-1]["back_s"] is not None:
            self.outages.append({"down_s": round(t - self._t0, 4), "back_s": None,
                                 "why": " ".join(f"{type(e).__name__}: {e}".split())[:160]})

    def _resend(self, pending: Pending) -> None:
        """Send a request no source answered once more (the collector's thread, waiting for it)."""
        with self._lock:
            now = time.monotonic()
            try:
                tr = self.inner.fetch_timed(pending.file_id, pending.ranges)
            except Exception as e:  # noqa: BLE001 - as in send
                if not source_down(e):
                    raise
                pending.next_retry = now + SOURCE_RETRY_S
                return
            if self.outages and self.outages[-1]["back_s"] is None:
                self.outages[-1]["back_s"] = round(now - self._t0, 4)
            pending.transfer = tr
            self._book(pending, max(self._free_at, now))

    def _book(self, pending: Pending, free_at: float) -> None:
        tr = pending.transfer
        if tr is None:  # no source answered it yet: it holds no place on the link
            return
        pending.begin = max(tr.t_first_byte, free_at)
        pending.done = max(
            pending.begin + self.trace.time_to_send(tr.wire_bytes, self.start + (pending.begin - self._t0)),
            tr.t_last_byte,
        )
        self._free_at = pending.done

    def receive(self, pending: Pending, cut: threading.Event | None = None,
                prefix_ends: Sequence[int] = (), drop: threading.Event | None = None) -> Transfer:
        """Wait until the request's bytes are through. If ``cut`` is set first, stop at the largest
        usable prefix through by then (``prefix_ends``: how many leading parts each usable prefix needs,
        smallest first) — or at the smallest, as soon as it is — and carry the later requests' bytes
        from there on. The transfer returned then holds only that prefix's parts. If ``drop`` is set
        first, stop at once: no parts, ``nbytes`` = what had come through (a fallback replaced it)."""
        while pending.transfer is None:  # no source answered: wait, sending it again now and then
            if drop is not None and drop.is_set():
                return self._drop(pending)
            if time.monotonic() >= pending.next_retry:
                self._resend(pending)
                continue
            if self._closed.wait(min(max(pending.next_retry - time.monotonic(), 0.0), POLL_S * 25)):
                if drop is not None and drop.is_set():
                    return self._drop(pending)
                raise LinkClosed("link closed")
        keep = len(pending.transfer.parts)
        while (wait := pending.done - time.monotonic()) > 0:
            if drop is not None and drop.is_set():
                return self._drop(pending)
            if cut is not None and cut.is_set() and len(prefix_ends) > 1:
                keep = self._cut(pending, prefix_ends)
                cut = None
                continue
            if self._closed.wait(min(wait, POLL_S)):  # closed while waiting (edit over): give up now
                if drop is not None and drop.is_set():
                    return self._drop(pending)
                raise LinkClosed("link closed")
        with self._lock:
            if pending in self._outstanding:
                self._outstanding.remove(pending)
        tr = pending.transfer
        parts = tr.parts[:keep]
        nbytes = sum(len(p) for p in parts)
        first = pending.begin + min(pending.done - pending.begin, 1e-4)
        wire = tr.wire_bytes if keep == len(tr.parts) else max(nbytes, int(pending.through_at_cut))
        return Transfer(parts, nbytes, wire, pending.t_request,
                        max(tr.t_first_byte, first), max(tr.t_last_byte, pending.done))

    def _cut(self, pending: Pending, prefix_ends: Sequence[int]) -> int:
        with self._lock:
            at = lambda t: self.start + (t - self._t0)  # noqa: E731 - trace time of a monotonic instant
            sizes = np.cumsum([0] + [len(p) for p in pending.transfer.parts])
            keep, t_cut = cut_point(self.trace, at(pending.begin), at(time.monotonic()), sizes, prefix_ends)
            pending.through_at_cut = self.trace.bytes_between(at(pending.begin), t_cut)
            t_cut += self._t0 - self.start
            if t_cut >= pending.done:
                return len(pending.transfer.parts)
            pending.done = self._free_at = t_cut
            for later in self._outstanding[self._outstanding.index(pending) + 1:]:
                self._book(later, self._free_at)
            return keep

    def progress(self, pending: Pending, need_bytes: int = 0):
        """What a device sees of a transfer in flight (:class:`sakura.online.fallback.InFlight`): bytes
        through so far and lately, from which it can tell a silent link from a slow start."""
        at = lambda t: self.start + (t - self._t0)  # noqa: E731 - trace time of a monotonic instant
        if pending.transfer is None:  # its source is silent: nothing through, nothing lately
            active = time.monotonic() - pending.t_request
            return InFlight(need_bytes, 0.0, active, 0.0, min(active, OBSERVE_WINDOW_S))
        now = min(time.monotonic(), pending.done)
        return in_flight(self.trace, at(pending.begin), at(now), need_bytes, float(pending.transfer.wire_bytes))

    def _drop(self, pending: Pending) -> Transfer:
        if pending.transfer is None:  # never answered: nothing came, nothing to re-book
            with self._lock:
                if pending in self._outstanding:
                    self._outstanding.remove(pending)
            now = time.monotonic()
            return Transfer([], 0, 0, pending.t_request, now, now)
        got = self.progress(pending).delivered
        with self._lock:
            now = time.monotonic()
            pending.done = self._free_at = max(now, pending.begin)
            if pending in self._outstanding:
                i = self._outstanding.index(pending)
                for later in self._outstanding[i + 1:]:
                    self._book(later, self._free_at)
                self._outstanding.remove(pending)
        tr = pending.transfer
        return Transfer([], int(got), int(got), pending.t_request, max(tr.t_first_byte, pending.begin), now)

    def fetch_timed(self, file_id: str, ranges) -> Transfer:
        return self.receive(self.send(file_id, ranges))

    def fetch(self, file_id: str, ranges) -> list[bytes]:
        return self.fetch_timed(file_id, ranges).parts

    def close(self) -> None:
        """Stop pacing (a waiting transfer gives up at once). The inner link is the caller's to close."""
        self._closed.set()
