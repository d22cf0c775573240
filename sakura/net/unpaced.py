"""A link the application does not pace: the bytes come as fast as the network under them delivers them.

On a kernel-shaped link (:mod:`sakura.net.kernel`) the pacing is tc's: this side only sends requests and
watches what arrives. :class:`UnpacedLink` offers the same interface as :class:`sakura.net.paced.PacedLink`
(``send`` / ``receive`` / ``progress`` / ``close``), so the streamed edit runs unchanged over it:

* requests go out in order, one at a time, on one worker thread (one connection: a FIFO pipe, as the paced
  link models it); ``send`` only queues, so the requester may keep several outstanding;
* a request's ranges are fetched in groups of about :data:`GROUP_BYTES`, so when execution reaches a unit
  still in flight (a *cut*) the parts already through are kept and the rest is not asked for;
* what is in flight is seen byte by byte as it arrives (:func:`sakura.net.byteranges.counting`): the
  fallbacks read the rate a transfer shows now, as on the paced link;
* a source that does not answer (a dead server, no replica left) leaves the request pending — to the
  device a silent link — and it is sent again every ``SOURCE_RETRY_S`` (``outages`` records each stretch).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from sakura.net.byteranges import Transfer, counting
from sakura.net.failover import source_down
from sakura.net.paced import POLL_S, SOURCE_RETRY_S, LinkClosed
from sakura.online.fallback import OBSERVE_WINDOW_S, InFlight

# A request's ranges go out in sub-requests of FIRST_GROUP_BYTES, then twice that, ... up to GROUP_BYTES: a cut
# keeps the parts of the groups through, and a level's small prefixes (the first ranges) come in small groups.
FIRST_GROUP_BYTES = 16 * 1024
GROUP_BYTES = 256 * 1024


class Abandoned(Exception):
    """Raised in an abandoned request's read: leaving the response unread closes its connection, so the server
    stops sending bytes nobody wants (they would share the shaped link with the requests after it)."""


@dataclass
class Flight:
    """One request on the unpaced link: its parts as they come through (monotonic seconds)."""

    file_id: str
    ranges: tuple
    t_request: float
    parts: list[bytes] = field(default_factory=list)
    wire: int = 0  # body bytes through so far (complete groups and the one arriving)
    wire_done: int = 0  # body bytes of the complete groups
    t_begin: float | None = None  # its first sub-request went out (the link was free for it)
    t_first: float | None = None
    t_last: float | None = None
    done: bool = False
    stop: bool = False  # cut or dropped: the groups not yet asked for are not asked for
    error: BaseException | None = None
    marks: deque = field(default_factory=lambda: deque(maxlen=4096))  # (time, wire bytes so far)


def groups(ranges: Sequence, limit: int = GROUP_BYTES, first: int = FIRST_GROUP_BYTES) -> list[list]:
    """``ranges`` in order, cut into runs of ``first`` bytes, then twice that, ... up to ``limit`` (a run holds
    at least one range)."""
    out: list[list] = []
    size, cap = 0, min(first, limit)
    for r in ranges:
        if not out or size >= cap:
            if out:
                cap = min(2 * cap, limit)
            out.append([])
            size = 0
        out[-1].append(r)
        size += int(r[1])
    return out


class UnpacedLink:
    """``inner`` (anything with ``fetch_timed``) read as fast as the network delivers it."""

    def __init__(self, inner, group_bytes: int = GROUP_BYTES) -> None:
        self.inner, self.group_bytes = inner, group_bytes
        self.round_trips: list[float] = []  # request → first byte of each request's first group
        self.outages: list[dict] = []
        self._t0 = time.monotonic()
        self._closed = threading.Event()
        self._cond = threading.Condition()
        self._waiting: deque[Flight] = deque()  # sent, not yet taken by the worker
        self._active: Flight | None = None  # the request the current worker is fetching
        self._generation = 0  # the current worker's; an abandoned worker ends when its request returns
        self._spawn()

    def _spawn(self) -> None:
        """A new worker (under ``_cond`` or before any thread runs). Started by a thread of the edit, so it lives
        in that thread's network namespace (the kernel link's)."""
        self._generation += 1
        threading.Thread(target=self._work, args=(self._generation,), name="unpaced-link", daemon=True).start()

    def _abandon(self, flight: Flight) -> None:
        """``flight`` is no longer wanted (dropped, or cut at a prefix already through): if the worker is still on
        it, later requests go on at once on a new worker (a new connection) — as a device closes a connection
        stuck in a trough rather than wait out TCP's retransmission backoff — and the old connection is closed at
        its next bytes, so its unread rest does not share the link with them (under ``_cond``)."""
        flight.stop = True
        if self._active is flight and not flight.done:
            self._active = None
            self._spawn()

    def send(self, file_id: str, ranges) -> Flight:
        flight = Flight(file_id, tuple(tuple(r) for r in ranges), time.monotonic())
        with self._cond:
            self._waiting.append(flight)
            self._cond.notify_all()
        return flight

    # -- the worker: one request at a time, in order -------------------------------------------------
    def _work(self, generation: int) -> None:
        while True:
            with self._cond:
                while not self._waiting and generation == self._generation and not self._closed.is_set():
                    self._cond.wait(POLL_S * 25)
                if generation != self._generation or self._closed.is_set():
                    return
                flight = self._waiting.popleft()
                self._active = flight
            try:
                if not flight.stop:
                    self._fetch(flight)
            except Abandoned:  # its receiver has returned; the connection is closed
                pass
            except BaseException as e:  # noqa: BLE001 - handed to the receiver
                flight.error = e
            with self._cond:
                flight.done = True
                if self._active is flight:
                    self._active = None
                self._cond.notify_all()

    def _fetch(self, flight: Flight) -> None:
        flight.t_begin = time.monotonic()

        def seen(n: int) -> None:
            if flight.stop:
                raise Abandoned(flight.file_id)
            now = time.monotonic()
            with self._cond:
                if flight.t_first is None:
                    flight.t_first = now
                    self.round_trips.append(max(0.0, now - flight.t_begin))
                flight.wire += n
                flight.marks.append((now, flight.wire))

        for group in groups(flight.ranges, self.group_bytes):
            if flight.stop or self._closed.is_set():
                return
            tr = self._fetch_group(flight, group, seen)
            if tr is None:
                return
            with self._cond:
                flight.parts.extend(tr.parts)
                flight.wire = flight.wire_done = flight.wire_done + tr.wire_bytes
                flight.t_last = time.monotonic()
                if flight.t_first is None:
                    flight.t_first = min(tr.t_first_byte, flight.t_last)
                self._cond.notify_all()

    def _fetch_group(self, flight: Flight, group: list, seen) -> Transfer | None:
        while True:
            try:
                with counting(seen):
                    tr = self.inner.fetch_timed(flight.file_id, group)
            except Exception as e:  # noqa: BLE001 - classified: only a source that did not answer is a link
                if not source_down(e):
                    raise
                with self._cond:
                    flight.wire = flight.wire_done  # a cut-off response's bytes are not parts
                if not self.outages or self.outages[-1]["back_s"] is not None:
                    self.outages.append({"down_s": round(time.monotonic() - self._t0, 4), "back_s": None,
                                         "why": " ".join(f"{type(e).__name__}: {e}".split())[:160]})
                if self._closed.wait(SOURCE_RETRY_S) or flight.stop:
                    return None
                continue
            if self.outages and self.outages[-1]["back_s"] is None:
                self.outages[-1]["back_s"] = round(time.monotonic() - self._t0, 4)
            return tr

    # -- the device's side ----------------------------------------------------------------------------
    def receive(self, flight: Flight, cut: threading.Event | None = None, prefix_ends: Sequence[int] = (),
                drop: threading.Event | None = None) -> Transfer:
        """Wait until the request's bytes are through. If ``cut`` is set first, stop at the largest usable
        prefix through by then (``prefix_ends``: how many leading parts each usable prefix needs, smallest
        first) — or at the smallest, as soon as it is; the groups after it are not asked for. If ``drop`` is
        set first, stop at once: no parts, ``nbytes`` = what had come through."""
        ends = [int(k) for k in prefix_ends]
        with self._cond:
            while True:
                if flight.error is not None:
                    raise flight.error
                if drop is not None and drop.is_set():
                    self._abandon(flight)
                    return self._transfer(flight, [], flight.wire)
                if flight.done:
                    if flight.stop and self._closed.is_set() and len(flight.parts) < len(flight.ranges):
                        raise LinkClosed("link closed")
                    keep = len(flight.parts)
                    if cut is not None and cut.is_set() and len(ends) > 1 and keep < len(flight.ranges):
                        keep = max([k for k in ends if k <= keep], default=0)
                    if keep == 0 and flight.ranges:
                        raise LinkClosed("link closed before the request's bytes came through")
                    return self._transfer(flight, flight.parts[:keep])
                if cut is not None and cut.is_set() and len(ends) > 1:
                    fitting = [k for k in ends if k <= len(flight.parts)]
                    if fitting:
                        self._abandon(flight)
                        return self._transfer(flight, flight.parts[:fitting[-1]])
                if self._closed.is_set():
                    flight.stop = True
                    raise LinkClosed("link closed")
                self._cond.wait(POLL_S * 25)

    def _transfer(self, flight: Flight, parts: list[bytes], wire: int | None = None) -> Transfer:
        nbytes = sum(len(p) for p in parts)
        now = time.monotonic()
        t_req = flight.t_begin if flight.t_begin is not None else flight.t_request
        first = flight.t_first if flight.t_first is not None else now
        last = flight.t_last if (flight.t_last is not None and parts) else now
        return Transfer(parts, nbytes if wire is None else int(wire), nbytes if wire is None else int(wire),
                        min(t_req, first), first, max(first, last))

    def progress(self, flight: Flight, need_bytes: int = 0) -> InFlight:
        """What the device sees of a request in flight: bytes through so far and over the last
        ``OBSERVE_WINDOW_S`` (a silent link reads as silent)."""
        now = time.monotonic()
        with self._cond:
            if flight.t_begin is None:
                return InFlight(need_bytes, 0.0, 0.0)
            since = max(flight.t_begin, now - OBSERVE_WINDOW_S)
            before = 0
            for t, b in reversed(flight.marks):
                if t <= since:
                    before = b
                    break
            return InFlight(need_bytes, float(flight.wire), now - flight.t_begin, float(flight.wire - before),
                            now - since)

    def fetch_timed(self, file_id: str, ranges) -> Transfer:
        return self.receive(self.send(file_id, ranges))

    def fetch(self, file_id: str, ranges) -> list[bytes]:
        return self.fetch_timed(file_id, ranges).parts

    def close(self) -> None:
        """Stop: a waiting receive gives up at once; the request on the wire is not waited for."""
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
