"""Pack bytes from an ordered list of sources (template server replicas, an object store, a folder): a request
whose source dies is sent again — to the same source once, then to the next ones (issue #30 D5).

A source is anything with the device's link interface (``header_bytes(file_id)``, ``fetch_timed(file_id,
ranges)``). Bytes are only ever combined from sources that serve the same immutable file: a file's header
(its chunk index with every chunk's length and CRC) is read from the first source that answers, and a
source is used for that file only once its header is byte-identical. The sources come from the operator
(``--server URL,URL``) or the catalog, never from a job. What happened — each retry and each switch — is
kept in :attr:`FailoverSource.events` for the edit's timeline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from websockets.exceptions import ConnectionClosed

from sakura.net.byteranges import FetchError, Transfer
from sakura.net.store_reader import link_for_server

# What a dying or restarting source looks like to a client: refused or reset connections, a websocket closed
# under it, a response cut short, a timeout, a 5xx from a proxy in front of it. A 4xx is an answer (the file or
# range is wrong), and so is a missing file in a folder: no retry.
SOURCE_DOWN = (httpx.TransportError, ConnectionError, TimeoutError, ConnectionClosed)
RETRY_PAUSE_S = 0.05  # before sending a request again to the source that just failed (a restart's accept backlog)


class SourcesUnavailable(FetchError):
    """No source answered a request (each was tried); the message lists why, in one line."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message)


@dataclass(frozen=True)
class SourceEvent:
    """A retry on the same source or a switch to another, ``t`` = time.monotonic()."""

    kind: str  # "retry" | "switch" | "mismatch" (a source serving another version of the file: skipped)
    file_id: str
    source: int  # index of the source the request goes to next (or, for mismatch, the one skipped)
    reason: str
    t: float


def source_down(e: BaseException) -> bool:
    """``e`` says the source did not answer (dead, restarting, unreachable), as opposed to an answer."""
    if isinstance(e, FetchError):
        return e.status >= 500
    return isinstance(e, SOURCE_DOWN)


def _why(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:160]


class FailoverSource:
    """``sources`` in order of preference; requests go to the current one, and on a failure to it once more,
    then to the next. ``names`` label the sources in events and errors (default: their position)."""

    def __init__(self, sources: Sequence, names: Sequence[str] | None = None) -> None:
        if not sources:
            raise ValueError("a failover source needs at least one source")
        self.sources, self.names = list(sources), list(names or [f"source {i}" for i in range(len(sources))])
        self.current = 0
        self.events: list[SourceEvent] = []
        self._headers: dict[str, bytes] = {}  # file id -> its header as first read (what every source must match)
        self._checked: set[tuple[str, int]] = set()  # (file id, source) whose header matched
        self._lock = threading.Lock()

    # -- the link interface -----------------------------------------------------------------------
    def header_bytes(self, file_id: str) -> bytes:
        return self._call(file_id, lambda src: self._header_of(src, file_id), header=True)

    def fetch_timed(self, file_id: str, ranges) -> Transfer:
        return self._call(file_id, lambda src: self.sources[src].fetch_timed(file_id, ranges))

    def fetch(self, file_id: str, ranges) -> list[bytes]:
        return self.fetch_timed(file_id, ranges).parts

    def templates(self) -> list[dict]:
        return self._call("", lambda src: self.sources[src].templates(), header=True)

    def close(self) -> None:
        for s in self.sources:
            getattr(s, "close", lambda: None)()

    def __enter__(self) -> FailoverSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def avoid(self, file_id: str, reason: str) -> None:
        """The current source's bytes of ``file_id`` failed their check: the next request goes to the next
        source (with one source, to the same one again)."""
        if len(self.sources) > 1:
            self.current = (self.current + 1) % len(self.sources)
            self._event("switch", file_id, self.current, reason)
        else:
            self._event("retry", file_id, self.current, reason)

    # -- the rule -------------------------------------------------------------------------------------
    def _call(self, file_id: str, call, header: bool = False):
        """``call(source index)`` on the current source, once more on it, then on each next one in turn."""
        failed: list[tuple[int, str]] = []  # (source, why) per failed attempt
        start = self.current
        order = [start, start] + [(start + k) % len(self.sources) for k in range(1, len(self.sources))]
        for attempt, src in enumerate(order):
            if attempt == 1:
                self._event("retry", file_id, src, failed[-1][1])
                time.sleep(RETRY_PAUSE_S)
            elif attempt > 1:
                self._event("switch", file_id, src, failed[-1][1])
            try:
                if not header:
                    self._verify(file_id, src)
                out = call(src)
            except _Mismatch as e:
                failed.append((src, str(e)))
                self._event("mismatch", file_id, src, str(e))
                continue
            except Exception as e:  # noqa: BLE001 - classified: an answer is raised, a dead source is skipped
                if not source_down(e):
                    raise
                failed.append((src, _why(e)))
                continue
            self.current = src
            return out
        last = {src: why for src, why in failed}  # each source's last failure
        tried = "; ".join(f"{self.names[src]}: {why}" for src, why in last.items())
        raise SourcesUnavailable(f"no source answered for {file_id or 'the catalog'!r} ({tried})")

    def _header_of(self, src: int, file_id: str) -> bytes:
        head = self.sources[src].header_bytes(file_id)
        with self._lock:
            first = self._headers.setdefault(file_id, head)
        if head != first:
            raise _Mismatch(f"{self.names[src]} serves another version of {file_id!r}")
        self._checked.add((file_id, src))
        return head

    def _verify(self, file_id: str, src: int) -> None:
        """Before ``src`` serves bytes of ``file_id``: its header is the one already read (when one was)."""
        if file_id in self._headers and (file_id, src) not in self._checked:
            self._header_of(src, file_id)

    def _event(self, kind: str, file_id: str, src: int, reason: str) -> None:
        with self._lock:
            self.events.append(SourceEvent(kind, file_id, src, reason, time.monotonic()))


class _Mismatch(Exception):
    pass


def failover_for_servers(urls: Sequence[str]):
    """The device's link to one or more template server replicas (``link_for_server`` for each, in order);
    one URL gives that server's link itself."""
    urls = [u.strip() for u in urls if u.strip()]
    if len(urls) == 1:
        return link_for_server(urls[0])
    return FailoverSource([link_for_server(u) for u in urls], names=urls)
