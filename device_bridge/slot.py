"""One edit at a time per device: a second caller waits (and hears that it is queued), then runs."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from device_bridge.links import EditCancelled
from device_bridge.protocol import EditFailed, event


class EditSlot:
    def __init__(self, busy_wait_s: float) -> None:
        self.busy_wait_s = float(busy_wait_s)
        self.waiting = 0
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Wait as long as it takes (warm-up)."""
        with self._lock:
            yield

    @contextlib.contextmanager
    def take(self, emit, cancel: threading.Event) -> Iterator[None]:
        """The slot for one edit: at once, or after a ``queued`` event and a wait of at most
        ``busy_wait_s`` (then :class:`EditFailed` ``busy``); a cancelled wait stops at once."""
        if not self._lock.acquire(blocking=False):
            self.waiting += 1
            try:
                emit(event("queued", message="another edit is running on this device; waiting", waiting=self.waiting))
                deadline = time.monotonic() + self.busy_wait_s
                while not self._lock.acquire(timeout=0.25):
                    if cancel.is_set():
                        raise EditCancelled("edit cancelled while waiting")
                    if time.monotonic() > deadline:
                        raise EditFailed(f"the device is busy with another edit (waited {self.busy_wait_s:.0f} s)",
                                         "busy")
            finally:
                self.waiting -= 1
        try:
            yield
        finally:
            self._lock.release()
