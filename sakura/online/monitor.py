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

    def record_transfer(self, nbytes: int, active_s: float) -> None:
        if nbytes > 0:
            self.samples.append(TransferSample(nbytes, max(active_s, self.min_active_s)))

    @property
    def rate_bps(self) -> float:
        """R̂ in bits per second: harmonic mean of recent per-transfer rates (initial estimate if none)."""
        if not self.samples:
            return self.initial_bps
        return len(self.samples) / sum(s.active_s / (8 * s.nbytes) for s in self.samples)
