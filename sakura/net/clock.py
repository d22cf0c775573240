"""Clocks: the same pacing / timing code runs on wall time or on simulated time.

``RealClock`` is ``time.monotonic`` + real sleeps. ``SimClock`` is a single simulated
timeline whose ``sleep`` advances time instantly, so a sender paced by a trace can be
replayed in microseconds. (Coordinating several simulated actors -- a discrete-event
scheduler -- is the simulator's job, not the clock's.)
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...
    async def asleep(self, seconds: float) -> None: ...


class RealClock:
    """Monotonic wall clock (seconds)."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


class SimClock:
    """Simulated time: ``sleep`` advances ``now`` instantly (thread-safe)."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._t

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            with self._lock:
                self._t += seconds

    def advance(self, seconds: float) -> None:
        self.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)  # still yield, so asyncio code keeps its interleaving
