"""Runtime monitor (paper §4.3.1): the effective transfer rate.

The rate is bytes over *active* receive time (the time a transfer was actually in flight), not
wall time, so idle gaps while the buffer is full do not read as a slow link. It is the harmonic
mean of the last few transfers' rates: a single fast burst cannot inflate it, while a drop shows
up at once — the safe side for deadlines.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass
class TransferSample:
    nbytes: int
    active_s: float


class RuntimeMonitor:
    def __init__(self, initial_bps: float, window: int = 4, min_active_s: float = 1e-4):
        if initial_bps <= 0:
            raise ValueError("initial rate must be positive")
        self.initial_bps = initial_bps
        self.samples: deque[TransferSample] = deque(maxlen=window)
        self.min_active_s = min_active_s
        self._link_free_at = float("-inf")  # when the previous transfer's last byte arrived

    def observe(self, nbytes: int, t_request: float, t_last_byte: float) -> float:
        """A completed transfer, by its timestamps. With several requests in flight a request waits
        for the one before it; only the time from then (or from its own request, if later) to its last
        byte is its active time, so pipelining does not read as a slow link. Both clocks call this."""
        active = t_last_byte - max(t_request, self._link_free_at)
        self.record_transfer(nbytes, active)
        self._link_free_at = max(self._link_free_at, t_last_byte)
        return max(active, self.min_active_s)

    def record_transfer(self, nbytes: int, active_s: float) -> None:
        if nbytes > 0:
            self.samples.append(TransferSample(nbytes, max(active_s, self.min_active_s)))

    @property
    def rate_bps(self) -> float:
        """R̂ in bits per second: harmonic mean of recent per-transfer rates (initial estimate if none)."""
        if not self.samples:
            return self.initial_bps
        samples = list(self.samples)  # a copy: the collector thread appends while the requester reads
        return len(samples) / sum(s.active_s / (8 * s.nbytes) for s in samples)
