"""Template data read straight from a local pack folder: the in-process link.

Same interface as the range clients (``header_bytes``, ``fetch_timed``), so an edit session can read a
folder on the same machine (benchmarks on the simulated clock, the quality explorer, tests) exactly
as it reads a template server. Transfers are timed but not paced; pacing is the link's business.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

from sakura.net.client import FetchError, Transfer

FILE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
MAX_HEADER_BYTES = 16 << 20


class FolderSource:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fd(self, file_id: str) -> int:
        if not FILE_ID.match(file_id) or ".." in file_id:
            raise FetchError(400, f"bad file id {file_id!r}")
        with self._lock:
            if file_id not in self._fds:
                path = self.root / f"{file_id}.pack"
                try:
                    self._fds[file_id] = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    raise FetchError(404, f"no stored file {file_id!r} in {self.root}") from None
            return self._fds[file_id]

    def _read(self, file_id: str, offset: int, length: int) -> bytes:
        data = os.pread(self._fd(file_id), length, offset)
        if len(data) != length:
            raise FetchError(416, f"{file_id}: range {offset}+{length} is outside the file")
        return data

    def _reopen_if_replaced(self, file_id: str) -> None:
        """Drop the open file if a newer one was published under its name (read the header of what is there)."""
        with self._lock:
            fd = self._fds.get(file_id)
            if fd is None:
                return
            try:
                replaced = os.stat(self.root / f"{file_id}.pack").st_ino != os.fstat(fd).st_ino
            except FileNotFoundError:
                replaced = True
            if replaced:
                os.close(self._fds.pop(file_id))

    def header_bytes(self, file_id: str) -> bytes:
        self._reopen_if_replaced(file_id)
        first8 = self._read(file_id, 0, 8)
        n = int.from_bytes(first8, "little")
        if not 0 < n <= MAX_HEADER_BYTES:
            raise FetchError(422, f"{file_id}: not a SAKURA container (header length {n})")
        return first8 + self._read(file_id, 8, n)

    def fetch_timed(self, file_id: str, ranges) -> Transfer:
        t0 = time.monotonic()
        parts = [self._read(file_id, int(o), int(n)) for o, n in ranges]
        t1 = time.monotonic()
        nbytes = sum(len(p) for p in parts)
        return Transfer(parts, nbytes, nbytes, t0, t1, t1)

    def fetch(self, file_id: str, ranges) -> list[bytes]:
        return self.fetch_timed(file_id, ranges).parts

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __enter__(self) -> "FolderSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
