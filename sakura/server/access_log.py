"""The template server's access log: one JSON line per HTTP request and per websocket event."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sakura.server.streaming import TRACE_HEADER

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]
LogFn = Callable[[dict[str, Any]], None]


class AccessLog:
    """ASGI middleware: one JSON line per HTTP request with exactly what the server received."""

    def __init__(self, app: ASGIApp, log: LogFn) -> None:
        self.app, self.log = app, log

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path = scope.get("raw_path", scope["path"].encode())
        path = path.decode("latin-1") if isinstance(path, bytes) else path
        qs = scope.get("query_string", b"").decode("latin-1")
        rec: dict[str, Any] = {"method": scope["method"], "path": path + (f"?{qs}" if qs else "")}
        rec |= {"range": headers.get("range"), "trace": headers.get(TRACE_HEADER), "status": None, "bytes": 0}

        async def send_logged(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                rec["status"] = msg["status"]
            elif msg["type"] == "http.response.body":
                rec["bytes"] += len(msg.get("body", b""))
            await send(msg)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            self.log(rec)


def make_logger(access_log: str | Path | logging.Handler | None) -> LogFn:
    """A function writing one record as a JSON line (with its time) to ``access_log`` (None = nowhere)."""
    logger = logging.getLogger(f"sakura.server.access.{secrets.token_hex(4)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    if access_log is None:
        logger.addHandler(logging.NullHandler())
    else:
        h = access_log if isinstance(access_log, logging.Handler) else logging.FileHandler(access_log)
        logger.addHandler(h)

    def log(rec: dict[str, Any]) -> None:
        logger.info(json.dumps({"t": round(time.time(), 6), **rec}, default=str))

    return log
