"""The audited link the agent puts around its range client for each edit.

:class:`AuditedLink` records every request that leaves the device (file id, byte ranges, bytes) and
refuses to send once the edit is cancelled (a client that went away). What it records is returned to
the client as ``sent_to_server``: the proof that nothing else left.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from sakura.net.client import Transfer
from sakura.runtime.errors import EditCancelled


class AuditedLink:
    """Forwards ``header_bytes`` / ``fetch_timed`` to ``inner`` and records what was asked for."""

    def __init__(self, inner, log: list[dict], cancel: threading.Event | None = None) -> None:
        self.inner, self.log, self.cancel = inner, log, cancel
        self._lock = threading.Lock()

    def _record(self, file_id: str, ranges: list[list[int]], nbytes: int) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise EditCancelled("edit cancelled: the client disconnected")
        with self._lock:
            self.log.append({"file_id": file_id, "ranges": ranges, "bytes": nbytes})

    def header_bytes(self, file_id: str) -> bytes:
        self._record(file_id, [], 0)  # a header request names the file only
        data = self.inner.header_bytes(file_id)
        with self._lock:
            self.log[-1]["bytes"] = len(data)
        return data

    def fetch_timed(self, file_id: str, ranges: Sequence[Sequence[int]]) -> Transfer:
        rs = [[int(o), int(n)] for o, n in ranges]
        self._record(file_id, rs, sum(n for _, n in rs))
        return self.inner.fetch_timed(file_id, ranges)

    def fetch(self, file_id: str, ranges) -> list[bytes]:
        return self.fetch_timed(file_id, ranges).parts

    def close(self) -> None:
        self.inner.close()

    @property
    def events(self) -> list:
        """The inner link's retries and source switches (a failover source's), for the edit's timeline."""
        return getattr(self.inner, "events", [])

    def avoid(self, file_id: str, reason: str) -> None:
        """Bytes of ``file_id`` failed their check: a failover source moves to its next replica."""
        avoid = getattr(self.inner, "avoid", None)
        if avoid is not None:
            avoid(file_id, reason)
