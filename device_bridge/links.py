"""Link wrappers the agent puts around a range client.

* :class:`AuditedLink` records every request that leaves the device (file id, byte ranges, bytes)
  and refuses to send once the edit is cancelled (a client that went away).
* :class:`DeviceShapedLink` paces *received* bytes along a trace on the device side. The template
  server shapes named traces (``5g``, ``fixed:100``, …) itself; a trace file the server does not
  know (a user-uploaded trace) is emulated here instead, so no trace data has to reach the server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from sakura.net.client import Transfer
from sakura.net.traces import Trace


class EditCancelled(RuntimeError):
    """The client went away; the edit stops at its next request."""


class AuditedLink:
    """Forwards ``fetch_timed`` to ``inner`` and records what was asked for."""

    def __init__(self, inner, log: list[dict], cancel: threading.Event | None = None) -> None:
        self.inner, self.log, self.cancel = inner, log, cancel
        self._lock = threading.Lock()

    def fetch_timed(self, file_id: str, ranges: Sequence[Sequence[int]]) -> Transfer:
        if self.cancel is not None and self.cancel.is_set():
            raise EditCancelled("edit cancelled: the client disconnected")
        rs = [[int(o), int(n)] for o, n in ranges]
        with self._lock:
            self.log.append({"file_id": file_id, "ranges": rs, "bytes": sum(n for _, n in rs)})
        return self.inner.fetch_timed(file_id, ranges)

    def fetch(self, file_id: str, ranges) -> list[bytes]:
        return self.fetch_timed(file_id, ranges).parts

    def reset_link(self) -> None:
        if hasattr(self.inner, "reset_link"):
            self.inner.reset_link()

    def close(self) -> None:
        if hasattr(self.inner, "close"):
            self.inner.close()


class DeviceShapedLink:
    """Receive-side emulation of a link following ``trace`` (already scaled) from ``start``.

    Requests are sequential (one receiver thread): request ``i`` may only use the link after
    request ``i-1`` finished, and it completes when the trace has delivered its wire bytes.
    The transfer's timing is reported as the emulated one, so the runtime monitor sees the
    emulated rate.
    """

    def __init__(self, inner, trace: Trace, start: float = 0.0) -> None:
        self.inner, self.trace, self.start = inner, trace, start
        self._closed = threading.Event()
        self.reset_link()

    def reset_link(self) -> None:
        self._t0 = time.monotonic()
        self._free_at = self._t0
        if hasattr(self.inner, "reset_link"):
            self.inner.reset_link()

    def fetch_timed(self, file_id: str, ranges) -> Transfer:
        t_req = time.monotonic()
        tr = self.inner.fetch_timed(file_id, ranges)
        begin = max(t_req, self._free_at)
        done = begin + self.trace.time_to_send(tr.wire_bytes, self.start + (begin - self._t0))
        wait = done - time.monotonic()
        if wait > 0 and self._closed.wait(wait):  # closed while waiting (edit over): give up now
            raise EditCancelled("link closed")
        self._free_at = max(done, time.monotonic())
        first = begin + min(done - begin, 1e-4)
        return Transfer(tr.parts, tr.nbytes, tr.wire_bytes, t_req, max(tr.t_first_byte, first),
                        max(tr.t_last_byte, done))

    def fetch(self, file_id: str, ranges) -> list[bytes]:
        return self.fetch_timed(file_id, ranges).parts

    def close(self) -> None:
        self._closed.set()
        if hasattr(self.inner, "close"):
            self.inner.close()
