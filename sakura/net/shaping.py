"""Trace-following rate shaping for senders (token bucket over the exact trace integral).

A :class:`TraceShaper` models one link: trace time ``start`` corresponds to the wall time
the shaper was created, and trace time advances with the clock whether or not anything is
sent (the network keeps changing while the sender idles). During one ``send_chunks`` call
the cumulative bytes released never exceed ``bytes_between(anchor, now) + bucket_bytes``.
Release times come from :meth:`Trace.time_to_send` on the *cumulative* byte count, so
sleep overshoot never accumulates into drift: a late wake simply releases a larger chunk.

Idle credit is capped like a real token bucket: at the start of each burst (a
``send_chunks`` call unless ``new_burst=False``), if more than ``bucket_bytes`` of credit
built up, the bucket is re-anchored at "now, full". Within a burst we deliberately do not
cap it: Python wakes with ~0.1-1 ms jitter, which at
hundreds of Mbps exceeds a 16 KiB bucket, and a strict cap would make the emulated link
systematically slower than its trace.

``RateSpec`` is the wire form of "shape by this trace": header ``X-Sakura-Trace:
5g;start=12;scale=0.5`` or the websocket JSON ``{"trace": "5g", "start": 12, "scale": 0.5}``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from sakura.net.clock import Clock, RealClock
from sakura.net.traces import Trace, TraceError, load_trace

BUCKET_BYTES = 16 * 1024
MAX_CHUNK = 64 * 1024
# A link a client asks a server to emulate must average at least this (10 kbit/s: below GPRS). Slower
# specs (fixed:1e-300, 5g;scale=1e-300) held a connection open for ever. A trace's own 0-Mbps samples
# are bandwidth: only the average over the trace is held to the floor.
MIN_CLIENT_MBPS = 0.01
# A paced response must be done within DEADLINE_FACTOR × the time the trace needs for its bytes,
# plus DEADLINE_SLACK_S: never reached by a reader that keeps up, and finite for every accepted spec.
DEADLINE_FACTOR = 1.5
DEADLINE_SLACK_S = 10.0


class DeadlinePassed(Exception):
    """A paced transfer that ran past its deadline (the reader is too slow, or the host starved)."""


@dataclass(frozen=True)
class RateSpec:
    """Which trace shapes a transfer, from which trace offset (s), at which scale."""

    trace: str
    start: float = 0.0
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.trace or ";" in self.trace:
            raise TraceError(f"bad trace name {self.trace[:80]!r}")
        if not (math.isfinite(self.start) and self.start >= 0):
            raise TraceError(f"trace start must be a finite number >= 0, got {self.start}")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise TraceError(f"trace scale must be a finite number > 0, got {self.scale}")

    @classmethod
    def parse(cls, text: str) -> RateSpec:
        """``"5g;start=12;scale=0.5"`` (start and scale optional)."""
        name, *opts = [p.strip() for p in text.split(";")]
        kw: dict[str, float] = {}
        for opt in opts:
            key, eq, val = opt.partition("=")
            if not eq or key not in ("start", "scale"):
                raise TraceError(f"bad trace option {opt[:40]!r} in {text[:80]!r}: use start=<s> and scale=<k>")
            try:
                kw[key] = float(val)
            except ValueError:
                raise TraceError(f"bad number in trace option {opt[:40]!r}") from None
        return cls(name, **kw)

    @classmethod
    def from_json(cls, obj: object) -> RateSpec:
        if not isinstance(obj, dict) or not isinstance(obj.get("trace"), str):
            raise TraceError('rate must be an object like {"trace": "5g", "start": 0, "scale": 1}')
        extra = set(obj) - {"trace", "start", "scale"}
        if extra:
            raise TraceError(f"unknown rate fields: {str(sorted(extra))[:80]}")
        try:
            return cls(obj["trace"], float(obj.get("start", 0.0)), float(obj.get("scale", 1.0)))
        except (TypeError, ValueError):
            raise TraceError("rate start/scale must be numbers") from None

    def header(self) -> str:
        return f"{self.trace};start={self.start:g};scale={self.scale:g}"

    def to_json(self) -> dict[str, object]:
        return {"trace": self.trace, "start": self.start, "scale": self.scale}

    def shifted(self, dt: float) -> RateSpec:
        """The same link ``dt`` seconds later (stateless servers need the client to advance it)."""
        return RateSpec(self.trace, self.start + dt, self.scale)

    def load(self) -> Trace:
        return load_trace(self.trace, self.scale)


def check_client_trace(trace: Trace) -> Trace:
    """``trace`` if a client may ask for it, else TraceError (its average is below the floor)."""
    if trace.mean_mbps < MIN_CLIENT_MBPS:
        raise TraceError(f"{trace.name} averages {trace.mean_mbps:.3g} Mbps, below the floor of "
                         f"{MIN_CLIENT_MBPS:g} Mbps for a link a client asks for")
    return trace


class TraceShaper:
    """Paces one sender along ``trace`` from trace time ``start`` (see the module doc)."""

    def __init__(
        self,
        trace: Trace,
        start: float = 0.0,
        clock: Clock | None = None,
        bucket_bytes: int = BUCKET_BYTES,
        max_chunk: int = MAX_CHUNK,
    ) -> None:
        self.trace = trace
        self.clock: Clock = clock or RealClock()
        self.bucket = bucket_bytes
        self.max_chunk = max(max_chunk, bucket_bytes)
        self._start = start
        self._t0 = self.clock.now()  # wall time at which trace time == start
        self._anchor = start  # trace time at which the current bucket period began (full bucket)
        self._sent = 0  # bytes released since the anchor
        self.bytes_sent = 0  # lifetime total, for reports

    def deadline(self, nbytes: int) -> float:
        """Clock time by which ``nbytes`` released from now must be out (see DEADLINE_FACTOR)."""
        return self.clock.now() + DEADLINE_SLACK_S + DEADLINE_FACTOR * self.trace.time_to_send(nbytes,
                                                                                               self.trace_time())

    def trace_time(self, now: float | None = None) -> float:
        return self._start + ((self.clock.now() if now is None else now) - self._t0)

    def tokens(self, now: float | None = None) -> float:
        """Bytes that may be released now."""
        pos = self.trace_time(now)
        return self.trace.bytes_between(self._anchor, max(pos, self._anchor)) + self.bucket - self._sent

    def _begin(self) -> None:
        now = self.clock.now()
        if self.tokens(now) > self.bucket:  # idle: credit is capped at the bucket depth
            self._anchor, self._sent = self.trace_time(now), 0

    def _delay(self, want: int) -> float:
        """Seconds until ``want`` more bytes may be released."""
        need = self._sent + want - self.bucket
        release_pos = self._anchor + self.trace.time_to_send(need, self._anchor)
        return self._t0 + (release_pos - self._start) - self.clock.now()

    def _take(self, remaining: int) -> int:
        want = min(remaining, self.bucket)
        take = min(remaining, self.max_chunk, max(want, int(self.tokens())))
        self._sent += take
        self.bytes_sent += take
        return take

    def send_chunks(
        self, data: bytes | bytearray | memoryview, new_burst: bool = True
    ) -> Iterator[memoryview]:
        """Yield consecutive slices of ``data``, each at the moment the link allows it.

        Pass ``new_burst=False`` when ``data`` continues the previous call's transfer (e.g. a
        file streamed block by block), so a late sender may still catch up.
        """
        mv, off, n = memoryview(data), 0, len(data)
        if new_burst:
            self._begin()
        while off < n:
            self.clock.sleep(self._delay(min(n - off, self.bucket)))
            take = self._take(n - off)
            yield mv[off : off + take]
            off += take

    async def asend_chunks(
        self, data: bytes | bytearray | memoryview, new_burst: bool = True
    ) -> AsyncIterator[memoryview]:
        """Asyncio variant of :meth:`send_chunks`."""
        mv, off, n = memoryview(data), 0, len(data)
        if new_burst:
            self._begin()
        while off < n:
            delay = self._delay(min(n - off, self.bucket))
            if delay > 0:
                await self.clock.asleep(delay)
            take = self._take(n - off)
            yield mv[off : off + take]
            off += take
