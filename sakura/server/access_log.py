"""The template server's access log: one JSON line per HTTP request and per websocket event.

Records are bounded: every field a client chose is clipped to :data:`MAX_FIELD` characters (HTTP
heads are at most ``ServerLimits.max_head_bytes`` anyway), and a websocket request is logged as its
id, range count, bytes and rate, never the message itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sakura.net.shaping import DeadlinePassed
from sakura.server.streaming import TRACE_HEADER

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]
LogFn = Callable[[dict[str, Any]], None]
MAX_FIELD = 8192  # characters of one logged field (a client's Range header list fits)


def clip(text: str | None, limit: int = MAX_FIELD) -> str | None:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}…(+{len(text) - limit} chars)"


class SendStalled(Exception):
    """The client read nothing for the stall timeout: the response is abandoned."""


class AccessLog:
    """ASGI middleware: one JSON line per HTTP request with exactly what the server received (fields
    clipped); also drops a response whose client has read nothing for ``send_stall_s``."""

    def __init__(self, app: ASGIApp, log: LogFn, send_stall_s: float = 30.0) -> None:
        self.app, self.log, self.send_stall_s = app, log, send_stall_s

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path = scope.get("raw_path", scope["path"].encode())
        path = path.decode("latin-1") if isinstance(path, bytes) else path
        qs = scope.get("query_string", b"").decode("latin-1")
        rec: dict[str, Any] = {"method": scope["method"], "path": clip(path + (f"?{qs}" if qs else ""))}
        rec |= {"range": clip(headers.get("range")), "trace": clip(headers.get(TRACE_HEADER)), "status": None,
                "bytes": 0}

        async def send_logged(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                rec["status"] = msg["status"]
            elif msg["type"] == "http.response.body":
                rec["bytes"] += len(msg.get("body", b""))
            try:
                await asyncio.wait_for(send(msg), self.send_stall_s)
            except TimeoutError:
                raise SendStalled() from None

        try:
            await self.app(scope, receive, send_logged)
        except Exception as e:  # noqa: BLE001 - only a stalled client or a paced body past its deadline
            if _raised(e, SendStalled):
                rec["error"] = f"client read nothing for {self.send_stall_s:g} s"
            elif _raised(e, DeadlinePassed):
                rec["error"] = "paced body ran past its deadline"
            else:
                raise
        finally:
            self.log(rec)


def _raised(e: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(e, BaseExceptionGroup):  # raised inside a task group (streaming responses)
        return e.subgroup(kind) is not None
    return isinstance(e, kind)


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
