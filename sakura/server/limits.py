"""What an exposed server must bound, and the uvicorn settings and protocol that bound it.

uvicorn covers most of it: ``limit_concurrency`` (503 beyond that many connections and tasks),
``timeout_keep_alive`` (idle time after a response), ``h11_max_incomplete_event_size`` (request
head size), ``ws_max_size`` / ``ws_max_queue`` (websocket message size and backlog), websocket
pings. It lacks two things, added by :class:`BoundedH11Protocol`: a deadline for each request head
(a socket that connects and sends nothing, or trickles its head, is otherwise held forever and
starves every other client of descriptors), and the connection cap for websocket upgrades
(``limit_concurrency`` answers plain requests only). Per-message and per-request limits (range
counts, bytes per request, JSON depth, stalled readers, log record size) are applied where the
messages are handled (:mod:`sakura.server.ws`, :mod:`sakura.server.access_log`).
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

RESERVED_FDS = 64  # descriptors kept for pack files, logs and the listening socket


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = 1024  # open connections (HTTP and websocket); further ones get 503
    header_timeout_s: float = 10.0  # a request head must be complete this long after connect / last response
    keep_alive_s: int = 5  # idle keep-alive connection closed after this
    max_head_bytes: int = 16 * 1024  # request line + headers
    ws_max_message: int = 1 << 20  # one websocket message (a request: ids, ranges, rate)
    ws_idle_s: float = 120.0  # a websocket with no request for this long is closed
    send_stall_s: float = 30.0  # a client that reads nothing for this long is dropped
    max_ws_errors: int = 32  # bad requests on one websocket before it is closed

    def connection_cap(self) -> int:
        """``max_connections``, lowered to fit this process's open-file limit."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        room = soft - RESERVED_FDS if soft != resource.RLIM_INFINITY else self.max_connections
        return max(1, min(self.max_connections, room))


class BoundedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a request-head deadline and the cap on websocket upgrades."""

    header_timeout_s = ServerLimits.header_timeout_s

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_timer()  # the next request's head has the same deadline

    def handle_websocket_upgrade(self, event) -> None:
        self._cancel_head_timer()
        if self.limit_concurrency is not None and len(self.connections) > self.limit_concurrency:
            body = b"too many connections: try again later"
            self.transport.write(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nconnection: close\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            self.transport.close()
            return
        super().handle_websocket_upgrade(event)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        if not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _cancel_head_timer(self) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        # Re-armed whenever a response completes: if none is being served now, no request head came in time.
        if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()


def uvicorn_config(app: object, log_level: str, limits: ServerLimits, *, ws_max_size: int | None = None,
                   **kw) -> uvicorn.Config:
    """A uvicorn config with every limit of ``limits`` applied (``ws_max_size`` overrides the message cap)."""
    protocol = type("BoundedH11", (BoundedH11Protocol,), {"header_timeout_s": limits.header_timeout_s})
    return uvicorn.Config(
        app, log_level=log_level, access_log=False, lifespan="off", http=protocol,
        limit_concurrency=limits.connection_cap(), timeout_keep_alive=limits.keep_alive_s,
        h11_max_incomplete_event_size=limits.max_head_bytes, ws_max_size=ws_max_size or limits.ws_max_message,
        ws_max_queue=4, **kw)
